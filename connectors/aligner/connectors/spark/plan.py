"""A Spark sink's micro-batch as the driver plans it: its slots (ledger producers), their leases, the sink's
progress and the subject's writers, read once: when Spark builds the writer it pickles to the batch's tasks.

The plan travels pickled to the write tasks (they stamp and write from it, making no ZooKeeper request) and
back to the driver inside their commit messages, so the batch's commit (:mod:`aligner.connectors.spark.commit`)
is one multi-op that reads nothing the plan knew: the multi-op's version checks fence whatever changed since.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aligner.connectors.kafka import end_offsets
from aligner.connectors.sink import partitions_for
from aligner.connectors.spark.common import AlignedOptionError, Connection, bool_option, int_option
from aligner.connectors.spark.job_node import job_of, output_partitions, swap_in, wait_target
from aligner.connectors.spark.models import SparkProgressNode
from aligner.errors import AlignerError
from aligner.layout import writer_id
from aligner.ledger import Lease, Ledger
from aligner.models import EpochNode, JobNode, Phase, ProducerNode, SwapNode, WritersNode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkSpec:
    conn: Connection
    sink: str
    producers: int
    job: str | None = None
    """Run as this registered aligned job (:mod:`aligner.connectors.spark.job`): the sink id is the job id."""
    settle_heap: bool = False
    """Option ``settleHeap``: :func:`aligner.connectors.spark.common.settle_spark_heap` in Spark's processes."""

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkSpec:
        """The sink's options as Spark passes them (case-insensitive keys)."""
        conn = Connection.from_options(options)
        job = options.get("job") or None
        sink = options.get("sinkId") or job
        if not sink:
            raise AlignedOptionError("writeStream.format('aligned') needs option sinkId (stable across restarts)")
        if job is not None and sink != job:
            raise AlignedOptionError(f"a query running as job {job!r} writes through sink {job!r}, not "
                                     f"sinkId={sink!r} (leave sinkId out)")
        if job is not None and options.get("producers"):
            raise AlignedOptionError("a query running as a job has one producer per output partition of its "
                                     "registration; leave option producers out")
        producers = int_option(options, "producers", 0, minimum=1) if options.get("producers") else 0
        return cls(conn, sink, producers or 0, job, bool_option(options, "settleHeap"))


@dataclass(frozen=True)
class BatchPlan:
    """What the driver read when it built the writer of a micro-batch's tasks; the tasks and the commit use it
    as read."""

    leases: tuple[Lease, ...]
    """Slot i's lease: its next epoch (the batch's epoch), partitions and offsets, and node version."""
    writers: tuple[WritersNode, int] | None
    """The subject's writers document and version: the commit makes the epoch node against it (None: the
    epoch node was there when the batch was planned, made when the slots were claimed)."""
    progress: SparkProgressNode | None
    progress_version: int
    """The sink's Spark progress and its version (-1: no node yet): a re-run batch is recognised by it."""
    topic: str
    node: JobNode | None = None
    swap: SwapNode | None = None
    """A job's query: its registration and the swap that hands it the target, as planned. The planner
    never lets a batch run across S, nor past it before the swap committed, so a decision taken from
    this swap is the planner's."""

    @property
    def epoch(self) -> int:
        epochs = {lease.next_epoch for lease in self.leases}
        if len(epochs) != 1:
            raise AlignerError(f"producers of {self.leases[0].subject!r} disagree on the next epoch {sorted(epochs)}")
        return epochs.pop()


def read_progress(ledger: Ledger, subject: str, sink: str) -> tuple[SparkProgressNode | None, int]:
    """The sink's Spark progress and its node version: (None, -1) without a node, (None, version)
    for the empty node created before the first batch commits."""
    return ledger.read_optional(SparkProgressNode, ledger.layout.spark_progress(subject, sink))


def load_slots(ledger: Ledger, subject: str, sink: str, slots: range | list[int],
               writers: WritersNode | None = None) -> list[Lease]:
    """The current lease of the given slots, read from ZooKeeper (no new incarnation)."""
    doc = writers if writers is not None else ledger.subjects.writers(subject)[0]
    leases = []
    for i in slots:
        entry = doc.writers.get(writer_id(sink, str(i)))
        if entry is None:
            raise AlignerError(f"sink {sink!r} of subject {subject!r} has no producer {i}; it was not opened")
        node, version = ledger.read(ProducerNode, ledger.layout.producer(subject, sink, str(i)))
        leases.append(Lease(subject, node, version, entry.first_epoch))
    return leases


