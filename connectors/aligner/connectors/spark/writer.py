"""Aligned streaming writes: ``df.writeStream.format("aligned")``; every micro-batch is one subject epoch.

Options: ``zk``, ``kafka``, ``root``, ``subject`` (the target), ``sinkId`` (the sink's id in the
ledger, stable across restarts of the query) and ``producers`` (default: the subject's partition
count). ``settleHeap`` (default false): see :func:`aligner.connectors.spark.common.settle_spark_heap`.
A test injects faults through :class:`SinkHook` (a data source of its own whose writer carries one), not
through options.

Input: a ``value`` column (binary or string) and optionally ``key``; without a ``value`` column
every row is written as a JSON object of its columns (timestamps as epoch milliseconds,
binary as base64), which is what a JSON subject's readers parse.

Why it is exact
---------------
A committed epoch names, per ledger producer, one attempt; readers keep a record of a producer's
partitions only when its stamp carries that attempt. So every subject partition must be written, in
one epoch, by exactly one *successful* task attempt, and every task attempt must stamp differently:

* The sink has ``producers`` = N ledger producers ("slots"); slot i privately owns the subject
  partitions ``partitions_for(i, N, P)``. The driver claims the slots once (and first closes, with
  empty contributions, any epoch that only some slots were expected to write, so all slots start
  on the same epoch).
* The Spark task with partition id i writes slot i, and only slot i. A write stage with more than N
  tasks fails at once with an error asking to ``repartition`` (or raise ``producers``).
* Every task attempt draws a fresh 62-bit random attempt number and stamps its records
  (sink, epoch, attempt); the epoch is the slot's next epoch in ZooKeeper. It writes in one Kafka
  transaction (transactional id per slot, so a retry fences its predecessor) and reports
  (slot, epoch, attempt, last offset per partition, query id) in its commit message. Failed,
  retried or speculative attempts leave records whose attempt nobody names: readers drop them,
  even on a broker that shows aborted transactions (Tansu).
* The driver's ``commit`` writes the epoch in ZooKeeper in **one multi-op**, through the ledger's
  ``commit_epoch`` like every sink: for every slot the producer node (compare-and-set on its
  version: zombies are fenced) and its contribution (the reported attempt, ranges and counts; an
  empty range for a slot without a task), plus the sink's Spark progress node (last query id,
  batch id, epoch), compare-and-set (or created, for the first batch), and the epoch's lineage node
  ``spark/epochs/{epoch}`` -> (query id, batch id). Either the whole batch is one committed epoch or
  nothing is.
* A batch that Spark runs again after a restart (its epoch committed in ZooKeeper but not yet in
  Spark's commit log) finds its (query id, batch id) in the progress node: the driver commits
  nothing, and the re-run's records, stamped for the next epoch with attempts nobody names, are
  dropped by readers. A batch whose ZooKeeper commit never happened is simply written again.

A task attempt writes through :class:`aligner.connectors.stamped.StampedProducer`, the Kafka half
every sink shares (producer settings, partition choice, delivery reports, stamps, broker retries).
Kafka transactions are the pre-commit; ZooKeeper is the commit point. Plain read_committed Kafka
consumers see the records of every task attempt that committed its transaction; aligned readers
see each record once.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from aligner.connectors.kafka import end_offsets, transactional_id
from aligner.connectors.sink import partitions_for
from aligner.connectors.spark.common import (
    AlignedOptionError,
    Connection,
    batch_job_span,
    bool_option,
    int_option,
    ledger_for,
    opt,
    settle_spark_heap,
)
from aligner.connectors.spark.job_node import (
    awaits,
    batch_writes,
    job_of,
    output_partitions,
    report,
    swap_in,
    wait_target,
)
from aligner.connectors.spark.lineage import source_batch
from aligner.connectors.spark.models import SparkProgressNode, SparkSinkEpochNode
from aligner.connectors.stamped import StampedProducer, epoch_ranges
from aligner.errors import AlignerError
from aligner.layout import writer_id
from aligner.ledger import Contribution, Lease, Ledger
from aligner.models import JobNode, Phase, ProducerNode, Range, SwapNode
from aligner.recipes.spark import SparkBatchRecipes
from aligner.stamps import Stamp

log = logging.getLogger(__name__)


@dataclass
class SlotCommit(WriterCommitMessage):
    """What one successful task attempt wrote."""

    slot: int
    epoch: int | None
    attempt: int | None
    last: dict[int, int] = field(default_factory=dict)
    records: int = 0
    query: str | None = None
    counts: dict[int, int] = field(default_factory=dict)
    """Records written per partition: readers skip stamp checks where a range holds nothing else."""
    shadow: bool = False
    """Written to the job's shadow subject (a voided batch of a new version in shadow mode)."""


