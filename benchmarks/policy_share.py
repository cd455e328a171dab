"""Policy share: how much of a run's CPU time is the policy's own code and how much the engine's.

The same run as ``bench_engine.py`` (its ``build_run``: Mixtral-8x7B preset, 4 requests,
batch 1, decode only, 2 experts per layer, rtx-4090, the policy's declared transfer buffer,
fast path). Every millisecond of CPU time (``SIGPROF``) the innermost frame of ``moesim/policies/`` or ``moesim/sim/`` on the stack takes the sample: a
call into C (numpy, ``max``, a dict method) counts for the Python function that made it, and
the engine's work inside a policy's ``view.prefetch`` counts for the engine. Prints the shares
and the functions that took the most samples; asserts nothing.

    python benchmarks/policy_share.py [--policy fmoe] [--tokens 2000] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import signal
from types import FrameType

from bench_engine import build_run

SIDES = (("/moesim/policies/", "policy"), ("/moesim/sim/", "engine"))
"""Where a frame's file lies, and the side its samples count for."""


def side_of(frame: FrameType | None) -> tuple[str, str]:
    """The side (policy, engine or other) and ``file:function`` of the innermost frame of either."""
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        for part, side in SIDES:
            if part in path:
                return side, f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "other", "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="fmoe")
    ap.add_argument("--tokens", type=int, default=2000, help="decode tokens (4 requests)")
    ap.add_argument("--top", type=int, default=12, help="functions listed")
    args = ap.parse_args()
    engine = build_run(args.policy, args.tokens).engine
    sides: collections.Counter[str] = collections.Counter()
    funcs: collections.Counter[str] = collections.Counter()

    def sample(signum: int, frame: FrameType | None) -> None:
        side, func = side_of(frame)
        sides[side] += 1
        funcs[func] += 1

    old = signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
    try:
        engine.run()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, old)
    total = sum(sides.values()) or 1
    print(f"policy {args.policy}, {len(engine.state.steps)} layer-steps, path {engine.state.path}: "
          f"{total} samples; policy {sides['policy'] / total:.1%}, engine {sides['engine'] / total:.1%}, "
          f"other {sides['other'] / total:.1%}")
    for func, n in funcs.most_common(args.top):
        print(f"{n / total:6.1%}  {func}")


if __name__ == "__main__":
    main()
