"""The alignment coordinator: drives CatchUp -> Ready -> Align(k, J) -> Aligned, and Abort.

Every decision is written to the job's decision node before it takes effect, so a coordinator
killed at any point is resumed by the next one from the recorded phase. Coordinators run under
a ZooKeeper leader election; only the leader writes commands.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aligner import decision as machine
from aligner.alignment import Command, ConsumerAlignment, State, aligned_together
from aligner.coordinator.waiting import Waiter
from aligner.decision import Next, Settled
from aligner.errors import AlignerError, AlignmentSplitError, EpochCollectedError
from aligner.ledger import Ledger
from aligner.models import AlignmentDecision, DecisionPhase, now_ms

log = logging.getLogger(__name__)

Progress = Callable[[str, dict[str, Any]], None]


@contextlib.contextmanager
def leadership(ledger: Ledger, timeout: float | None = None, identifier: str | None = None) -> Iterator[None]:
    """Hold coordinator leadership for the block (kazoo's Election recipe: its lock survives
    connection loss and recognises its own node after a retried create). Waits for the current
    leader as long as it leads, unless ``timeout`` (seconds) is given."""
    from kazoo.exceptions import LockTimeout

    me = identifier or uuid.uuid4().hex
    election = ledger.jobs.election(me)
    try:
        acquired = election.lock.acquire(timeout=timeout)
    except LockTimeout:
        acquired = False
    if not acquired:
        leaders = [c for c in election.contenders() if c != me]
        raise AlignerError(f"another coordinator ({', '.join(leaders) or 'unknown'}) is leading; "
                           f"gave up after {timeout:.0f}s")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # an unreachable ZooKeeper frees the lock with the session anyway
            election.lock.release()


class Coordinator:
    def __init__(self, ledger: Ledger, margin: int = 3, stop: threading.Event | None = None) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
        self.margin = margin
        self.waiter = Waiter(ledger, stop)

    def watch_job(self, job: str, subjects: Sequence[str]) -> None:
        """Wake waits on this job's consumer reports (new consumers and every state change)."""
        self.waiter.watch_job(job, subjects)

    # ---- status -------------------------------------------------------------------------------

    def source_status(self, job: str, subject: str) -> dict[str, Any]:
        consumers = self.jobs.consumers(job, subject)
        try:
            state = self.jobs.source_state(job, subject)
        except AlignmentSplitError:  # shown as it is; `aligner align` repairs it
            state = ConsumerAlignment(state=State.ALIGNING)
        frontier = self.ledger.epochs.frontier(subject)
        consumed = min((c.subject_epoch for c in consumers.values() if c.subject_epoch is not None), default=-1)
        lag = 0 if frontier is None else max(0, frontier - consumed)
        lag_s = 0.0
        if lag:
            try:
                oldest = self.ledger.epochs.committed(subject, consumed + 1)
            except EpochCollectedError as exc:  # a consumer that read nothing yet; retention took the first epochs
                lag = max(0, (frontier or 0) - exc.first_retained + 1)
                oldest = self.ledger.epochs.committed(subject, exc.first_retained)
            lag_s = max(0.0, (now_ms() - oldest.committed_at) / 1000)
        modes = sorted({c.mode for c in consumers.values()})
        since = [c.waiting_since for c in consumers.values() if c.waiting_since is not None]
        waiting = round(max(0.0, (now_ms() - min(since)) / 1000), 1) if since else None
        return {"subject": subject, "state": state.state.value, "mode": ",".join(modes) or "-",
                "subject_epoch": state.subject_epoch, "job_epoch": state.job_epoch,
                "consumers": len(consumers), "lag_epochs": lag, "lag_seconds": round(lag_s, 3),
                "last_committed": frontier, "waiting_seconds": waiting}

    def status(self, job: str) -> dict[str, Any]:
        node = self.jobs.job(job)
        decision, _ = self.jobs.decision(job)
        swap, _ = self.jobs.swap(job)
        row = {"job": job, "version": node.version, "output": node.output, "parallelism": node.parallelism,
               "decision": decision.phase if decision else None,
               "swapped_to": swap.new if swap is not None and swap.old == job and swap.phase == "done" else None}
        if row["swapped_to"] is not None and not self.jobs.has_sources(job):
            # Retention removed the swapped-out version's source state: nothing to report but that.
            row["sources"] = [{"subject": s, "state": "swapped out", "mode": "-", "subject_epoch": None,
                               "job_epoch": None, "consumers": 0, "lag_epochs": 0, "lag_seconds": 0.0,
                               "last_committed": self.ledger.epochs.frontier(s), "waiting_seconds": None}
                              for s in node.inputs]
        else:
            row["sources"] = [self.source_status(job, s) for s in node.inputs]
        return row

    # ---- protocol -----------------------------------------------------------------------------

    def _subjects(self, job: str, subjects: Sequence[str] | None) -> tuple[str, ...]:
        node = self.jobs.job(job)
        if node.follows is not None:
            raise AlignerError(f"job {job!r} runs as the new version of {node.follows!r}: it is aligned by following "
                               f"its epochs and is never aligned or aborted itself (align or abort {node.follows!r})")
        chosen = tuple(subjects or node.inputs)
        unknown = [s for s in chosen if s not in node.inputs]
        if unknown:
            raise AlignerError(f"job {job!r} does not read {unknown}; it reads {list(node.inputs)}")
        return chosen

    def _send(self, job: str, subjects: Sequence[str], command: Command) -> None:
        """Write the command to each source unless it already carries this seq (resume)."""
        for s in subjects:
            current, version = self.jobs.command(job, s)
            if current.seq < command.seq:
                self.jobs.send(job, s, command, version)

    def _wait(self, what: str, cond: Callable[[], bool], timeout: float | None, progress: Progress | None,
              job: str, subjects: Sequence[str]) -> None:
        def show() -> None:
            if progress:
                progress(what, {s: self.source_status(job, s) for s in subjects})

        self.watch_job(job, subjects)
        self.waiter.until(cond, f"job {job}: {what}", timeout, show)

    def align(self, job: str, subjects: Sequence[str] | None = None, at_epoch: int | None = None,
              timeout: float | None = None, progress: Progress | None = None) -> AlignmentDecision:
        """Align the job's sources; waits as long as the job takes unless ``timeout`` (seconds).

        Should the consumers end up split (one started J under an Align the others rejected as too
        late), the alignment is aborted, nothing lost, and run again."""
        with self.waiter.within(timeout):
            while True:
                try:
                    return self._align(job, subjects, at_epoch, timeout, progress)
                except AlignmentSplitError as exc:
                    log.warning("job %s: %s; aborting the alignment and aligning again", job, exc)
                    self.abort(job, timeout, progress, realign=True)

    def _align(self, job: str, subjects: Sequence[str] | None, at_epoch: int | None, timeout: float | None,
               progress: Progress | None) -> AlignmentDecision:
        """One loop: observe the decision, let :func:`aligner.decision.step` choose, persist or wait."""
        chosen = self._subjects(job, subjects)
        while True:
            seen, version = self.observe(job, chosen)
            step = machine.step(seen)
            decision = seen.decision
            if step is Next.DONE:
                assert decision is not None
                return decision
            if step is Next.BLOCKED:
                raise AlignerError(f"job {job!r} is being aborted; run `aligner abort {job}` to finish it first")
            if step is Next.REALIGN:
                states = {s: self.jobs.source_state(job, s) for s in chosen}
                raise AlignmentSplitError("sources aligned at different points: " + ", ".join(
                    f"{s} {st.state.value} at job epoch {st.job_epoch}" for s, st in states.items()))
            if step is Next.FINISH_ABORT:  # a split's abort, whose coordinator died: finish it, align again
                self.abort(job, timeout, progress)
                continue
            if step is Next.AWAIT_READY or step is Next.AWAIT_ALIGNED:
                assert decision is not None
                self._send_decision(job, chosen, decision)
                self._await(step, job, chosen, decision, timeout, progress)
            elif step is Next.FROM_START:
                seq = decision.seq if machine.current(decision, chosen) else self._next_seq(job, chosen)  # type: ignore[union-attr]
                return self._record_from_start(job, chosen, seq, version)
            elif step is Next.START:
                self.jobs.decide(AlignmentDecision(job=job, subjects=chosen, phase=DecisionPhase.CATCHING_UP,
                                                   seq=self._next_seq(job, chosen)), version)
            elif step is Next.CHOOSE:
                assert decision is not None
                self._choose(job, chosen, decision, version, at_epoch)
            else:  # RECORD_ALIGNED, at the (k, J) the sources are aligned at
                assert decision is not None
                states = {s: self.jobs.source_state(job, s) for s in chosen}
                decision = decision.model_copy(update={
                    "phase": DecisionPhase.ALIGNED, "updated_at": now_ms(),
                    "job_epoch": next(iter(states.values())).job_epoch,
                    "subject_epochs": {**decision.subject_epochs, **{
                        s: st.subject_epoch for s, st in states.items() if st.subject_epoch is not None}}})
                self.jobs.decide(decision, version)
                return decision

    def observe(self, job: str, subjects: tuple[str, ...]) -> tuple[machine.Observed, int]:
        """Read the decision node and what its phase's next step depends on (and the node's version)."""
        decision, version = self.jobs.decision(job)
        need = machine.needs(decision, subjects)
        return machine.Observed(
            decision=decision, subjects=subjects,
            sources_aligned=aligned_together(self.jobs.source_state(job, s) for s in subjects)
            if "sources_aligned" in need else None,
            from_start=self._aligned_from_start(job, subjects) if "from_start" in need else None,
            ready=all(self.jobs.source_state(job, s).state in (State.READY, State.ALIGNING, State.ALIGNED)
                      for s in subjects) if "ready" in need else None,
            settled=self._settled(job, subjects, decision) if "settled" in need and decision is not None else None,
        ), version

    def _next_seq(self, job: str, subjects: Sequence[str]) -> int:
        return max(self.jobs.command(job, s)[0].seq for s in subjects) + 1

    def _send_decision(self, job: str, subjects: Sequence[str], decision: AlignmentDecision) -> None:
        """The command the decision's phase implies, to every source that lacks it."""
        if decision.phase == DecisionPhase.CATCHING_UP:
            self._send(job, subjects, Command(seq=decision.seq, kind="catch_up"))
            return
        cmd = Command(seq=decision.seq, kind="align", job_epoch=decision.job_epoch)
        for s in subjects:
            self._send(job, [s], cmd.model_copy(update={"subject_epoch": decision.subject_epochs[s]}))

    def _await(self, step: Next, job: str, subjects: tuple[str, ...], decision: AlignmentDecision,
               timeout: float | None, progress: Progress | None) -> None:
        """Wait (woken by the consumers' reports) until the next step is another one."""
        what = "catching up" if step is Next.AWAIT_READY else f"alignment at job epoch {decision.job_epoch}"
        self._wait(what, lambda: machine.step(self.observe(job, subjects)[0]) is not step, timeout, progress,
                   job, subjects)

    def _aligned_from_start(self, job: str, subjects: Sequence[str]) -> bool:
        """Every source aligned with no alignment point: the job is aligned by construction (a Spark
        query, whose offsets are epoch vectors; a new version following its old one's epochs), so
        there is nothing to align and no command it would answer."""
        return all(st.state is State.ALIGNED and st.job_epoch is None
                   for st in (self.jobs.source_state(job, s) for s in subjects))

    def _record_from_start(self, job: str, subjects: Sequence[str], seq: int, version: int) -> AlignmentDecision:
        """Record the decision of a job aligned by construction: its first job epoch and where it starts."""
        line = self.jobs.epoch_line(job)
        number = self.jobs.first_job_epoch(line)
        first = self.jobs.job_epoch(line, number) if number is not None else None
        starts = {} if first is None else {s: (span.first if span is not None else first.next[s])
                                           for s, span in first.covered.items() if s in subjects}
        decision = AlignmentDecision(job=job, subjects=tuple(subjects), phase=DecisionPhase.ALIGNED, seq=seq,
                                     job_epoch=first.epoch if first is not None else None, subject_epochs=starts)
        self.jobs.decide(decision, version)
        return decision

    def _choose(self, job: str, subjects: Sequence[str], decision: AlignmentDecision, version: int,
                at_epoch: int | None) -> tuple[AlignmentDecision, int]:
        """Pick k in the future of every subject and J in the future of every consumer; record it."""
        epochs = {}
        for s in subjects:
            frontier = self.ledger.epochs.frontier(s)
            k = (frontier if frontier is not None else -1) + 2
            epochs[s] = max(k, at_epoch) if at_epoch is not None else k
        committed = [c.job_epoch for s in subjects for c in self.jobs.consumers(job, s).values()
                     if c.job_epoch is not None]
        sink_epochs = self.ledger.subjects.epoch_numbers(self.jobs.job(job).output)
        base = max([*committed, sink_epochs[-1] if sink_epochs else 0])
        decision = decision.model_copy(update={
            "phase": DecisionPhase.ALIGNING, "seq": decision.seq + 1, "subject_epochs": epochs,
            "job_epoch": base + self.margin, "updated_at": now_ms()})
        return decision, self.jobs.decide(decision, version)

    def _settled(self, job: str, subjects: Sequence[str], decision: AlignmentDecision) -> Settled | None:
        rejected = any(c.rejected_seq == decision.seq for s in subjects for c in self.jobs.consumers(job, s).values())
        return machine.settle(decision, [self.jobs.source_state(job, s) for s in subjects], rejected)

    def abort(self, job: str, timeout: float | None = None, progress: Progress | None = None,
              realign: bool = False) -> AlignmentDecision:
        """Return every source of the job to Unaligned, from any state, and clean up the decision.
        ``realign``: the coordinator's own abort of a split alignment, which the next align finishes."""
        subjects = self._subjects(job, None)
        recorded, version = self.jobs.decision(job)
        if recorded is not None and recorded.phase == DecisionPhase.ABORTING:
            aborting = recorded
        else:
            aborting = AlignmentDecision(job=job, subjects=subjects, phase=DecisionPhase.ABORTING,
                                         seq=self._next_seq(job, subjects), realign=realign)
            version = self.jobs.decide(aborting, version)
        self._send(job, subjects, Command(seq=aborting.seq, kind="abort"))
        self._wait("aborting", lambda: all(
            c.alignment.state is State.UNALIGNED and c.alignment.applied_seq >= aborting.seq
            for s in subjects for c in self.jobs.consumers(job, s).values()), timeout, progress, job, subjects)
        aborted = aborting.model_copy(update={"phase": DecisionPhase.ABORTED, "updated_at": now_ms()})
        self.jobs.decide(aborted, version)
        return aborted
