"""A Spark Structured Streaming query as an aligned job: registration, batch planning, the swap gate.

A query runs as job ``J`` when its aligned source and sink both carry option ``job`` = J and J is
registered (:func:`register_query`: inputs, output, parallelism 1 = the driver, aligned mode,
``follows`` = the query it replaces). Then, like a runtime worker:

- every micro-batch is one job epoch E (or, for a new version before the swap, several consecutive
  ones), its output is epoch E of the target subject, and the subject epochs it covers are fixed in
  the ledger (the job epoch node) before the batch runs, so a follower ends on the same boundaries;
- the driver reports a consumer node per input (alignment ALIGNED: offsets are epoch vectors, so every
  batch ends on subject epoch boundaries; ``job_epoch``; ``swap_seen``), which ``aligner status`` and
  the coordinator's hot-swap read;
- the planner (``latestOffset``) runs the swap machine's gate for the next job epoch: it acknowledges
  S, plans no batch past S while S is only pre-committed, and after the commit the old version's sink
  finishes after S (the planner finishes its producers) while the new version writes from S+1;
- every version uses its first version's job epoch nodes (``JobLedger.epoch_line``), and a new version
  that was swapped in is gated like a first version by a swap of itself, so a query is upgraded again
  and again, to another query or to a runtime or Faust job;
- a new version (``follows``) starts on its own checkpoint, reads from a declared epoch (option
  ``startingEpoch``) or the start of retention, follows the old version's job epoch nodes (its batches
  end exactly on them, and never past S before the commit), voids its output up to S and never
  commits S+1 before the old version committed S at the target.

Offsets of a job's source (:class:`aligner.connectors.spark.offset.StreamOffset`):
``{"epochs": {subject: N}, "job": E, "first": F, "act": A}``: every subject epoch before N was read, E is the
next job epoch to plan, F the first job epoch of the batch that ended here (the batch covers job epochs
F .. E-1) and A the planner's decision for it (``write`` or ``void``), which its tasks and its commit follow.
A new version's first offset has no ``job``: its first batch rebuilds state from the start up to one of the
old version's job epoch boundaries.

:class:`AlignedQuery` is the driver-side companion: it stops the query once its sink finished (the
old version after a committed swap), so ``awaitTermination`` returns cleanly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import KazooException

from aligner import coverage, epoch_step
from aligner.connectors.spark.job_node import (
    awaits,
    batch_writes,
    job_of,
    output_partitions,
    register_query,
    report,
    swap_in,
    swap_out,
    wait_target,
)
from aligner.connectors.spark.offset import StreamOffset
from aligner.connectors.spark.plan import load_slots, open_slots
from aligner.connectors.subjects import ensure_shadow
from aligner.coverage import Next
from aligner.epoch_step import Act, Seen
from aligner.errors import AlignedOptionError, AlignerError
from aligner.layout import split_writer
from aligner.ledger import Lease, Ledger
from aligner.models import JobEpochNode, JobNode, SwapNode

__all__ = ["PAUSE", "STOP_GRACE", "AlignedQuery", "JobPlanner", "Planned", "awaits", "batch_writes", "job_of",
           "output_partitions", "register_query", "report", "shadow_slots", "sink_slots", "start_of", "stop_query",
           "swap_in", "swap_out", "wait_target"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Planned:
    """A planned batch: where it ends on each subject, the job epochs [first, last] it covers, and whether it
    writes its output (else it is voided)."""

    end: dict[str, int]
    first: int
    last: int
    writes: bool

    def offset(self) -> StreamOffset:
        """The batch's end offset, carrying the decision to its tasks and its commit."""
        return StreamOffset(epochs=self.end, job=self.last + 1, first=self.first,
                            act="write" if self.writes else "void")

STOP_GRACE = 3.0
"""Seconds a stop waits for the running micro-batch to end: within the 5 s a long-running component has."""