def open_slots(ledger: Ledger, kafka: str, subject: str, sink: str, n: int,
               partitions: Sequence[int] | None = None, not_before: int = 0, hands_over: bool = False) -> list[Lease]:
    """Claim the sink's N slots when missing and bring them to a common next epoch; idempotent.
    The slots share ``partitions`` of the subject (default: all of them); new ones write from the
    subject's next epoch, or ``not_before`` when later. ``hands_over``: a new version's slots, claimed
    holding no partition until its swap hands them the old version's (:func:`take_over_slots`)."""
    meta = ledger.subjects.subject(subject)
    shared = list(partitions) if partitions is not None else list(range(meta.partitions))
    if n > len(shared):
        raise AlignedOptionError(f"producers={n} but subject {subject!r} has only {len(shared)} partitions "
                                 "for this sink")
    writers, _ = ledger.subjects.writers(subject)
    mine = sorted(int(w.split(":", 1)[1]) for w in writers.writers if w.split(":", 1)[0] == sink
                  and w.split(":", 1)[1].isdigit())
    if mine and mine[-1] >= n:
        raise AlignedOptionError(
            f"sink {sink!r} of subject {subject!r} already has {mine[-1] + 1} producers; it cannot write with "
            f"producers={n} (use the same producers option or a new sinkId)"
        )
    missing = {str(i): [] if hands_over else [shared[j] for j in partitions_for(i, n, len(shared))]
               for i in range(n) if i not in mine}
    if missing:  # together: every slot from one first epoch
        ledger.claims.claim_producers(subject, sink, missing,
                                      lambda parts: end_offsets(kafka, meta.topic, parts, committed_only=False),
                                      not_before)
    leases = load_slots(ledger, subject, sink, range(n), None if missing else writers)  # claimed now: read again
    target = max(lease.next_epoch for lease in leases)
    # An epoch only some slots were expected to write: the others close it empty.
    return [ledger.commits.close_empty(lease, target) for lease in leases]


def take_over_slots(ledger: Ledger, kafka: str, node: JobNode, swap: SwapNode | None,
                    leases: list[Lease]) -> list[Lease]:
    """A new version's sink at its first writing epoch S+1 (the driver plans a writer per micro-batch, after
    the previous batch committed S): once S is committed at the target, slot i takes partitions
    ``partitions_for(i, N, P)`` over from the old version (:meth:`aligner.ledger.Ledger.take_over`).
    Any other time it returns ``leases`` as they are."""
    if (not node.hands_over or swap is None or swap.phase not in (Phase.COMMIT, Phase.DONE)
            or any(lease.node.partitions for lease in leases)
            or any(lease.next_epoch != swap.epoch + 1 for lease in leases)):
        return leases
    assert node.follows is not None
    wait_target(ledger, node, swap)
    meta = ledger.subjects.subject(node.output)

    def starts(parts: Sequence[int]) -> Mapping[int, int]:
        return end_offsets(kafka, meta.topic, parts, committed_only=False)

    taken = [ledger.claims.take_over(lease, partitions_for(i, len(leases), meta.partitions), node.follows,
                                     swap.epoch, starts)
             for i, lease in enumerate(leases)]
    log.info("job %s: took partitions of %r over from %s after epoch %d", node.job, node.output, node.follows,
             swap.epoch)
    return taken


def plan_batch(ledger: Ledger, spec: SinkSpec) -> BatchPlan:
    """Claim the slots (and, for a job, take the old version's over at a swap) for the next micro-batch,
    and read what its commit checks against."""
    conn = spec.conn
    # The previous micro-batch was committed by another Python worker's session: without a sync this one's
    # server may still be behind it (a follower cut from its leader serves its old state for seconds), and
    # the batch would be planned on the sink's previous epoch, which its commit then refuses.
    ledger.sync()
    topic = ledger.subjects.subject(conn.subject).topic
    node = swap = None
    if spec.job is not None:
        node = job_of(ledger, spec.job)
        if node.output != conn.subject:
            raise AlignedOptionError(f"job {node.job!r} is registered writing {node.output!r}, not {conn.subject!r}")
        parts = output_partitions(ledger, node)
        swap = swap_in(ledger, node)
        leases = open_slots(ledger, conn.kafka, node.output, node.job, len(parts), parts,
                            hands_over=node.hands_over)  # sink id = job id
        leases = take_over_slots(ledger, conn.kafka, node, swap, leases)
    else:
        leases = open_slots(ledger, conn.kafka, conn.subject, spec.sink, spec.producers or
                            ledger.subjects.subject(conn.subject).partitions)
    epoch = max(lease.next_epoch for lease in leases)
    made = ledger.read_optional(EpochNode, ledger.layout.epoch(conn.subject, epoch))[1] >= 0
    writers = None if made else ledger.subjects.writers(conn.subject)
    progress, version = read_progress(ledger, conn.subject, spec.sink)
    return BatchPlan(tuple(leases), writers, progress, version, topic, node, swap)
