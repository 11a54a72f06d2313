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
  partitions ``partitions_for(i, N, P)``. The driver plans each micro-batch once, when Spark builds the
  writer it pickles to the batch's tasks (:mod:`aligner.connectors.spark.plan`): it claims the slots the
  first time (and closes, with empty contributions, any epoch that only some slots were expected to
  write, so all slots start on the same epoch) and reads their leases, the subject's writers and the
  sink's progress. The plan travels to the tasks and back to the commit in their commit messages.
* The Spark task with partition id i writes slot i, and only slot i. A write stage with more than N
  tasks fails at once with an error asking to ``repartition`` (or raise ``producers``).
* Every task attempt draws a fresh 62-bit random attempt number and stamps its records
  (sink, epoch, attempt); the epoch is the slot's next epoch as planned. It writes in one Kafka
  transaction (transactional id per slot, so a retry fences its predecessor) and reports
  (slot, epoch, attempt, last offset per partition, query id) in its commit message. Failed,
  retried or speculative attempts leave records whose attempt nobody names: readers drop them,
  even on a broker that shows aborted transactions (Tansu).
* The driver's ``commit`` (:mod:`aligner.connectors.spark.commit`) writes the epoch in ZooKeeper in
  **one multi-op** and reads nothing the plan read: the epoch node (checked against the writers as
  planned), for every slot the producer node (compare-and-set on its version as planned: zombies are
  fenced) and its contribution (the reported attempt, ranges and counts; an
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
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import date, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from aligner.connectors.kafka import transactional_id
from aligner.connectors.spark.commit import BatchCommit, SlotCommit, commit_batch, commit_job_batch, job_span
from aligner.connectors.spark.common import (
    AlignedOptionError,
    batch_job_span,
    ledger_for,
    recalled_act,
    settle_spark_heap,
)
from aligner.connectors.spark.job_node import batch_writes
from aligner.connectors.spark.plan import (
    BatchPlan,
    SinkSpec,
    load_slots,
    open_slots,
    plan_batch,
    read_progress,
    take_over_slots,
)
from aligner.connectors.stamped import StampedProducer
from aligner.errors import AlignerError
from aligner.ledger import Lease
from aligner.stamps import Stamp

__all__ = ["AlignedStreamWriter", "BatchPlan", "SinkHook", "SinkSpec", "SlotCommit", "commit_batch",
           "commit_job_batch", "load_slots", "open_slots", "read_progress", "take_over_slots"]


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


def _column_bytes(batch: pa.RecordBatch, name: str) -> list[bytes | None]:
    """A binary or string column (the writer checked which) as Kafka bytes: a binary one as Arrow gives it."""
    column = batch.column(name)
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return column.to_pylist()
    return [None if v is None else v.encode() for v in column.to_pylist()]


class AlignedStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType, plan_now: bool = True) -> None:
        """Spark builds a writer on the driver twice per micro-batch: one it pickles to the batch's tasks and one
        for its commit; ``plan_now`` is the tasks' (the data source tells which:
        :meth:`aligner.connectors.spark.source.AlignedDataSource.streamWriter`). Both check the options here.
        The tasks' writer plans the batch here as well, not in pickling, where PySpark's serializer would turn a
        planning error (``producers`` beyond the subject's partitions, say) into a ``PicklingError``; the plan
        travels to the tasks and back in their commit messages, so a write task makes no ZooKeeper request of
        its own and the commit uses the plan the batch was written from. The commit's writer plans only when no
        message carries a plan, and a writer pickled unplanned plans first (:attr:`plan`)."""
        self.spec = SinkSpec.from_options(options)
        self.hook = SinkHook()
        self.schema = schema
        names = schema.fieldNames()
        if "value" in names and not isinstance(schema["value"].dataType, (BinaryType, StringType)):
            raise AlignedOptionError("column value must be binary or string for format('aligned')")
        if "key" in names and not isinstance(schema["key"].dataType, (BinaryType, StringType)):
            raise AlignedOptionError("column key must be binary or string for format('aligned')")
        self._plan: BatchPlan | None = self._read_plan() if plan_now else None

    def _read_plan(self) -> BatchPlan:
        conn = self.spec.conn
        return plan_batch(ledger_for(conn.zk, conn.root), self.spec)

    @property
    def plan(self) -> BatchPlan:
        """The micro-batch's plan, read from ZooKeeper on first use unless planned when built (its first read
        claims the slots: :func:`aligner.connectors.spark.plan.plan_batch`)."""
        if self._plan is None:
            self._plan = self._read_plan()
        return self._plan

    @property
    def producers(self) -> int:
        return len(self.plan.leases)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for the batch's tasks: never without the plan, so that no task plans on its own."""
        state = dict(self.__dict__)
        state["_plan"] = self.plan
        return state

    # ---- executors ----

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SlotCommit:
        from pyspark import TaskContext

        if self.spec.settle_heap:
            settle_spark_heap()
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
                if out is None:
                    out = self._slot_writer(ctx, query, slot)
                    if out is None:  # the new version before the swap: state advanced, output voided
                        for _ in iterator:
                            pass
                        break
                out.write(batch)
                self.hook.task("sent", ctx, slot, out)
            if out is None:
                return SlotCommit(slot=slot, epoch=None, attempt=None, query=query, plan=self.plan)
            self.hook.task("write", ctx, slot, out)
            message = out.finish(query, self.plan)
            self.hook.task("precommit", ctx, slot, out)
            return message
        finally:
            if out is not None:
                out.close()  # a failed attempt's transaction is aborted, or fenced by the retry

    def _slot_writer(self, ctx: Any, query: str | None, slot: int) -> _SlotWriter | None:
        """The writer of this task's slot; a job's voided batch: None, or its shadow subject's writer."""
        if self.spec.job is not None and not self._writes(ctx, query):
            node = self.plan.node
            assert node is not None
            if node.shadow is None:
                return None
            return _SlotWriter(replace(self.spec, conn=replace(self.spec.conn, subject=node.shadow)), slot, True)
        return _SlotWriter(self.spec, slot, lease=self.plan.leases[slot], topic=self.plan.topic)

    def _writes(self, ctx: Any, query: str | None) -> bool:
        """A job's task: whether its micro-batch writes its output, as the planner decided it (the act its
        offset carries, which this process's read task of the batch remembered), else from the batch's job
        epochs (recorded by its read tasks before any row reached this one) and the swap as planned."""
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if batch is None:
            raise AlignerError(f"sink of job {self.spec.job!r} runs outside a streaming micro-batch")
        act = recalled_act(self.spec.conn, query, int(batch))
        if act is not None:
            return act
        assert self.plan.node is not None

        def lookup(ledger: Any) -> tuple[int, int]:
            found = job_span(ledger, query, int(batch))
            if found is None:
                raise AlignerError(f"micro-batch {batch} of query {query} recorded no job epochs: read it with "
                                   "option job on the aligned source too")
            return found[0]

        first, _ = batch_job_span(self.spec.conn, query, int(batch), lookup)
        return batch_writes(self.plan.node, self.plan.swap, first)

    # ---- driver ----

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """One ledger recipe call from the plan the batch's tasks carried back (see :mod:`.commit`); this
        writer plans the batch only when no task carried one."""
        if self.spec.settle_heap:
            settle_spark_heap()
        conn = self.spec.conn
        ledger = ledger_for(conn.zk, conn.root)
        commit = BatchCommit.of(self.spec, messages, batchId, lambda: self.plan)
        epoch = commit_job_batch(ledger, commit) if self.spec.job is not None else commit_batch(ledger, commit)
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
        """One Arrow batch of the task's rows, sent as one ``send_many`` (the lane's batch form: a row's key picks
        its partition as ``send`` would, unkeyed rows go in one run per partition)."""
        names = batch.schema.names
        keys = _column_bytes(batch, "key") if "key" in names else [None] * batch.num_rows
        if "value" in names:
            values = _column_bytes(batch, "value")
        else:
            rows = batch.drop_columns(["key"]).to_pylist() if "key" in names else batch.to_pylist()
            values = [json.dumps(r, default=_json_default, separators=(",", ":")).encode() for r in rows]
        self.producer.send_many(list(zip(keys, values, strict=True)))

    def finish(self, query: str | None, plan: BatchPlan) -> SlotCommit:
        """The pre-commit: every record delivered, ranges checked, the Kafka transaction committed."""
        written = self.producer.flush_epoch({self.subject: self.lease.node.next_offsets})[self.subject]
        self.producer.commit_transaction()
        return SlotCommit(slot=self.slot, epoch=self.epoch, attempt=self.attempt, last=written.last,
                          records=written.records, query=query, counts=written.counts, shadow=self.shadow, plan=plan)

    def close(self) -> None:
        """Release the producer; an uncommitted transaction's records carry an attempt nobody names."""
        self.producer.close()