PAUSE = 0.5
"""Longest a planner call waits for the ledger (woken early by watches) before Spark asks again: short,
so ``query.stop()`` is never held up for long."""


def sink_slots(ledger: Ledger, kafka: str, node: JobNode) -> list[Lease]:
    """The job's sink producers (claimed the first time, idempotent): sink id = job id."""
    parts = output_partitions(ledger, node)
    return open_slots(ledger, kafka, node.output, node.job, len(parts), parts, hands_over=node.hands_over)


def shadow_slots(ledger: Ledger, kafka: str, node: JobNode, epoch: int) -> list[Lease]:
    """The producers of the job's shadow subject (shaped like its output, created the first time),
    brought to ``epoch``: the shadow's epoch E holds what the batch of job epoch E voided."""
    assert node.shadow is not None
    ensure_shadow(ledger, kafka, node.shadow, node.output)
    parts = output_partitions(ledger, node)
    leases = open_slots(ledger, kafka, node.shadow, node.job, len(parts), parts, not_before=epoch)
    return [ledger.commits.close_empty(lease, epoch) for lease in leases]


def start_of(node: JobEpochNode) -> dict[str, int]:
    """Where a job epoch starts on each subject (a subject it covers nothing of: where it stands)."""
    return {s: (span.first if span is not None else node.next[s]) for s, span in node.covered.items()}