def read_progress(ledger: Ledger, subject: str, sink: str) -> tuple[SparkProgressNode | None, int]:
    """The sink's Spark progress and its node version: (None, -1) without a node, (None, version)
    for the empty node created before the first batch commits."""
    return ledger.read_optional(SparkProgressNode, ledger.layout.spark_progress(subject, sink))


# ---- slots (ledger producers of the sink) ---------------------------------------------------------


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
        conn = Connection.from_options(options)
        job = opt(options, "job") or None
        sink = opt(options, "sinkId") or job
        if not sink:
            raise AlignedOptionError("writeStream.format('aligned') needs option sinkId (stable across restarts)")
        if job is not None and sink != job:
            raise AlignedOptionError(f"a query running as job {job!r} writes through sink {job!r}, not "
                                     f"sinkId={sink!r} (leave sinkId out)")
        if job is not None and opt(options, "producers"):
            raise AlignedOptionError("a query running as a job has one producer per output partition of its "
                                     "registration; leave option producers out")
        producers = int_option(options, "producers", 0, minimum=1) if opt(options, "producers") else 0
        return cls(conn, sink, producers or 0, job, bool_option(options, "settleHeap"))


def load_slots(ledger: Ledger, subject: str, sink: str, slots: range | list[int]) -> list[Lease]:
    """The current lease of the given slots, read from ZooKeeper (no new incarnation)."""
    writers, _ = ledger.subjects.writers(subject)
    leases = []
    for i in slots:
        entry = writers.writers.get(writer_id(sink, str(i)))
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
                               lambda parts: end_offsets(kafka, meta.topic, parts, committed_only=False), not_before)
    leases = load_slots(ledger, subject, sink, range(n))
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


def commit_batch(ledger: Ledger, spec: SinkSpec, n: int, messages: list[Any], batch_id: int,
                 job_epoch: int | None = None) -> int | None:
    """The driver's commit of one micro-batch as one epoch: one ZooKeeper multi-op. Returns the epoch,
    or None when this (query, batch) was committed before (a re-run after a restart)."""
    subject, sink = spec.conn.subject, spec.sink
    msgs = [m for m in messages if isinstance(m, SlotCommit)]
    query = next((m.query for m in msgs if m.query), None)
    progress, progress_version = read_progress(ledger, subject, sink)
    if progress is not None and progress.query == query and batch_id <= progress.batch:
        return None
    leases = load_slots(ledger, subject, sink, range(n))
    epochs = {lease.next_epoch for lease in leases}
    if len(epochs) != 1:
        raise AlignerError(f"sink {sink!r} of {subject!r}: producers disagree on the next epoch {sorted(epochs)}")
    epoch = epochs.pop()
    by_slot: dict[int, SlotCommit] = {}
    for m in msgs:
        if m.slot in by_slot:
            raise AlignerError(f"batch {batch_id}: two commit messages for producer {m.slot} of sink {sink!r}")
        if m.epoch is not None and m.epoch != epoch:
            raise AlignerError(
                f"batch {batch_id}: producer {m.slot} of sink {sink!r} stamped epoch {m.epoch} but the sink's next "
                f"epoch is {epoch}; another writer committed meanwhile, nothing was committed"
            )
        by_slot[m.slot] = m
    ledger.commits.ensure_epoch(subject, epoch)
    contributions = slot_contributions(leases, by_slot, batch_id)
    progress_node = SparkProgressNode(query=query, batch=batch_id, epoch=epoch, producers=n, job_epoch=job_epoch)
    lineage = SparkSinkEpochNode(query=query, batch=batch_id, epoch=epoch)
    SparkBatchRecipes(ledger, ledger.commits).commit_sink_batch(subject, sink, batch_id, epoch, contributions,
                                                                progress_node, progress_version, lineage)
    return epoch


