"""Expert weights in two places: the host pool (every expert of every MoE layer, pinned on a GPU
machine so that copies are asynchronous DMA) and the device slots (the expert cache: one slab of
``slots`` experts, each a flat weight vector, see :mod:`.kernels`).

Which unit lives in which slot is this module's business; how many bytes each pool may hold is
the VRAM accounting's (:class:`moesim.sim.engine.vram.Vram`, the simulator's own), so the executor
keeps exactly the simulator's budget rules. With whole experts of one size, a budget of ``B``
bytes in pools of ``cap_p`` bytes never holds more than ``floor(B / expert_bytes)`` experts, so
one slab of that many slots (plus the transfer buffer's) always has a free slot when the
accounting grants room.

On a GPU the compute stream runs behind the host: when a slot is freed, kernels that read it
may still be queued. :meth:`ExpertStore.free` therefore records an event on the compute stream,
and the next copy into that slot waits for it on the copy stream (:meth:`ExpertStore.fence`),
so a copy never overwrites weights that a queued kernel has yet to read.
"""

from __future__ import annotations

from typing import Any

import torch

from moesim.policies.contract.base import UnitKey


class StoreError(RuntimeError):
    """A slot asked for when none is free: the accounting and the slots disagree (a bug)."""


class ExpertStore:
    """Host pool ``host[layer]`` (``[E, n]``) and device slots ``slab`` (``[slots, n]``)."""

    def __init__(self, host: list[torch.Tensor], device: torch.device, slots: int) -> None:
        self.host = host
        self.device = device
        n = int(host[0].shape[1])
        self.numel = n
        self.dtype = host[0].dtype
        # touched now (zeroed), as a GPU runtime allocates its cache up front: the first copy
        # into a slot must not pay the page faults of fresh memory
        self.slab = torch.zeros((max(1, slots), n), dtype=self.dtype, device=device)
        self.free_slots: list[int] = list(range(max(1, slots)))[::-1]
        self.slot_of: dict[UnitKey, int] = {}
        self.freed_at: dict[int, Any] = {}   # slot -> CUDA event recorded when it was last freed

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert."""
        return self.numel * self.slab.element_size()

    def alloc(self, key: UnitKey) -> torch.Tensor:
        """A free slot for ``key``; returns the slot's tensor (the copy's destination)."""
        if key in self.slot_of:
            return self.slab[self.slot_of[key]]
        if not self.free_slots:
            raise StoreError(f"no free device slot for {key} ({self.slab.shape[0]} slots)")
        s = self.free_slots.pop()
        self.slot_of[key] = s
        return self.slab[s]

    def free(self, key: UnitKey) -> None:
        """Give ``key``'s slot back (its copy must have landed or been withdrawn). On a GPU, an
        event on the compute stream marks the end of the kernels queued so far, the last that
        may read the slot."""
        s = self.slot_of.pop(key, None)
        if s is not None:
            self.free_slots.append(s)
            if self.device.type == "cuda":
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(self.device))
                self.freed_at[s] = ev

    def fence(self, key: UnitKey) -> Any:
        """What a copy into ``key``'s slot must wait for: the CUDA event recorded when the slot
        was last freed (None on CPU, where kernels finish before the host goes on, or for a
        slot never used before). Taken once: the copy that waits on it consumes it."""
        return self.freed_at.pop(self.slot_of[key], None)

    def weights(self, key: UnitKey) -> torch.Tensor:
        """The device weights of a resident unit."""
        return self.slab[self.slot_of[key]]

    def source(self, layer: int, expert: int) -> torch.Tensor:
        """The host copy of an expert (the copy's source)."""
        return self.host[layer][expert]


def pageable_pool(host: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of a host pool in pageable (not pinned) memory, where a runtime that never pins keeps
    its offloaded weights (Hugging Face accelerate's ``device_map`` offload): a copy from them is
    staged by the CUDA driver through its own pinned buffer and blocks the host. Tensors that are
    not pinned are returned as they are."""
    out = []
    for t in host:
        if t.is_pinned():
            t = torch.empty(t.shape, dtype=t.dtype, device="cpu").copy_(t)
        out.append(t)
    return out