class JobPlanner:
    """The driver-side planning of a query running as a job (called from ``latestOffset``)."""

    def __init__(self, ledger: Ledger, kafka: str, job: str, subjects: Sequence[str]) -> None:
        self.ledger = ledger
        self.kafka = kafka
        self.jobs = ledger.jobs
        self.node = job_of(ledger, job)
        if set(subjects) != set(self.node.inputs):
            raise AlignedOptionError(f"job {job!r} is registered reading {list(self.node.inputs)}, but the query "
                                     f"reads {list(subjects)}")
        self.new_version = self.node.follows is not None
        self.epochs_of = self.jobs.epoch_line(job)
        """Whose job epoch nodes the query uses: its first version's (every version covers the same input
        with the same job epochs)."""
        self._reported: Seen | None = None
        self._read_seen = False
        self._shadow_done = False

    # ---- planning -------------------------------------------------------------------------------

    def plan(self, start: dict[str, int], job: int | None, cap: int | None) -> Planned | None:
        """The next batch from ``start``: (end vector, first job epoch, last job epoch), or None for no
        batch now (nothing committed yet, or the swap gate holds it).

        The epoch step (:func:`aligner.epoch_step.step`) decides from both swaps: a new version follows
        and voids until S, then writes; a version that writes is gated by a swap of itself for a newer
        one (write until S', then finish), so a query can be upgraded again and again."""
        first = self._first(start, job)
        if first is None:
            return None
        decided = epoch_step.step(first, swap_in(self.ledger, self.node) if self.new_version else None,
                                  swap_out(self.ledger, self.node), self.new_version, self._seen())
        if decided.ack is not None:
            report(self.ledger, self.node, swap_seen=decided.ack)
            self._reported = decided.ack
        if decided.act is Act.WAIT:
            self._pause(swap_path=True)
            return None
        if decided.act is Act.VOID:
            return self._plan_void(start, job, first, decided.swap, cap)
        if self.node.shadow is not None and not self._shadow_done:
            self._finish_shadow()
        leases = sink_slots(self.ledger, self.kafka, self.node)
        if decided.act is Act.FINISH:
            assert decided.swap is not None
            self._finish(leases, decided.swap)
            return None
        covered = self._decide(first, start, cap)
        if covered is None:
            return None
        if not self.new_version:  # a new version's voided batches closed its producers up to S already
            self._ready(leases, first)
        return Planned(dict(covered.next), first, first, True)

    def _first(self, start: dict[str, int], job: int | None) -> int | None:
        """The batch's first job epoch: the checkpoint's; a new version's first batch, the old version's
        first job epoch from ``start``; a first version's first batch, its sink's first epoch."""
        if job is not None:
            return job
        if not self.new_version:
            return max(lease.next_epoch for lease in sink_slots(self.ledger, self.kafka, self.node))
        first = self._first_followed(start)
        if first is None:
            self._pause(subjects=start)
        return first

    def _seen(self) -> Seen | None:
        """The acknowledgement reported so far: read once (a restarted planner's stands), then kept. The
        first read also reports the query's consumer nodes (aligned from its first batch) if missing."""
        if not self._read_seen:
            current = self.jobs.consumers(self.node.job, self.node.inputs[0]).get(0)
            self._reported = current.swap_seen if current is not None else None
            report(self.ledger, self.node, swap_seen=self._reported)
            self._read_seen = True
        return self._reported

    def _plan_void(self, start: dict[str, int], job: int | None, first: int, swap: SwapNode | None,
                   cap: int | None) -> Planned | None:
        """A new version before the swap: its batches end on the old version's job epochs, never past S."""
        sink_slots(self.ledger, self.kafka, self.node)  # a writer of the target from its next epoch on
        node = self.jobs.job_epoch(self.epochs_of, first)
        if node is None:
            self._pause(path=self.ledger.layout.job_epoch(self.epochs_of, first))
            return None
        if job is not None:
            self._check_start(node, start)
            if self.node.shadow is not None:
                cap = 1  # after the catch-up batch, one job epoch per batch: the shadow compares epoch by epoch
        limit = epoch_step.void_limit(swap)
        last = first
        while (limit is None or last + 1 <= limit) and (cap is None or last + 1 - first < cap):
            following = self.jobs.job_epoch(self.epochs_of, last + 1)
            if following is None:
                break
            node, last = following, last + 1
        if self.node.shadow is not None:
            shadow_slots(self.ledger, self.kafka, self.node, last)  # the batch's tasks stamp shadow epoch ``last``
        return Planned(dict(node.next), first, last, False)

    def _finish_shadow(self) -> None:
        """After the swap the new version writes the target: its shadow ends where its voided output did."""
        writers, _ = self.ledger.subjects.writers(self.node.shadow)  # type: ignore[arg-type]
        if writers.writers:
            for lease in load_slots(self.ledger, self.node.shadow, self.node.job,  # type: ignore[arg-type]
                                    range(len(output_partitions(self.ledger, self.node)))):
                self.ledger.commits.finish(lease)
        self._shadow_done = True

    def _first_followed(self, start: dict[str, int]) -> int | None:
        """A new version's first job epoch: the old version's first one starting at or after ``start``."""
        for epoch in self.jobs.job_epoch_numbers(self.epochs_of):
            node = self.jobs.job_epoch(self.epochs_of, epoch)
            if node is not None and all(v >= start.get(s, 0) for s, v in start_of(node).items()):
                return epoch
        return None

    def _decide(self, job: int, start: dict[str, int], cap: int | None) -> JobEpochNode | None:
        """The coverage of job epoch ``job``: the recorded one, else every committed epoch from ``start``
        (at most ``cap`` per subject), fixed in the ledger before the batch runs."""
        existing = self.jobs.job_epoch(self.epochs_of, job)
        if existing is not None:
            self._check_start(existing, start)
            return existing
        frontier = {s: self.ledger.watches.frontier_watched(s) for s in start}
        per = coverage.catch_up_per(start, frontier, cap)
        decided = coverage.step(None, False, start, per, frontier, {s: None for s in start}) if per > 0 else None
        if decided is None or decided.next is not Next.DECIDE:
            self._pause(subjects=start)
            return None
        assert decided.coverage is not None
        return self.jobs.fix_job_epoch(self.epochs_of, job, decided.coverage.covered, decided.coverage.next)

    def _check_start(self, node: JobEpochNode, start: dict[str, int]) -> None:
        if start_of(node) != start:
            raise AlignerError(
                f"job epoch {node.epoch} of {self.epochs_of!r} starts at subject epochs {start_of(node)}, but query "
                f"{self.node.job!r} stands at {start}: its checkpoint does not belong to this job's epochs"
            )

    def _ready(self, leases: list[Lease], job: int) -> None:
        """The sink's producers must be at job epoch ``job`` when the batch's tasks stamp their records."""
        nxt = {lease.next_epoch for lease in leases}
        if max(nxt) > job:
            raise AlignerError(f"the sink of job {self.node.job!r} is at epoch {max(nxt)} but its query plans job "
                               f"epoch {job}: the checkpoint is older than the sink")
        if min(nxt) < job:
            for lease in leases:
                self.ledger.commits.close_empty(lease, job)

    def _finish(self, leases: list[Lease], swap: SwapNode) -> None:
        """The old version after the committed swap: its sink wrote S; finish its producers."""
        if any(lease.node.committed_epoch != swap.epoch for lease in leases):
            if any((lease.node.committed_epoch or -1) > swap.epoch for lease in leases):
                raise AlignerError(f"job {self.node.job!r} wrote past the swap epoch {swap.epoch}")
            self._pause(swap_path=True)  # batch S is being committed by a restarted driver
            return
        for lease in leases:
            self.ledger.commits.finish(lease)
        log.info("job %s: swapped out after epoch %d; its sink finished", self.node.job, swap.epoch)

    # ---- waits ----------------------------------------------------------------------------------

    def _pause(self, subjects: Mapping[str, int] | None = None, swap_path: bool = False,
               path: str | None = None) -> None:
        """Wait up to PAUSE for the ledger to change (watches), then let Spark ask again."""
        woken = threading.Event()
        try:
            for s, epoch in (subjects or {}).items():
                self.ledger.watches.arm_watch(s, epoch, woken)
            if swap_path:
                for job in filter(None, (self.node.follows, self.node.job)):
                    self.ledger.watches.watch_node(self.ledger.layout.swap(job), lambda _e: woken.set())
            if path is not None:
                self.ledger.watches.watch_node(path, lambda _e: woken.set())
        except KazooException as exc:  # a watch not set only shortens nothing: Spark asks again after PAUSE
            log.warning("job %s: a ledger watch could not be set (%s); planning again in %.1f s", self.node.job,
                        exc, PAUSE)
        woken.wait(PAUSE)