def slot_contributions(leases: list[Lease], by_slot: dict[int, SlotCommit], batch_id: int) -> list[Contribution]:
    """Every slot's contribution to the epoch: what its task attempt wrote, or empty ranges (no task,
    or a task without rows)."""
    contributions = []
    for i, lease in enumerate(leases):
        m = by_slot.get(i)
        if m is None or m.attempt is None:
            ranges = {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()}
            contributions.append(Contribution(lease, 0, ranges))
            continue
        ranges = epoch_ranges(lease.node.next_offsets, m.last, m.counts, f"batch {batch_id} producer {i}")
        contributions.append(Contribution(lease, m.attempt, ranges, m.counts or None))
    return contributions


def source_read(ledger: Ledger, query: str | None, batch_id: int) -> bool:
    return bool(query) and bool(source_batch(ledger, query, batch_id))  # type: ignore[arg-type]


def job_span(ledger: Ledger, query: str | None, batch_id: int) -> tuple[tuple[int, int], dict[str, int]]:
    """The job epochs a micro-batch of a job's query covers (recorded by its read tasks), and the last
    subject epoch it read per subject."""
    read = source_batch(ledger, query, batch_id) if query else {}
    spans = {(r.job_first, r.job_last) for r in read.values() if r.job_first is not None and r.job_last is not None}
    if len(spans) != 1:
        raise AlignerError(f"micro-batch {batch_id} of query {query} recorded no job epochs ({sorted(spans)}): "
                           "read it with option job on the aligned source too")
    return spans.pop(), {s: r.last for s, r in read.items()}


def commit_job_batch(ledger: Ledger, spec: SinkSpec, n: int, messages: list[Any], batch_id: int) -> int | None:
    """The commit of a micro-batch of a query running as job ``spec.job``: its job epochs [a, b].

    Written (the old version, or the new one after the swap; then a == b): epoch b of the target,
    after S for the new version's S+1. Voided (the new version up to S): the target epochs from the
    producers' next one to b close empty, the last with the batch's progress, so a re-run after a
    restart is recognised; a batch entirely before the producers' first epoch records its progress only.
    Returns the target epoch it committed with the progress, or None."""
    subject, sink = spec.conn.subject, spec.sink
    node = job_of(ledger, spec.job or sink)
    msgs = [m for m in messages if isinstance(m, SlotCommit)]
    query = next((m.query for m in msgs if m.query), None)
    progress, progress_version = read_progress(ledger, subject, sink)
    if progress is not None and progress.query == query and batch_id <= progress.batch:
        return None
    if not source_read(ledger, query, batch_id) and not any(m.attempt is not None for m in msgs):
        log.info("job %s: micro-batch %d read no job epoch (a no-data batch); nothing to commit", node.job, batch_id)
        return None
    (first, last), read = job_span(ledger, query, batch_id)
    swap = swap_in(ledger, node)
    if batch_writes(node, swap, first):
        if first != last:
            raise AlignerError(f"micro-batch {batch_id} of job {node.job!r} writes job epochs {first}..{last}; "
                               "a written batch is one job epoch")
        if awaits(node, swap, first):
            assert swap is not None
            wait_target(ledger, node, swap)
        epoch = commit_batch(ledger, spec, n, messages, batch_id, job_epoch=last)
    else:
        if any(m.attempt is not None and not m.shadow for m in msgs):
            raise AlignerError(f"micro-batch {batch_id} of job {node.job!r} is voided but a task wrote records")
        shadow = _shadow_contributions(ledger, node.shadow, node.job, n, msgs, batch_id, last)
        epoch = _commit_void(ledger, spec, n, query, batch_id, (first, last), progress_version, shadow)
    report(ledger, node, job_epoch=last, subject_epoch=read)
    return epoch


