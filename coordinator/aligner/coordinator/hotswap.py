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
from aligner.alignment import State, aligned_together
from aligner.coordinator.alignment import Coordinator
from aligner.errors import AlignerError, AlignmentSplitError, HotSwapRefused
from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.models import JobNode, Phase, SwapNode

Progress = Callable[[str, dict[str, Any]], None]


class HotSwap:
    def __init__(self, ledger: Ledger, margin: int = 2, stop: threading.Event | None = None) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
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
            if handover is None or handover.phase != Phase.DONE:
                problems.append(f"{old} is still the new version of {o.follows}: swap {o.follows} -> {old} first")
        doc, _ = self.ledger.subjects.writers(target)
        others = sorted({split_writer(w)[0] for w, e in doc.writers.items() if e.finished_after is None}
                        - {old, new})
        if others:
            problems.append(f"target {target!r} has other producers {others}; their output would not be swapped")
        if problems:
            raise HotSwapRefused("hot-swap refused: " + "; ".join(problems))
        return o, n

    def _aligned(self, job: str, subjects: tuple[str, ...]) -> bool:
        try:
            return aligned_together(self.jobs.source_state(job, s) for s in subjects)
        except AlignmentSplitError:
            return False  # the coordinator's align repairs a split alignment

    def _follows(self, n: JobNode) -> bool:
        """Every worker of the new version follows the old one's epochs (has committed one)."""
        consumers = self.jobs.consumers(n.job, n.inputs[0])
        return len(consumers) == n.parallelism and all(
            c.alignment.state is State.ALIGNED and c.job_epoch is not None
            for s in n.inputs for c in self.jobs.consumers(n.job, s).values())

    def committed(self, job: str, subjects: tuple[str, ...]) -> int:
        """The furthest job epoch any worker of ``job`` committed (-1: none yet)."""
        epochs = [c.job_epoch for s in subjects for c in self.jobs.consumers(job, s).values()
                  if c.job_epoch is not None]
        return max(epochs, default=-1)

    def status(self, old: str) -> dict[str, Any]:
        swap, _ = self.jobs.swap(old)
        return {} if swap is None else swap.model_dump(mode="json")

    # ---- observe -> step -> persist ---------------------------------------------------------------

    def observe(self, o: JobNode, n: JobNode) -> tuple[machine.Observed, int]:
        """Read the swap node and what its phase's next step depends on (and the node's version)."""
        swap, version = self.jobs.swap(o.job)
        need = machine.needs(swap)
        return machine.Observed(
            swap=swap,
            old_aligned=self._aligned(o.job, o.inputs) if "old_aligned" in need else None,
            new_follows=self._follows(n) if "new_follows" in need else None,
            acks=self._acks(o, n, swap) if "acks" in need and swap is not None else None,
            target_frontier=self.ledger.epochs.frontier(o.output) if "target_frontier" in need else None,
        ), version

    def run(self, old: str, new: str, target: str, at_epoch: int | None = None, timeout: float | None = None,
            progress: Progress | None = None, until: machine.Next = machine.Next.DONE) -> SwapNode:
        """Swap ``old`` for ``new`` at the target; waits as long as the jobs take unless ``timeout``.

        One loop: observe the ledger, let :func:`aligner.swap.coordinate` choose the step, persist or
        wait. ``until``: return the swap node as soon as that is the next step (a test's kill point)."""
        o, n = self.check(old, new, target)
        for job in (o, n):
            self.coordinator.watch_job(job.job, job.inputs)
        self.waiter.watch_swap(old)
        with self.waiter.within(timeout):
            return self._run(o, n, at_epoch, timeout, progress, until)

    def _run(self, o: JobNode, n: JobNode, at_epoch: int | None, timeout: float | None,
             progress: Progress | None, until: machine.Next) -> SwapNode:
        old = o.job
        while True:
            seen, version = self.observe(o, n)
            step = machine.coordinate(seen)
            if step is until or step is machine.Next.DONE:
                if seen.swap is None:
                    raise AlignerError(f"hot-swap of {old!r}: nothing recorded before its step {step}")
                return seen.swap
            if step in machine.WAITS:
                self._await(step, o, n, seen, timeout, progress)
            elif step is machine.Next.ALIGN:
                self.coordinator.align(old, timeout=timeout, progress=progress)
            else:
                self.jobs.write_swap(self._persist(step, o, n, seen.swap, at_epoch), version)

    def _persist(self, step: machine.Next, o: JobNode, n: JobNode, swap: SwapNode | None,
                 at_epoch: int | None) -> SwapNode:
        """The node a step writes: a (new) pre-commit, the commit, or done."""
        if step is machine.Next.PRECOMMIT:
            now = max(self.committed(o.job, o.inputs), self.committed(n.job, n.inputs),
                      self.ledger.epochs.frontier(o.output) or 0)
            return machine.precommit(swap, o.job, n.job, o.output, machine.choose(now, self.margin, at_epoch), now)
        assert swap is not None
        return machine.commit(swap) if step is machine.Next.COMMIT else machine.finish(swap)

    def _await(self, step: machine.Next, o: JobNode, n: JobNode, seen: machine.Observed, timeout: float | None,
               progress: Progress | None) -> None:
        """Wait (woken by watches) until the next step is another one."""
        swap = seen.swap
        what = {machine.Next.AWAIT_FOLLOWER: "the new version to follow",
                machine.Next.AWAIT_ACKS: f"both jobs to acknowledge S={swap.epoch if swap else '?'}",
                machine.Next.AWAIT_TARGET: f"{o.output} epoch {swap.epoch + 1 if swap else '?'} from {n.job}"}[step]

        def show() -> None:
            if progress:
                progress(what, {"new": n.job} if step is machine.Next.AWAIT_FOLLOWER else self.status(o.job))

        try:
            self.waiter.until(lambda: machine.coordinate(self.observe(o, n)[0]) is not step, f"hot-swap: {what}",
                              timeout, show)
        except TimeoutError as exc:
            if step is machine.Next.AWAIT_ACKS and swap is not None:  # say who holds the swap up
                raise TimeoutError(f"{exc}; {self._unacked(o, n, swap)}") from None
            raise

    def _unacked(self, o: JobNode, n: JobNode, swap: SwapNode) -> str:
        """The workers that have not acknowledged S, with what they reported last."""
        out = []
        for job in (o, n):
            consumers = self.jobs.consumers(job.job, job.inputs[0])
            for w in range(job.parallelism):
                c = consumers.get(w)
                if c is None:
                    out.append(f"{job.job}:{w} has not reported")
                elif c.swap_seen is None or c.swap_seen[0] != swap.epoch:
                    out.append(f"{job.job}:{w} acknowledged {c.swap_seen} at job epoch {c.job_epoch}")
        return "not acknowledged by " + (", ".join(out) or "nobody (all acknowledged)")

    def _acks(self, o: JobNode, n: JobNode, swap: SwapNode) -> machine.Acks:
        seen: list[tuple[int, int] | None] = []
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