class AlignedQuery:
    """Driver side: runs a started query as job ``job`` until it ends, and stops it once its sink
    finished (the old version of a committed hot-swap), so ``awaitTermination`` returns cleanly."""

    def __init__(self, ledger: Ledger, query: Any, job: str) -> None:
        self.ledger = ledger
        self.query = query
        self.node = job_of(ledger, job)

    def finished(self) -> bool:
        doc, _ = self.ledger.subjects.writers(self.node.output)
        mine = [e for w, e in doc.writers.items() if split_writer(w)[0] == self.node.job]
        return bool(mine) and all(e.finished_after is not None for e in mine)

    def run(self, stop: threading.Event | None = None) -> bool:
        """Wait until the query ends; returns True when it was swapped out (stopped here)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            if self.query.awaitTermination(0.5):
                return False
            if self.finished():
                self.stop()
                return True
        self.stop()
        return False

    def stop(self, grace: float = STOP_GRACE) -> None:
        stop_query(self.query, grace)


def stop_query(query: Any, grace: float = STOP_GRACE) -> None:
    """Stop a streaming query between micro-batches when one ends within ``grace`` seconds: stopped in
    the middle of one, Spark interrupts its writer and logs abort errors (nothing is lost either way:
    an uncommitted batch's records carry an attempt ZooKeeper never names). For any aligned query."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            if not query.status.get("isTriggerActive", False):
                break
        except Exception:  # the query ended meanwhile
            break
        time.sleep(0.05)
    query.stop()