def _shadow_contributions(ledger: Ledger, shadow: str | None, sink: str, n: int, msgs: list[SlotCommit],
                          batch_id: int, last: int) -> list[Contribution]:
    """A shadowing new version's voided batch: its records in the shadow subject, as epoch ``last``
    (the planner brought the shadow's producers there before the batch's tasks stamped)."""
    if shadow is None:
        return []
    leases = load_slots(ledger, shadow, sink, range(n))
    by_slot = {m.slot: m for m in msgs if m.shadow}
    if any(lease.next_epoch != last for lease in leases) or any(m.epoch != last for m in by_slot.values()):
        raise AlignerError(f"micro-batch {batch_id} of job {sink!r}: its shadow {shadow!r} is not at epoch {last} "
                           f"(producers at {sorted({lease.next_epoch for lease in leases})}); nothing was committed")
    ledger.commits.ensure_epoch(shadow, last)
    return slot_contributions(leases, by_slot, batch_id)


def _commit_void(ledger: Ledger, spec: SinkSpec, n: int, query: str | None, batch_id: int, span: tuple[int, int],
                 progress_version: int, shadow: list[Contribution]) -> int | None:
    subject, sink = spec.conn.subject, spec.sink
    first, last = span
    leases = load_slots(ledger, subject, sink, range(n))
    nxt = min(lease.next_epoch for lease in leases)
    progress = SparkProgressNode(query=query, batch=batch_id, epoch=last if nxt <= last else None, producers=n,
                                 job_epoch=last)
    empties: list[Contribution] = []
    if nxt <= last:
        leases = [ledger.commits.close_empty(lease, last) for lease in leases]
        ledger.commits.ensure_epoch(subject, last)
        empties = [Contribution(lease, None, {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()})
                   for lease in leases]
    # The micro-batch's record as the lineage of target epoch ``last`` only when the batch covers that job epoch
    # alone: a catch-up batch read the input of every job epoch it covers, not of ``last``'s (the job epoch
    # nodes hold each epoch's exact lineage). The progress alone when it closes nothing.
    lineage = SparkSinkEpochNode(query=query, batch=batch_id, epoch=last) if empties and first == last else None
    SparkBatchRecipes(ledger, ledger.commits).commit_sink_batch(subject, sink, batch_id, last, [*empties, *shadow],
                                                                progress, progress_version, lineage)
    return last if empties or shadow else None


# ---- executor side ------------------------------------------------------------------------------


class SinkHook:
    """Named points of the aligned sink where a test injects a fault (the sinks' ``FaultHook``, for Spark);
    this one does nothing. It travels pickled inside the writer to the tasks, so a test sets it on the writer
    its own data source (a subclass of :class:`aligner.connectors.spark.source.AlignedDataSource`) builds."""

    def task(self, point: str, ctx: Any, slot: int, out: _SlotWriter) -> None:
        """In a write task: "sent" after each Arrow batch is handed to the producer (``out.records`` so far),
        "write" with every record sent and the Kafka transaction open, "precommit" with the transaction
        committed and the commit message not yet returned."""

    def committed(self, batch: int, epoch: int) -> None:
        """On the driver, right after micro-batch ``batch`` was committed in ZooKeeper as ``epoch`` and before
        Spark's commit log records it."""


def _json_default(v: Any) -> Any:
    if isinstance(v, datetime):
        return int(v.timestamp() * 1000)
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if hasattr(v, "asDict"):
        return v.asDict(recursive=True)
    return str(v)


def _as_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


class AlignedStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.spec = SinkSpec.from_options(dict(options))
        self.hook = SinkHook()
        self.schema = schema
        names = schema.fieldNames()
        if "value" in names and not isinstance(schema["value"].dataType, (BinaryType, StringType)):
            raise AlignedOptionError("column value must be binary or string for format('aligned')")
        if "key" in names and not isinstance(schema["key"].dataType, (BinaryType, StringType)):
            raise AlignedOptionError("column key must be binary or string for format('aligned')")
        # Runs on the driver twice per micro-batch: Spark builds one writer for the batch's tasks and another
        # for its commit. Only the tasks' writer plans the batch (``__getstate__``, when it is pickled for
        # them): the slots' leases, the topic and the job's swap travel to the write tasks in this object, so a
        # write task makes no ZooKeeper request of its own, and the commit's writer opens no slot again.
        conn = self.spec.conn
        ledger = ledger_for(conn.zk, conn.root)
        self.node: JobNode | None = None
        self.swap: SwapNode | None = None
        self.leases: dict[int, Lease] = {}
        self._parts: Sequence[int] = ()
        meta = ledger.subjects.subject(conn.subject)
        self.topic = meta.topic
        if self.spec.job is not None:
            node = job_of(ledger, self.spec.job)
            if node.output != conn.subject:
                raise AlignedOptionError(f"job {node.job!r} is registered writing {node.output!r}, not "
                                         f"{conn.subject!r}")
            self._parts = output_partitions(ledger, node)
            self.producers = len(self._parts)
            self.node = node
        else:
            self.producers = self.spec.producers or meta.partitions
        self._planned = False

    def __getstate__(self) -> dict[str, Any]:
        if not self._planned:
            self._plan()
        return self.__dict__

    def _plan(self) -> None:
        """Claim the slots (and, for a job, take the old version's over at a swap) for this micro-batch."""
        conn = self.spec.conn
        ledger = ledger_for(conn.zk, conn.root)
        # The previous micro-batch was committed by another Python worker's session: without a sync this one's
        # server may still be behind it (a follower cut from its leader serves its old state for seconds), and
        # the batch would be planned on the sink's previous epoch, which its commit then refuses.
        ledger.sync()
        if self.node is not None:
            # The swap as planned: the planner never lets a batch run across S, nor past it before the swap
            # committed, so what the batch's tasks decide from it is what the commit decides.
            self.swap = swap_in(ledger, self.node)
            leases = open_slots(ledger, conn.kafka, self.node.output, self.node.job, len(self._parts), self._parts,
                                hands_over=self.node.hands_over)  # sink id = job id
            leases = take_over_slots(ledger, conn.kafka, self.node, self.swap, leases)
        else:
            leases = open_slots(ledger, conn.kafka, conn.subject, self.spec.sink, self.producers)
        self.leases = {int(lease.node.producer): lease for lease in leases}
        self._planned = True

    # ---- executors ----

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SlotCommit:
        from pyspark import TaskContext

        if self.spec.settle_heap:
            settle_spark_heap()
        if not self._planned:  # not pickled: called in the process that built it
            self._plan()
        ctx = TaskContext.get()
        slot = ctx.partitionId() if ctx is not None else 0
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        if slot >= self.producers:
            raise AlignerError(
                f"sink {self.spec.sink!r} has {self.producers} producers but the write stage has a task {slot}: "
                f"repartition the stream to at most {self.producers} partitions before writeStream, or use a "
                f"larger producers option"
            )
        out: _SlotWriter | None = None
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                if out is None and self.spec.job is not None:
                    voided, shadow = self._voided(ctx, query)
                    if voided and shadow is None:  # the new version before the swap: state advanced, output voided
                        for _ in iterator:
                            pass
                        return SlotCommit(slot=slot, epoch=None, attempt=None, query=query)
                    if voided and shadow is not None:  # ... in shadow mode: its output goes to the shadow subject
                        out = _SlotWriter(replace(self.spec, conn=replace(self.spec.conn, subject=shadow)), slot, True)
                if out is None:
                    out = _SlotWriter(self.spec, slot, lease=self.leases[slot], topic=self.topic)
                out.write(batch)
                self.hook.task("sent", ctx, slot, out)
            if out is None:
                return SlotCommit(slot=slot, epoch=None, attempt=None, query=query)
            self.hook.task("write", ctx, slot, out)
            message = out.finish(query)
            self.hook.task("precommit", ctx, slot, out)
            return message
        finally:
            if out is not None:
                out.close()  # a failed attempt's transaction is aborted, or fenced by the retry

    def _voided(self, ctx: Any, query: str | None) -> tuple[bool, str | None]:
        """A job's task: whether its micro-batch voids its output (decided as the driver's commit does; the
        batch's read tasks recorded its job epochs before any row reached this one), and the shadow
        subject that takes the voided output instead, if the job has one."""
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if batch is None:
            raise AlignerError(f"sink of job {self.spec.job!r} runs outside a streaming micro-batch")
        assert self.node is not None
        first, _ = batch_job_span(self.spec.conn, query, int(batch), lambda led: job_span(led, query, int(batch))[0])
        return not batch_writes(self.node, self.swap, first), self.node.shadow

    # ---- driver ----

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.spec.settle_heap:
            settle_spark_heap()
        conn = self.spec.conn
        ledger = ledger_for(conn.zk, conn.root)
        ledger.sync()  # the batch was planned by another session: read the sink as it is now (see _plan)
        if self.spec.job is not None:
            epoch = commit_job_batch(ledger, self.spec, self.producers, list(messages), batchId)
        else:
            epoch = commit_batch(ledger, self.spec, self.producers, list(messages), batchId)
        if epoch is not None:
            self.hook.committed(batchId, epoch)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: records of an uncommitted batch carry attempts ZooKeeper never names."""


class _SlotWriter:
    """One task attempt writing one slot: a stamped Kafka transaction, committed in ZooKeeper by the driver."""

    def __init__(self, spec: SinkSpec, slot: int, shadow: bool = False, lease: Lease | None = None,
                 topic: str | None = None) -> None:
        """``lease`` and ``topic`` as the driver read them for this micro-batch; a shadow subject's are read
        here (its slots are the shadow's, not the target's)."""
        self.shadow = shadow
        conn = spec.conn
        if lease is None or topic is None:
            ledger = ledger_for(conn.zk, conn.root)
            (lease,) = load_slots(ledger, conn.subject, spec.sink, [slot])
            topic = ledger.subjects.subject(conn.subject).topic
        self.subject = conn.subject
        self.lease = lease
        self.epoch = lease.next_epoch
        self.attempt = secrets.randbits(62) + 1
        self.slot = slot
        self.producer = StampedProducer(conn.kafka, transactional_id(conn.subject, spec.sink, str(slot)),
                                        conn.subject, lease.node.partitions, name=f"{slot} of sink {spec.sink!r}")
        self.producer.start({conn.subject: topic})  # fences an earlier attempt
        self.producer.begin_epoch(self.epoch, {conn.subject: Stamp(spec.sink, self.epoch, self.attempt)})

    @property
    def records(self) -> int:
        return sum(self.producer.counts.values())

    def flush(self, timeout: float = 30.0) -> None:
        """Deliver what was sent so far (the transaction stays open)."""
        self.producer.kp.flush(timeout)

    def write(self, batch: pa.RecordBatch) -> None:
        names = batch.schema.names
        keys = [_as_bytes(k) for k in batch.column("key").to_pylist()] if "key" in names else [None] * batch.num_rows
        if "value" in names:
            values = [_as_bytes(v) for v in batch.column("value").to_pylist()]
        else:
            rows = batch.drop_columns(["key"]).to_pylist() if "key" in names else batch.to_pylist()
            values = [json.dumps(r, default=_json_default, separators=(",", ":")).encode() for r in rows]
        send = self.producer.send
        for key, value in zip(keys, values, strict=True):
            send(value, key)

    def finish(self, query: str | None) -> SlotCommit:
        """The pre-commit: every record delivered, ranges checked, the Kafka transaction committed."""
        written = self.producer.flush_epoch({self.subject: self.lease.node.next_offsets})[self.subject]
        self.producer.commit_transaction()
        return SlotCommit(slot=self.slot, epoch=self.epoch, attempt=self.attempt, last=written.last,
                          records=written.records, query=query, counts=written.counts, shadow=self.shadow)

    def close(self) -> None:
        """Release the producer; an uncommitted transaction's records carry an attempt nobody names."""
        self.producer.close()
