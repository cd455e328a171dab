"""What a policy needs from its scenario and trace to run as its paper meant it, declared as
data on the policy class (:attr:`Policy.setup_needs <moesim.policies.contract.base.Policy.setup_needs>`).

A policy without what its mechanism reads does not fail: it falls back (a prefetcher without
the router lookahead guesses from the previous token, MoEpic without a transfer buffer never
prefetches) and its run warns. One run may do that; a comparison must not rank such a run as
the paper's method. The studies (``simctl compare``, sweeps, the notebooks) read these needs
before anything runs: a setting the scenario leaves unset gets the paper's default (and the
outputs say so); a need the trace or scenario cannot meet makes the point ``n/a`` with the
reason (:mod:`moesim.sim.study.needs`).

Needs are per policy class, for its default parameters; a policy whose needs depend on its
parameters (``predictor="previous-token"`` reads no lookahead) refines them in
:meth:`Policy.needs <moesim.policies.contract.base.Policy.needs>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

TOP_K: Literal["top_k"] = "top_k"
"""A size in experts equal to the model's top-k (MoEpic's transfer buffer, ``U_b = K``)."""

DEFAULT_PROFILE_SHARE = 0.5
"""The share of a trace's requests set aside as the profile split for a policy whose paper
studies offline data but names no split (moesim's choice, said as such in the outputs)."""


@dataclass(frozen=True)
class SetupNeeds:
    """A policy's setup needs and its paper's defaults for them.

    * ``columns``: optional trace columns (``lookahead_logits``, ``logits``, ``embedding``,
      ``weights``, ``token_id``) the mechanism reads; a trace without one makes the point
      ``n/a`` (the fallback the policy would take is not the paper's method);
    * ``profile_share``: the mechanism studies offline routing (the scenario's ``profile:``
      split); the share of the trace's requests the paper profiles on (fMoE's 7:3 history is
      0.7), or :data:`DEFAULT_PROFILE_SHARE` where the paper names none;
    * ``buffer_experts``: the transfer buffer (``cache.buffer_experts``) the mechanism stages
      through, in experts or :data:`TOP_K`;
    * ``swap_out``: the mechanism exists for systems whose evictions copy the expert back to
      the host (``cache.swap_out: true``): a scenario whose evictions are free leaves it
      nothing to do;
    * ``min_tokens_param``: the name of a parameter holding a period in routed tokens (MoEpic's
      configurator window ``tau``): a run routing fewer tokens never runs that step;
      :meth:`Policy.needs <moesim.policies.contract.base.Policy.needs>` fills ``min_tokens``
      with that parameter's value;
    * ``source``: where the defaults come from (paper and section), shown beside them.
    """

    columns: frozenset[str] = field(default_factory=frozenset)
    profile_share: float | None = None
    buffer_experts: float | Literal["top_k"] | None = None
    swap_out: bool = False
    min_tokens_param: str | None = None
    min_tokens: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.profile_share is not None and not 0.0 < self.profile_share < 1.0:
            raise ValueError(f"profile_share must be in (0, 1), got {self.profile_share}")
        if isinstance(self.buffer_experts, str) and self.buffer_experts != TOP_K:
            raise ValueError(f"buffer_experts must be a number or {TOP_K!r}, got {self.buffer_experts!r}")
        object.__setattr__(self, "columns", frozenset(self.columns))

    @property
    def empty(self) -> bool:
        """Nothing beyond the routing is needed."""
        return not (self.columns or self.profile_share or self.buffer_experts or self.swap_out
                    or self.min_tokens_param or self.min_tokens)

    def buffer_size(self, top_k: int) -> float:
        """The declared transfer buffer in experts for a model routing ``top_k`` experts a token
        (:data:`TOP_K` is that many), 0 when none is declared."""
        if self.buffer_experts is None:
            return 0.0
        return float(top_k) if self.buffer_experts == TOP_K else float(self.buffer_experts)

    def without(self, *, columns: frozenset[str] | set[str] = frozenset(), profile: bool = False,
                buffer: bool = False, min_tokens: bool = False) -> SetupNeeds:
        """These needs less what a policy's parameters turn off."""
        return replace(self, columns=self.columns - set(columns),
                       profile_share=None if profile else self.profile_share,
                       buffer_experts=None if buffer else self.buffer_experts,
                       min_tokens_param=None if min_tokens else self.min_tokens_param,
                       min_tokens=None if min_tokens else self.min_tokens)

    def merged(self, other: SetupNeeds) -> SetupNeeds:
        """Both policies' needs (a policy built on another, as BuddyMoE on its base cache): the
        union of columns, the larger profile share, buffer and run length, swap-out if either
        needs it. A buffer of :data:`TOP_K` wins over a number (it is at least one expert)."""
        shares = [s for s in (self.profile_share, other.profile_share) if s is not None]
        buffers = [b for b in (self.buffer_experts, other.buffer_experts) if b is not None]
        buffer: float | Literal["top_k"] | None = None
        if buffers:
            buffer = TOP_K if TOP_K in buffers else max(float(b) for b in buffers)
        runs = [t for t in (self.min_tokens, other.min_tokens) if t is not None]
        sources = [s for s in (self.source, other.source) if s]
        return SetupNeeds(columns=self.columns | other.columns, profile_share=max(shares) if shares else None,
                          buffer_experts=buffer, swap_out=self.swap_out or other.swap_out,
                          min_tokens_param=self.min_tokens_param or other.min_tokens_param,
                          min_tokens=max(runs) if runs else None,
                          source="; ".join(dict.fromkeys(sources)))

    def describe(self) -> list[str]:
        """One short phrase per need (for ``simctl policies NAME`` and the docs)."""
        out = [f"trace column {c}" for c in sorted(self.columns)]
        if self.profile_share is not None:
            out.append(f"a profile: split ({self.profile_share:.0%} of the requests)")
        if self.buffer_experts is not None:
            size = "top_k" if self.buffer_experts == TOP_K else f"{float(self.buffer_experts):g}"
            out.append(f"cache.buffer_experts: {size}")
        if self.swap_out:
            out.append("cache.swap_out: true")
        if self.min_tokens is not None:
            what = f" ({self.min_tokens_param})" if self.min_tokens_param else ""
            out.append(f"a run of at least {self.min_tokens} routed tokens{what}")
        elif self.min_tokens_param:
            out.append(f"a run of at least {self.min_tokens_param} routed tokens")
        return out
