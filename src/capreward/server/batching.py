"""Dynamic batching for the reward server: concurrent requests merged into one scorer call.

Requests are queued whole, once their body has been read and validated. A free worker forms a batch
from the head of the queue (first come, first served; a request is never split) and closes it as soon
as it holds ``max_batch_size`` samples or ``max_wait`` seconds have passed since its oldest request
was queued, whichever comes first; a request larger than ``max_batch_size`` is a batch of its own.
The merged batch is scored in one call and each request gets its own slice back, in order.

Guarantee: batching adds at most ``max_wait`` to a request's latency. A request waits for a batch it
is not part of only while all ``workers`` are busy scoring (it then joins the next batch formed),
and it never waits for a client that is still sending (bodies are read before queueing). A request
whose batch has not started within ``timeout`` is taken off the queue and refused with :class:`Busy`.

Scores do not depend on the merge: the scorers are batch-invariant, and a sample that cannot be
scored gets None with its reason without touching the others (see ``score`` of
:class:`~capreward.server.http.RewardService`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence

from ..adapters.labels import Label
from ..adapters.scoring import ScoredBatch
from ..errors import CaprewardError


class Busy(CaprewardError):
    """The request's batch did not start within its timeout (or the batcher is closing)."""


@dataclass(eq=False)
class _Job:
    captions: list[str]
    labels: list[Label]
    queued: float = field(default_factory=time.monotonic)
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    result: ScoredBatch | None = None
    error: BaseException | None = None


def slice_batch(batch: ScoredBatch, start: int, stop: int) -> ScoredBatch:
    """Samples ``start:stop`` of ``batch`` (values, reasons and every metric column)."""
    return ScoredBatch(batch.values[start:stop], batch.reasons[start:stop],
                       {key: list(column[start:stop]) for key, column in batch.metrics.items()})


class DynamicBatcher:
    """Merge concurrent scoring jobs (see the module docstring).

    Args:
        score: scores a list of captions against their labels; one result per sample.
        max_batch_size: most samples merged into one call; 0 turns merging off (every request is
            scored alone, still at most ``workers`` at once).
        max_wait: seconds a batch stays open for more requests after its oldest was queued.
        workers: batches scored at once (each in its own thread).
    """

    def __init__(self, score: Callable[[list[str], list[Label]], ScoredBatch], max_batch_size: int = 64,
                 max_wait: float = 0.005, workers: int = 1):
        if max_batch_size < 0 or max_wait < 0 or workers < 1:
            raise ValueError(f"bad batcher settings: max_batch_size={max_batch_size}, max_wait={max_wait}, "
                             f"workers={workers}")
        self.score = score
        self.max_batch_size = int(max_batch_size)
        self.max_wait = float(max_wait)
        self.workers = int(workers)
        self.batches = 0  # scorer calls made
        self.samples = 0  # samples scored
        self._pending: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._forming = threading.Lock()  # one worker forms a batch at a time
        self._active = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"capreward-batcher-{i}", daemon=True)
                         for i in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, captions: Sequence[str], labels: Sequence[Label], timeout: float | None = None) -> ScoredBatch:
        """Score one request's samples in whichever batch they join; blocks until done. Raises
        :class:`Busy` when the batch has not started within ``timeout`` seconds."""
        job = _Job(list(captions), list(labels))
        if not job.captions:
            return ScoredBatch([], [])
        with self._cond:
            if self._closed:
                raise Busy("the server is shutting down")
            self._pending.append(job)
            self._cond.notify_all()
        if not job.started.wait(timeout):
            with self._cond:
                if not job.started.is_set():
                    self._pending.remove(job)
                    raise Busy(f"all {self.workers} scoring workers stayed busy for {timeout} s")
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _take(self) -> list[_Job] | None:
        """The next batch's jobs (marked started), or None once closed and drained."""
        with self._cond:
            while True:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return None
                deadline = self._pending[0].queued + self.max_wait
                while self.max_batch_size and not self._closed and self._pending:
                    if sum(len(j.captions) for j in self._pending) >= self.max_batch_size:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._pending:  # the oldest may have timed out and left while we waited
                    break
            jobs = [self._pending.popleft()]
            size = len(jobs[0].captions)
            while self.max_batch_size and self._pending and size + len(self._pending[0].captions) <= self.max_batch_size:
                size += len(self._pending[0].captions)
                jobs.append(self._pending.popleft())
            for job in jobs:
                job.started.set()
            self._active += 1
            return jobs

    def _work(self) -> None:
        while True:
            with self._forming:
                jobs = self._take()
            if jobs is None:
                return
            try:
                self._run(jobs)
            finally:
                with self._cond:
                    self._active -= 1
                    self._cond.notify_all()

    def _run(self, jobs: list[_Job]) -> None:
        captions = [c for job in jobs for c in job.captions]
        labels = [lab for job in jobs for lab in job.labels]
        try:
            merged = self.score(captions, labels)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting request
            for job in jobs:
                job.error = exc
                job.done.set()
            return
        with self._cond:
            self.batches += 1
            self.samples += len(captions)
        start = 0
        for job in jobs:
            job.result = slice_batch(merged, start, start + len(job.captions))
            start += len(job.captions)
            job.done.set()

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._pending and self._active == 0

    def close(self, timeout: float = 120.0) -> bool:
        """Stop taking requests, finish those queued or being scored (up to ``timeout`` s). Returns
        False when work was still running at the deadline."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._pending or self._active:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True


__all__ = ["Busy", "DynamicBatcher", "slice_batch"]
