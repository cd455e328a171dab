"""``Generator.integers(n)`` draws for the Random rule's decider (:mod:`.random`), without
numpy's per-call cost (about 1 us a call, most of a random-eviction step).

numpy draws a scalar ``integers(n)`` (``n < 2**32``) from 32-bit words of the bit generator
with Lemire's multiply-and-reject method, and ``integers(1)`` draws nothing; PCG64 hands out a
64-bit output as two 32-bit words, low half first, keeping the high half for the next call
(``has_uint32`` / ``uinteger`` in its state). :class:`Draws` does the same on the generator's
raw outputs, so the values and the generator's state afterwards are those of the calls it
replaces. It is used only where :func:`exact_draws` confirms that on a scratch generator.
"""

from __future__ import annotations

import numpy as np

_MASK = 0xFFFFFFFF


class Draws:
    """Bounded draws from a PCG64 generator's raw outputs (see the module docstring); call
    :meth:`close` after the last draw to leave the generator's half-word buffer as numpy would."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.bg = rng.bit_generator
        self.raw = self.bg.random_raw
        st = self.bg.state
        self.has = int(st["has_uint32"])
        self.half = int(st["uinteger"])

    def _word(self) -> int:
        if self.has:
            self.has = 0
            return self.half
        r = int(self.raw())
        self.has = 1
        self.half = r >> 32
        return r & _MASK

    def draw(self, n: int) -> int:
        """What ``rng.integers(n)`` returns (``1 <= n < 2**32``)."""
        if n == 1:
            return 0
        m = self._word() * n
        low = m & _MASK
        if low < n:
            threshold = (_MASK - (n - 1)) % n
            while low < threshold:
                m = self._word() * n
                low = m & _MASK
        return m >> 32

    def close(self) -> None:
        """Write the half-word buffer back into the generator's state."""
        self.bg.state = {**self.bg.state, "has_uint32": self.has, "uinteger": self.half}


def exact_draws(rng: np.random.Generator) -> bool:
    """Whether :class:`Draws` reproduces ``rng.integers`` for generators of ``rng``'s kind
    (checked on scratch generators: values and final state)."""
    if type(rng.bit_generator) is not np.random.PCG64:
        return False
    ns = [1, 2, 3, 7, 64, 1000, 2**31 + 11, 5, 1, 2, 250, 3, 2**32 - 5, 9, 1, 4]
    ref = np.random.Generator(np.random.PCG64(12345))
    mine = np.random.Generator(np.random.PCG64(12345))
    ref.random()   # leave the buffers at a different point than a fresh state
    mine.random()
    d = Draws(mine)
    for _ in range(8):
        for n in ns:
            if int(ref.integers(n)) != d.draw(n):
                return False
    d.close()
    return ref.bit_generator.state == mine.bit_generator.state
