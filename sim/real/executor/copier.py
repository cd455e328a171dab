"""Copy engines: how the executor moves an expert from the host pool into a device slot.

* :class:`SyncCopier`: the copy runs at once on the calling thread (``Tensor.copy_``); nothing
  overlaps with compute.
* :class:`ThreadCopier`: one copy thread, the CPU stand-in for a GPU's copy engine: copies run
  one after another in queue order (demand loads first, then prefetches by priority, or plain
  issue order under ``fifo``) while the main thread computes; ``Tensor.copy_`` releases the GIL.
* :class:`CudaCopier`: a CUDA copy stream from pinned host memory; completion is a CUDA event;
  the compute stream waits on the event before it uses the slot. (Written for GPUs; this
  repository's CI has none, so this path is not measured there.)

Every engine answers the same calls: :meth:`submit` a copy with a class (0 demand, 1 prefetch),
a priority and what it must wait for (a GPU fence), :meth:`done`, :meth:`started`, :meth:`wait`, :meth:`cancel` one not started,
and :meth:`busy_s`, the seconds spent copying.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Any

import torch

DEMAND, PREFETCH = 0, 1


class _Job:
    """One copy: ``dst.copy_(src)``."""

    __slots__ = ("key", "src", "dst", "cls", "started", "finished", "event", "cuda_event", "cancelled")

    def __init__(self, key: Any, src: torch.Tensor, dst: torch.Tensor, cls: int) -> None:
        self.key = key
        self.src, self.dst, self.cls = src, dst, cls
        self.started = False
        self.finished = False
        self.cancelled = False
        self.event = threading.Event()
        self.cuda_event: Any = None


class SyncCopier:
    """Copies at once on the calling thread."""

    name = "sync"

    def __init__(self) -> None:
        self._busy = 0.0

    def submit(self, key: Any, src: torch.Tensor, dst: torch.Tensor, cls: int, priority: float = 0.0,
               after: Any = None) -> _Job:
        """Copy now; the returned job is done (``after``, a GPU fence, has no meaning here: CPU
        kernels finish before the host goes on)."""
        job = _Job(key, src, dst, cls)
        t0 = time.perf_counter()
        dst.copy_(src)
        self._busy += time.perf_counter() - t0
        job.started = job.finished = True
        job.event.set()
        return job

    def done(self, job: _Job) -> bool:
        """The copy has landed."""
        return job.finished

    def started(self, job: _Job) -> bool:
        """The copy has begun (it can no longer be withdrawn)."""
        return job.started

    def wait(self, jobs: list[_Job]) -> None:
        """Block until one of ``jobs`` has landed."""

    def cancel(self, job: _Job) -> bool:
        """Withdraw a copy not started; never possible here."""
        return False

    def reprioritize(self, job: _Job, priority: float) -> bool:
        """Change a queued copy's priority; never possible here."""
        return False

    def busy_s(self) -> float:
        """Seconds spent copying."""
        return self._busy

    def close(self) -> None:
        """Stop the engine (nothing to stop)."""


