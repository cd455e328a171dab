"""BuddyMoE's substitution planner (Wang et al., PPoPP 2026, Algorithm 1 with the gates of
section 3.1 and the replacement budget of section 5.1), usable on top of any cache.

Once a layer is routed, each routed expert that would be a demand load (``ABSENT``; also
in-flight ones with ``substitute_late``) is replaced by the first of its buddies (the
co-activation lists of :mod:`moesim.policies.buddymoe.coactivation`, searched to depth ``H``) that
is ``RESIDENT`` and not already used by the token (Algorithm 1's hard uniqueness rule: ``U_t``
starts with the token's own routed experts, missing ones included). Gates, in the paper's order:

* TAE (Eq. 1): a token with ``TAE <= tau`` (per layer; or calibrated as a percentile of the
  profile) keeps its routing; optional margin rule: ``p~_1 - p~_2 >= gamma`` keeps it too;
* beta (Eq. 2): when the share ``delta`` of the iteration's unique requested experts that are
  not resident is ``>= beta``, the layer is bypassed (every miss loads);
* rho (section 5.1): at most ``rho`` successful swaps per token and layer, in rank order; the
  misses past the budget load on demand.

A miss with no qualifying buddy loads on demand (``fallback="load"``), is dropped
(``fallback="drop"``, the baseline MoE drop policy of section 3.1), or, with ``fallback="cpu"``,
runs on the host CPU, as do the misses past ``rho`` or behind a gate (llama.cpp's native
offloading computes host-resident experts on the CPU: spec sheet A4's other reading). With ``eta > 0`` the buddies
are re-ranked by Eq. (3)'s ``Psi = q[j|i] (1 + eta z^_j)``, ``z^`` the token's router logits
min-max normalised to [0, 1] (our reading of "normalised"; needs the trace's ``logits``). Eq.
(3)'s topology term ``kappa * hop(j)`` is always 0 on moesim's single GPU and is left out.

The profile comes from the scenario's ``profile:`` split (read in ``setup``). Without one the
counts grow online from the routing already replayed (causal, rebuilt at each iteration end),
and the run says so in its warnings: the paper profiles offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from moesim.policies.buddymoe.coactivation import (
    COACTIVATION_MODES,
    BuddyLists,
    CoactivationProfile,
    buddy_row,
    renormalised,
)
from moesim.policies.buddymoe.tae import calibrate_tau, surely_positive, tae
from moesim.policies.contract.base import (
    ABSENT,
    RESIDENT,
    Context,
    Outcome,
    Plan,
    PolicySetupError,
    Routing,
    View,
)
from moesim.policies.parts.planners import Planner

FALLBACKS = ("load", "drop", "cpu")


@dataclass
class BuddyCounts:
    """What the planner did, summed over the run (token-layers unless said otherwise)."""

    considered: int = 0        # token-layers of layers with a miss that the planner looked at
    with_miss: int = 0         # ... of which had at least one missing routed expert
    tae_blocked: int = 0       # ... kept their routing by the TAE (or margin) gate
    beta_bypassed: int = 0     # layers (iterations x layers) bypassed by the beta gate
    swaps: int = 0             # misses replaced by a buddy
    no_buddy: int = 0          # misses with no qualifying buddy (loaded, or dropped)
    rho_cut: int = 0           # misses past the rho budget (loaded on demand)


class BuddySubstitutePlanner(Planner):
    """Algorithm 1 of BuddyMoE with its gates. Parameters (the paper's symbols):

    * ``alpha``: cumulative frequency threshold (CFT) of Eq. (5), float or one per layer;
    * ``k_max``: cap on a buddy list (Eq. 6 and section 3.3); ``search_depth``: Algorithm 1's
      search rank ``H`` (None: ``k_max``);
    * ``rho``: successful swaps per token and layer (None: unlimited);
    * ``tau``: TAE threshold (float or one per layer; 0 forbids only fully peaky tokens);
      ``tau_percentile``: calibrate ``tau_l`` as this percentile of the profile's TAE instead;
      ``temperature``: ``T`` of the TAE; ``gamma``: optional margin gate (None: off);
    * ``beta``: batch gate of Eq. (2) (None: off);
    * ``eta``: weight of the router logit in Eq. (3) (0: the list order, exactly Algorithm 1);
    * ``coactivation``: ``binary`` counts or ``weighted`` (section 3.3 (i)); ``epsilon``:
      Laplace smoothing of ``M``;
    * ``substitute_late``: also replace experts whose prefetch is in flight (default: wait);
    * ``fallback``: ``load`` or ``drop`` a miss with no buddy, or run every miss left on the
      ``cpu`` (then also those past ``rho`` or behind a gate);
    * ``apply_to_prefill``: also substitute in prefill iterations (default: decode only);
    * ``lists``: fixed buddy lists ``[layer][expert] -> [buddies]`` instead of a profile.
    """

    def __init__(self, *, alpha: float | Sequence[float] = 0.95, k_max: int = 16,
                 search_depth: int | None = None, rho: int | None = None,
                 tau: float | Sequence[float] = 0.0, tau_percentile: float | None = None,
                 temperature: float = 1.0, gamma: float | None = None, beta: float | None = None,
                 eta: float = 0.0, coactivation: str = "binary", epsilon: float = 0.0,
                 substitute_late: bool = False, fallback: str = "load", apply_to_prefill: bool = False,
                 lists: BuddyLists | None = None) -> None:
        if coactivation not in COACTIVATION_MODES:
            raise ValueError(f"coactivation must be one of {', '.join(COACTIVATION_MODES)}, got {coactivation!r}")
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if search_depth is not None and search_depth < 1:
            raise ValueError(f"search_depth must be >= 1, got {search_depth}")
        if rho is not None and rho < 0:
            raise ValueError(f"rho must be >= 0, got {rho}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if beta is not None and not 0 <= beta <= 1:
            raise ValueError(f"beta must lie in [0, 1], got {beta}")
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        if tau_percentile is not None and not 0 <= tau_percentile <= 100:
            raise ValueError(f"tau_percentile must lie in [0, 100], got {tau_percentile}")
        self.alpha = alpha
        self.k_max = k_max
        self.search_depth = search_depth
        self.rho = rho
        self.tau = tau
        self.tau_percentile = tau_percentile
        self.temperature = temperature
        self.gamma = gamma
        self.beta = beta
        self.eta = eta
        self.coactivation = coactivation
        self.epsilon = epsilon
        self.substitute_late = substitute_late
        self.fallback = fallback
        self.apply_to_prefill = apply_to_prefill
        self.lists = lists
        self._lists: BuddyLists = []
        self._alphas: list[float] = []
        self._lazy = False     # online binary profile: rows built when asked (buddy_row)
        self._stale = False    # ... and the lists in force are the counts', not _lists
        self._rows: dict[tuple[int, int], list[int]] = {}
        self.q: np.ndarray | None = None
        self.tau_l: np.ndarray = np.zeros(0)
        self.profile: CoactivationProfile | None = None
        self.online = False
        self.counts = BuddyCounts()

    # -- needs ----------------------------------------------------------------------------------
    def _gates_need_weights(self) -> bool:
        taus = [self.tau] if isinstance(self.tau, (int, float)) else list(self.tau)
        return any(t > 0 for t in taus) or self.tau_percentile is not None or self.gamma is not None

    def required_columns(self) -> frozenset[str]:
        """``weights`` when a probability gate is on (TAE ``tau > 0``, ``tau_percentile``,
        ``gamma``) or the profile is weighted; ``logits`` when ``eta > 0``."""
        need = set()
        if self._gates_need_weights() or self.coactivation == "weighted":
            need.add("weights")
        if self.eta > 0:
            need.add("logits")
        return frozenset(need)

    def read_columns(self) -> frozenset[str]:
        """The router weights (TAE, weighted profile) and, with ``eta > 0``, the logits."""
        return self.required_columns() | {"weights"}

    # -- the lists in force -----------------------------------------------------------------------
    @property
    def buddies(self) -> BuddyLists:
        """The buddy lists ``[layer][expert]`` in force. The online binary profile builds only
        the rows the planner asks for (:func:`buddy_row`), at each layer's routing, before the
        layer's own counts grow; read in full, they are built from the counts now (at an
        iteration's end, the lists of the next iteration)."""
        if self._stale and self.profile is not None:
            self._lists = self.profile.buddies(self.alpha, self.k_max, self.epsilon)[0]
            self._stale = False
            self._rows = {}
        return self._lists

    @buddies.setter
    def buddies(self, lists: BuddyLists) -> None:
        self._lists = lists
        self._stale = False
        self._rows = {}

    def _buddy_row(self, layer: int, expert: int) -> list[int]:
        """``buddies[layer][expert]``, built alone when the online lists are stale."""
        if not self._stale:
            return self._lists[layer][expert]
        key = (layer, expert)
        got = self._rows.get(key)
        if got is None:
            prof = self.profile
            assert prof is not None
            got = self._rows[key] = buddy_row(prof.coactivations[layer, expert].tolist(),
                                              prof.activations[layer].tolist(), expert,
                                              self._alphas[layer], self.k_max)
        return got

    # -- set-up ---------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """What the planner did over the run (:class:`BuddyCounts`), for ``policy_report``."""
        return {"buddy": asdict(self.counts)}

    def setup(self, ctx: Context) -> None:
        """Build the buddy lists from the profiling split (or fixed ``lists``) and the TAE
        thresholds; without a profile, start an online profile and say so."""
        L, E = ctx.num_layers, ctx.num_experts
        self.counts = BuddyCounts()
        self.online = False
        self._lazy = self._stale = False
        self._rows = {}
        taus = [float(self.tau)] * L if isinstance(self.tau, (int, float)) else [float(t) for t in self.tau]
        if len(taus) != L:
            raise PolicySetupError(f"tau has {len(taus)} values for {L} layers")
        self.tau_l = np.asarray(taus)
        prof = ctx.profile
        if self.tau_percentile is not None:
            if prof is None or prof.weights is None:
                raise PolicySetupError("tau_percentile calibrates the TAE gate on the profile: give a "
                                       "profile: split whose trace has router weights")
            self.tau_l = calibrate_tau(prof.weights, self.tau_percentile, self.temperature)
        if self.lists is not None:
            if len(self.lists) != L or any(len(row) != E for row in self.lists):
                raise PolicySetupError(f"lists must be [{L} layers][{E} experts]")
            self.buddies = [[list(b) for b in row] for row in self.lists]
            self.q = None
            if self.eta > 0:
                raise PolicySetupError("eta > 0 re-ranks buddies by q, which fixed lists do not have")
            return
        try:
            if prof is not None:
                if self.coactivation == "weighted" and prof.weights is None:
                    raise PolicySetupError("coactivation 'weighted' needs router weights in the profile split")
                self.profile = CoactivationProfile.from_routing(prof.experts, E, prof.weights, self.coactivation)
            else:
                self.profile = CoactivationProfile.empty(L, E, self.coactivation)
                self.online = True
                ctx.warn("buddymoe: no profile: split, so the co-activation profile grows online from the "
                         "routing replayed so far (the paper profiles offline); give a profile: split")
            self.buddies, q = self.profile.buddies(self.alpha, self.k_max, self.epsilon)
        except ValueError as exc:
            raise PolicySetupError(str(exc)) from None
        self.q = q if self.eta > 0 else None
        # integer counts (binary, no smoothing) and no q to re-rank by: the rows one at a time
        self._lazy = self.online and self.coactivation == "binary" and self.epsilon == 0 and self.eta == 0
        self._alphas = ([float(self.alpha)] * L if isinstance(self.alpha, (int, float))
                        else [float(a) for a in self.alpha])

    # -- online profile -------------------------------------------------------------------------
    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Without a profile split, count what the router chose at this layer."""
        if self.online and self.profile is not None:
            r = outcome.routing
            self.profile.add(layer, r.experts, r.weights)

    def on_iteration_end(self, view: View) -> None:
        """Without a profile split, rebuild the buddy lists from the counts so far."""
        if self.online and self.profile is not None:
            if self._lazy:   # the next layers' routings ask for the rows they need
                self._stale = True
                self._rows = {}
                return
            self.buddies, q = self.profile.buddies(self.alpha, self.k_max, self.epsilon)
            self.q = q if self.eta > 0 else None

    # -- Algorithm 1 ----------------------------------------------------------------------------
    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """Replace the layer's misses by resident buddies, subject to the gates; with
        ``fallback="cpu"`` the misses left run on the host CPU."""
        S = routing.experts
        state = {}   # the routed experts in id order (np.unique's), without a numpy call per layer
        missing = set()
        view_state, late = view.state, self.substitute_late
        for e in sorted(set(S.ravel().tolist())):
            if e >= 0:
                s = state[e] = view_state(layer, e)
                if s == ABSENT or (late and s != RESIDENT):   # absent, or in flight with substitute_late
                    missing.add(e)
        if not missing:
            return None
        plan = None
        if self.apply_to_prefill or view.iteration.phase_name == "decode":
            plan = self._swap(view, layer, routing, state, missing)
        if self.fallback == "cpu":
            ran = S if plan is None else plan
            on_cpu = np.isin(ran, np.fromiter(missing, dtype=np.int64))
            if on_cpu.any():
                return Plan(ran.copy(), on_cpu=on_cpu)
        return None if plan is None else Plan(plan)

    def _swap(self, view: View, layer: int, routing: Routing, state: dict[int, int],
              missing: set[int]) -> np.ndarray | None:
        """Algorithm 1 with the gates: the new ``[n, k]`` plan, or None when nothing changed."""
        S = routing.experts
        n, k = S.shape
        rows = S.tolist()
        counts = self.counts
        counts.considered += n
        row_missing_all = [[r for r, e in enumerate(row) if e in missing] for row in rows]
        counts.with_miss += sum(1 for rm in row_missing_all if rm)
        if self.beta is not None:
            delta = sum(1 for s in state.values() if s != RESIDENT) / len(state)
            if delta >= self.beta:
                counts.beta_bypassed += 1
                return None
        w = routing.weights
        score = None   # the TAE of every token, computed when a token's gate needs it
        # tau = 0 at temperature 1 blocks only TAE = 0, which surely_positive rules out cheaply
        quick = w is not None and self.temperature == 1.0 and self.tau_l[layer] == 0.0
        w_rows = w.tolist() if quick and w is not None else None
        p = renormalised(w, self.temperature) if (w is not None and self.gamma is not None) else None
        z = self._normalised_logits(view, layer) if self.eta > 0 else None
        depth = self.k_max if self.search_depth is None else self.search_depth
        cap = k if self.rho is None else self.rho
        is_resident = view.is_resident
        plan = None
        for t, row_missing in enumerate(row_missing_all):
            if not row_missing:
                continue
            if w is not None and not (w_rows is not None and surely_positive(w_rows[t])):
                if score is None:
                    score = tae(w, self.temperature)
                if score[t] <= self.tau_l[layer]:
                    counts.tae_blocked += 1
                    continue
            if p is not None and self.gamma is not None and k >= 2:
                top = np.sort(p[t])[::-1]
                if top[0] - top[1] >= self.gamma:
                    counts.tae_blocked += 1
                    continue
            row = rows[t]
            used = set(row)
            n_sub = 0
            for pos, r in enumerate(row_missing):
                if n_sub >= cap:
                    counts.rho_cut += len(row_missing) - pos
                    break
                e = row[r]
                cands = self._buddy_row(layer, e)[:depth]
                if z is not None and self.q is not None and cands:
                    q = self.q[layer, e]
                    cands = sorted(cands, key=lambda b: -q[b] * (1.0 + self.eta * z[t, b]))
                found = None
                for b in cands:
                    if b not in used and is_resident(layer, b):
                        found = b
                        break
                if found is None:
                    counts.no_buddy += 1
                    if self.fallback == "drop":
                        if plan is None:
                            plan = S.copy()
                        plan[t, r] = -1
                    continue
                if plan is None:
                    plan = S.copy()
                plan[t, r] = found
                used.add(found)
                n_sub += 1
                counts.swaps += 1
        return plan

    def _normalised_logits(self, view: View, layer: int) -> np.ndarray | None:
        lg = view.logits(layer)
        if lg is None:
            return None
        lg = np.asarray(lg, dtype=np.float64)
        lo, hi = lg.min(axis=1, keepdims=True), lg.max(axis=1, keepdims=True)
        span = np.where(hi > lo, hi - lo, 1.0)
        return (lg - lo) / span
