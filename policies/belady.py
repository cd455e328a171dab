"""``belady``: the optimal demand cache (an oracle bound, not a real policy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from moesim.policies.base import Policy, UnitKey
from moesim.policies.registry import register

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine import EngineView, SimContext
    from moesim.sim.workload import Future


@register
class Belady(Policy):
    """Evict the unit whose next use lies farthest in the future (Belady's MIN). Reads the
    recorded routing of later iterations through ``ctx.future``: a bound for demand caching."""

    name = "belady"
    oracle = True
    summary = "oracle: evict the expert used farthest in the future (bound)"

    def __init__(self) -> None:
        self._future: Future | None = None

    def setup(self, ctx: SimContext) -> None:
        if ctx.future is None:
            raise RuntimeError("belady needs the oracle annotation")
        self._future = ctx.future

    def choose_victim(self, view: EngineView, pool: int, candidates: list[UnitKey],
                      need_bytes: int) -> UnitKey | None:
        if not candidates:
            return None
        fut = self._future
        assert fut is not None
        now = fut.step_key(view.iteration_index, max(view.layer, 0))
        # farthest next use first; among never-used-again units, the lowest key (deterministic)
        return max(candidates, key=lambda k: (fut.next_use(k[0], k[1], now), -k[0], -k[1], -k[2]))
