"""Hot-swap a running job for a new version with exactly-once output (thesis 2.3.1, 4.2).

The new version runs beside the old one, following its aligned epochs and voiding its output.
The coordinator picks a swap epoch S in the future of both and commits it in two phases on the
swap node: ``precommit`` (each worker of both jobs acknowledges S at the start of an epoch <= S,
and waits at S+1 for the outcome) and ``commit`` (the old sink finishes after S, the new one
writes from S+1 and never commits S+1 before S is committed at the target). Every step is
recorded before it takes effect, so the coordinator or either job can be killed and restarted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from aligner import swap as machine
from aligner.alignment import State
from aligner.coordinator.alignment import Coordinator
from aligner.errors import AlignerError, AlignmentSplitError, HotSwapRefused
from aligner.jobs import JobLedger
from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.models import JobNode, SwapNode

Progress = Callable[[str, dict[str, Any]], None]


class HotSwap:
    def __init__(self, ledger: Ledger, margin: int = 2, stop: threading.Event | None = None) -> None:
        self.ledger = ledger
        self.jobs = JobLedger(ledger)
        self.coordinator = Coordinator(ledger, stop=stop)
        self.waiter = self.coordinator.waiter
        self.margin = margin

    def check(self, old: str, new: str, target: str) -> tuple[JobNode, JobNode]:
        o, n = self.jobs.job(old), self.jobs.job(new)
        problems = []
        if o.output != target or n.output != target:
            problems.append(f"both jobs must write {target!r} (old writes {o.output!r}, new writes {n.output!r})")
        if set(o.inputs) != set(n.inputs):
            problems.append(f"inputs differ: {sorted(o.inputs)} vs {sorted(n.inputs)}")
        for job in (o, n):
            if job.mode == "at_least_once":
                problems.append(f"{job.job} runs at-least-once; a swap needs exactly-once or aligned jobs")
            if not job.deterministic:
                problems.append(f"{job.job} declares itself nondeterministic (async I/O or cycles, thesis 4.6)")
        if n.follows != old:
            problems.append(f"{new} must run as the new version of {old} (JobSpec(follows={old!r}))")
        if o.follows is not None:
            handover, _ = self.jobs.swap(o.follows)
            if handover is None or handover.phase != "done":
                problems.append(f"{old} is still the new version of {o.follows}: swap {o.follows} -> {old} first")
        doc, _ = self.ledger.writers(target)
        others = sorted({split_writer(w)[0] for w, e in doc.writers.items() if e.finished_after is None}
                        - {old, new})
        if others:
            problems.append(f"target {target!r} has other producers {others}; their output would not be swapped")
        if problems:
            raise HotSwapRefused("hot-swap refused: " + "; ".join(problems))
        return o, n

    def _aligned(self, job: str, subjects: tuple[str, ...]) -> bool:
        try:
            return all(self.jobs.source_state(job, s).state is State.ALIGNED for s in subjects)
        except AlignmentSplitError:
            return False  # the coordinator's align repairs a split alignment

    def _committed(self, job: str, subjects: tuple[str, ...]) -> int:
        epochs = [c.job_epoch for s in subjects for c in self.jobs.consumers(job, s).values()
                  if c.job_epoch is not None]
        return max(epochs, default=-1)

    def _wait(self, what: str, cond: Callable[[], bool], timeout: float | None, progress: Progress | None,
              info: Callable[[], dict[str, Any]]) -> None:
        def show() -> None:
            if progress:
                progress(what, info())

        self.waiter.until(cond, f"hot-swap: {what}", timeout, show)

    def status(self, old: str) -> dict[str, Any]:
        swap, _ = self.jobs.swap(old)
        return {} if swap is None else swap.model_dump()

    def run(self, old: str, new: str, target: str, at_epoch: int | None = None, timeout: float | None = None,
            progress: Progress | None = None) -> SwapNode:
        """Swap ``old`` for ``new`` at the target; waits as long as the jobs take unless ``timeout``."""
        o, n = self.check(old, new, target)
        for job in (o, n):
            self.coordinator.watch_job(job.job, job.inputs)
        self.waiter.watch_swap(old)
        swap, version = self.jobs.swap(old)
        if swap is not None and swap.phase == "done":
            return swap
        if swap is None or swap.phase == "aborted":
            if not self._aligned(old, o.inputs):
                self.coordinator.align(old, timeout=timeout, progress=progress)
            self._wait("the new version to follow", lambda: all(
                c.alignment.state is State.ALIGNED and c.job_epoch is not None
                for s in n.inputs for c in self.jobs.consumers(new, s).values()
            ) and len(self.jobs.consumers(new, n.inputs[0])) == n.parallelism, timeout, progress,
                lambda: {"new": new})
            swap, version = self._precommit(o, n, swap, version, at_epoch)
        info = lambda: self.status(old)  # noqa: E731
        while swap.phase == "precommit":
            acks = self._await_acks(o, n, swap, timeout, progress, info)
            if acks is machine.Acks.LATE:  # a worker passed S before it saw S: choose a later S
                swap, version = self._precommit(o, n, swap, version, at_epoch)
                continue
            version = self.jobs.write_swap(swap := machine.commit(swap), version)
        if swap.phase == "commit":
            self._wait(f"{target} epoch {swap.epoch + 1} from {new}",
                       lambda: self.ledger.frontier(target) is not None and self.ledger.frontier(target) > swap.epoch,
                       timeout, progress, info)
            self.jobs.write_swap(swap := machine.finish(swap), version)
        return swap

    def _precommit(self, o: JobNode, n: JobNode, swap: SwapNode | None, version: int,
                   at_epoch: int | None) -> tuple[SwapNode, int]:
        now = max(self._committed(o.job, o.inputs), self._committed(n.job, n.inputs),
                  self.ledger.frontier(o.output) or 0)
        node = machine.precommit(swap, o.job, n.job, o.output, machine.choose(now, self.margin, at_epoch))
        return node, self.jobs.write_swap(node, version)

    def _await_acks(self, o: JobNode, n: JobNode, swap: SwapNode, timeout: float | None,
                    progress: Progress | None, info: Callable[[], dict[str, Any]]) -> machine.Acks:
        """Wait until every worker of both jobs acknowledged S in time, or one saw it too late."""
        seen: list[machine.Acks] = []

        def settled() -> bool:
            seen.append(self._acks(o, n, swap))
            return seen[-1] is not machine.Acks.WAITING

        self._wait(f"both jobs to acknowledge S={swap.epoch}", settled, timeout, progress, info)
        return seen[-1]

    def _acks(self, o: JobNode, n: JobNode, swap: SwapNode) -> machine.Acks:
        seen = []
        for job in (o, n):
            consumers = self.jobs.consumers(job.job, job.inputs[0])
            if len(consumers) < job.parallelism:
                return machine.Acks.WAITING
            seen.extend(c.swap_seen for c in consumers.values())
        return machine.acks(seen, swap.epoch)

    def abort(self, old: str) -> SwapNode:
        swap, version = self.jobs.swap(old)
        if swap is None:
            raise AlignerError(f"no hot-swap of {old!r} to abort")
        swap = machine.abort(swap)
        self.jobs.write_swap(swap, version)
        return swap
