"""The scheduler of a serving run: which requests the next iteration runs, decided at each
iteration boundary from what has arrived by then, and the times each request reaches (arrival,
admission, first token, finish). One per run (the plan, :class:`~moesim.sim.engine.serving.
ServingPlan`, is shared by the runs of a sweep; this is not).

``static``: when the GPU has no batch, it takes up to ``max_batch`` of the requests that have
arrived (first come, first served; if none has, it idles until the next arrival), runs their
prompts one request an iteration, then decodes them in lockstep, each leaving when it has its
last token; the next batch starts when the last one leaves. This is the lockstep replay of
:func:`~moesim.sim.engine.workload.build_workload` with batches formed on arrival.

``continuous`` (vLLM-style iteration-level scheduling): every iteration runs up to
``max_tokens`` tokens. Each running request that is decoding runs one token first; then the
running requests whose prompts are unfinished, in admission order, run the next chunk of their
prompt that fits; then requests that have arrived join (first come, first served) while fewer
than ``max_batch`` run and tokens remain, each running its first prompt chunk (or its first
decode token when its prompt is not replayed). A request whose prompt is cut runs the rest in
later iterations (chunked prefill). Finished requests leave at the end of the iteration.

Within an iteration tokens are ordered: decode tokens (admission order), then prompt chunks.
An iteration that runs any prompt token has phase ``prefill``, else ``decode``. ``batch`` is
the static batch's number, or for continuous batching the number of the busy period (it changes
when the GPU went idle with nobody running).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from moesim.sim.engine.serving import ServingPlan
from moesim.sim.engine.workload import Iteration
from moesim.traces.format.trace_file import DECODE, PREFILL


class Scheduler:
    """The per-run scheduler of ``plan`` (see the module). :meth:`next_iteration` forms the next
    iteration at the instant the GPU frees; :meth:`end_iteration` records its tokens."""

    def __init__(self, plan: ServingPlan) -> None:
        self.plan = plan
        n = plan.n
        self.n_prompt = [len(x) for x in plan.prompt_rows]
        self.n_decode = [len(x) for x in plan.decode_rows]
        self.done_prompt = [0] * n
        self.done_decode = [0] * n
        self.admitted = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.tokens_out = np.zeros(n, dtype=np.int64)
        self.next_arrival = 0                 # index of the first request not yet queued
        self.waiting: list[int] = []          # arrived, not admitted (arrival order)
        self.running: list[int] = []          # admitted, not finished (admission order)
        self.prefills: list[int] = []         # static: the batch's prompts still to run
        self.batch = -1
        self.count = 0                        # iterations formed
        self.tokens = 0                       # tokens run
        self.finished = 0
        self.start = 0.0                      # when the last iteration formed starts
        self.live_kv_peak = 0                 # most KV tokens live at once (KV cache modelled)
        self._emits: list[int] = []           # requests that get a token when the iteration ends
        self._ends: list[int] = []            # ... and of those, the ones that finish

    # -- forming iterations -------------------------------------------------------------------
    def iterate(self, clock: Callable[[], float]) -> Iterator[Iteration]:
        """The run's iterations, each formed when the previous one has ended (``clock()`` then)."""
        while True:
            it = self.next_iteration(clock())
            if it is None:
                return
            yield it

    def _queue_arrived(self, now: float) -> None:
        arrival = self.plan.arrival
        i = self.next_arrival
        n = len(arrival)
        while i < n and arrival[i] <= now:
            self.waiting.append(i)
            i += 1
        self.next_arrival = i

    def next_iteration(self, now: float) -> Iteration | None:
        """The iteration the GPU runs next, free at ``now`` (None when every request has finished).
        When nothing runs and nothing waits it starts at the next arrival (:attr:`start`)."""
        self._queue_arrived(now)
        if not self.running and not self.waiting:
            if self.next_arrival >= self.plan.n:
                return None
            now = float(self.plan.arrival[self.next_arrival])
            self._queue_arrived(now)
            if self.plan.kind == "continuous":
                self.batch += 1
        self.start = now
        parts = self._static(now) if self.plan.kind == "static" else self._continuous(now)
        return self._make(parts)

    def _admit(self, r: int, now: float) -> None:
        self.running.append(r)
        self.admitted[r] = now

    def _static(self, now: float) -> list[tuple[int, int]]:
        """(request, tokens) parts: a prompt a request at a time, then the batch's decode step."""
        if not self.running:
            take = self.waiting[:self.plan.max_batch]
            del self.waiting[:len(take)]
            for r in take:
                self._admit(r, now)
            self.batch += 1
            self.prefills = [r for r in take if self.n_prompt[r]]
        if self.prefills:
            r = self.prefills.pop(0)
            return [(r, -self.n_prompt[r])]
        return [(r, 1) for r in self.running if self.done_decode[r] < self.n_decode[r]]

    def _continuous(self, now: float) -> list[tuple[int, int]]:
        """(request, tokens) parts: decode tokens, then prompt chunks, then newcomers, within max_tokens."""
        budget = self.plan.max_tokens
        decodes: list[tuple[int, int]] = []
        chunks: list[tuple[int, int]] = []
        for r in self.running:
            if self.done_prompt[r] >= self.n_prompt[r]:
                decodes.append((r, 1))
                budget -= 1
        for r in self.running:
            rest = self.n_prompt[r] - self.done_prompt[r]
            if rest > 0 and budget > 0:
                c = min(rest, budget)
                chunks.append((r, -c))
                budget -= c
        while self.waiting and len(self.running) < self.plan.max_batch and budget > 0:
            r = self.waiting.pop(0)
            self._admit(r, now)
            if self.n_prompt[r]:
                c = min(self.n_prompt[r], budget)
                chunks.append((r, -c))
                budget -= c
            else:
                decodes.append((r, 1))
                budget -= 1
        return decodes + chunks

    def _make(self, parts: list[tuple[int, int]]) -> Iteration:
        """The iteration of ``parts`` ((request, 1) a decode token, (request, -c) a prompt chunk of
        c tokens): its rows, requests, first-token flags and KV reads; which requests it gives a
        token and finishes."""
        plan = self.plan
        ctx = plan.context_tokens
        rows: list[np.ndarray] = []
        rids: list[int] = []
        firsts: list[bool] = []
        kv = pairs = 0
        emits: list[int] = []
        ends: list[int] = []
        prefill = False
        for r, c in parts:
            dp, dd = self.done_prompt[r], self.done_decode[r]
            first = dp == 0 and dd == 0
            if c < 0:   # a prompt chunk
                p = -c
                rows.append(plan.prompt_rows[r][dp:dp + p])
                n = ctx + dp
                kv += n + p
                pairs += p * n + p * (p + 1) // 2
                self.done_prompt[r] = dp + p
                prefill = True
                if dp + p == self.n_prompt[r]:
                    emits.append(r)
            else:
                p = 1
                rows.append(plan.decode_rows[r][dd:dd + 1])
                n = ctx + self.n_prompt[r] + dd + 1
                kv += n
                pairs += n
                self.done_decode[r] = dd + 1
                emits.append(r)
            rids.extend([r] * p)
            firsts.append(first)
            firsts.extend([False] * (p - 1))
            if self.done_prompt[r] == self.n_prompt[r] and self.done_decode[r] == self.n_decode[r]:
                ends.append(r)
        rows0 = rows[0] if len(rows) == 1 else np.concatenate(rows)
        if plan.kv_modelled:
            live = sum(ctx + self.done_prompt[r] + self.done_decode[r] for r in self.running)
            self.live_kv_peak = max(self.live_kv_peak, live)
        else:
            kv = pairs = 0
        first_row = int(rows0[0])
        it = Iteration(self.count, PREFILL if prefill else DECODE, rows0, np.array(rids, dtype=np.int64),
                       self.batch, np.array(firsts, dtype=bool),
                       first_row if first_row in plan.embedding_rows else -1, kv, pairs)
        self.count += 1
        self.tokens += len(rids)
        self._emits = emits
        self._ends = ends
        return it

    # -- recording ----------------------------------------------------------------------------
    def end_iteration(self, now: float, token_end: dict[int, list[float]]) -> None:
        """The iteration formed last ended at ``now``: a token for each request it gave one
        (into ``token_end``), and the finished requests leave."""
        for r in self._emits:
            ends = token_end.get(r)
            if ends is None:
                token_end[r] = [now]
                self.first_token[r] = now
            else:
                ends.append(now)
            self.tokens_out[r] += 1
        if self._ends:
            for r in self._ends:
                self.finish[r] = now
                self.running.remove(r)
                self.finished += 1