class ThreadCopier:
    """One copy thread serving a queue (``order``: ``priority`` or ``fifo``)."""

    name = "thread"

    def __init__(self, order: str = "priority") -> None:
        self.order = order
        self._heap: list[tuple[tuple[float, ...], int, _Job]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._landed = threading.Condition()
        self._stop = False
        self._busy = 0.0
        self._thread = threading.Thread(target=self._work, name="moesim-copy", daemon=True)
        self._thread.start()

    def _key(self, cls: int, priority: float) -> tuple[float, ...]:
        return () if self.order == "fifo" else (float(cls), -float(priority))

    def submit(self, key: Any, src: torch.Tensor, dst: torch.Tensor, cls: int, priority: float = 0.0,
               after: Any = None) -> _Job:
        """Queue a copy (``after``: ignored, as for :class:`SyncCopier`)."""
        job = _Job(key, src, dst, cls)
        with self._cv:
            heapq.heappush(self._heap, (self._key(cls, priority), next(self._seq), job))
            self._cv.notify()
        return job

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                _, _, job = heapq.heappop(self._heap)
                if job.cancelled:
                    continue
                job.started = True
            t0 = time.perf_counter()
            job.dst.copy_(job.src)
            dt = time.perf_counter() - t0
            with self._landed:
                self._busy += dt
                job.finished = True
                job.event.set()
                self._landed.notify_all()

    def done(self, job: _Job) -> bool:
        """The copy has landed."""
        return job.finished

    def started(self, job: _Job) -> bool:
        """The copy has begun."""
        return job.started

    def wait(self, jobs: list[_Job]) -> None:
        """Block until one of ``jobs`` has landed."""
        with self._landed:
            while not any(j.finished for j in jobs):
                self._landed.wait()

    def cancel(self, job: _Job) -> bool:
        """Withdraw a queued copy; False once it started."""
        with self._cv:
            if job.started:
                return False
            job.cancelled = True
            return True

    def reprioritize(self, job: _Job, priority: float) -> bool:
        """Give a queued copy a new priority (``priority`` order only)."""
        if self.order == "fifo":
            return False
        with self._cv:
            if job.started or job.cancelled:
                return False
            self._heap = [x for x in self._heap if x[2] is not job]
            heapq.heapify(self._heap)
            heapq.heappush(self._heap, (self._key(job.cls, priority), next(self._seq), job))
            return True

    def busy_s(self) -> float:
        """Seconds the copy thread spent copying."""
        return self._busy

    def close(self) -> None:
        """Stop the copy thread."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=5)


class CudaCopier:
    """A CUDA copy stream; sources must be pinned host tensors for the copy to be asynchronous.
    Copies are issued at once in issue order (a CUDA stream never reorders; ``cancel`` is not
    possible), and the compute stream waits on each copy's event before using its slot."""

    name = "cuda-stream"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self._jobs: list[_Job] = []

    def submit(self, key: Any, src: torch.Tensor, dst: torch.Tensor, cls: int, priority: float = 0.0,
               after: Any = None) -> _Job:
        """Issue the copy on the copy stream and record its completion event; ``after`` (a CUDA
        event, :meth:`ExpertStore.fence`) is waited for on the copy stream first, so the copy does
        not overwrite a slot that queued kernels still read."""
        job = _Job(key, src, dst, cls)
        ev_start = torch.cuda.Event(enable_timing=True)
        ev_end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            ev_start.record(self.stream)
            dst.copy_(src, non_blocking=True)
            ev_end.record(self.stream)
        job.started = True
        job.cuda_event = (ev_start, ev_end)
        self._jobs.append(job)
        return job

    def done(self, job: _Job) -> bool:
        """The copy has landed (event query)."""
        if not job.finished and job.cuda_event[1].query():
            job.finished = True
        return job.finished

    def started(self, job: _Job) -> bool:
        """Issued copies count as started (a stream cannot withdraw them)."""
        return True

    def wait(self, jobs: list[_Job]) -> None:
        """Make the compute stream wait for the first job and block the host until it lands."""
        job = jobs[0]
        torch.cuda.current_stream(self.device).wait_event(job.cuda_event[1])
        job.cuda_event[1].synchronize()
        job.finished = True

    def cancel(self, job: _Job) -> bool:
        """Issued CUDA copies cannot be withdrawn."""
        return False

    def reprioritize(self, job: _Job, priority: float) -> bool:
        """A CUDA stream keeps issue order."""
        return False

    def busy_s(self) -> float:
        """Seconds the copy stream spent copying (from the events of landed copies)."""
        torch.cuda.synchronize(self.device)
        return sum(j.cuda_event[0].elapsed_time(j.cuda_event[1]) for j in self._jobs) / 1e3

    def close(self) -> None:
        """Wait for every copy."""
        torch.cuda.synchronize(self.device)


def make_copier(device: torch.device, mode: str, order: str) -> Any:
    """The copy engine for ``device``: ``mode`` is ``auto`` (a CUDA stream on a GPU, the copy
    thread on CPU), ``thread``, ``sync`` or ``cuda``."""
    if mode == "auto":
        mode = "cuda" if device.type == "cuda" else "thread"
    if mode == "sync":
        return SyncCopier()
    if mode == "thread":
        return ThreadCopier(order)
    if mode == "cuda":
        return CudaCopier(device)
    raise ValueError(f"unknown copy mode {mode!r} (auto, thread, sync or cuda)")
