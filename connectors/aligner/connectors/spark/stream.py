"""Streaming reads by epoch: ``spark.readStream.format("aligned")``.

Spark offsets are subject epoch numbers (:class:`aligner.connectors.spark.offset.StreamOffset`):
``{"epochs": {subject: N}}`` means "every epoch before N has been read", so a micro-batch from N = a to
N = b covers exactly the committed epochs a .. b-1 and nothing else.
Batches are therefore aligned with the subject's epochs. By default a
micro-batch takes every epoch committed since the last one, so a query keeps up however slow its
batches are compared with the epochs; ``maxEpochsPerBatch`` (or ``epochsPerBatch``) = N opts in to
batches of at most N epochs (1: every micro-batch is exactly one committed epoch).

- ``initialOffset``: option ``startingEpoch``, else the subject's first epoch (0 for a new subject).
- ``latestOffset(start, limit)``: one past the last committed epoch (the frontier), capped by the
  read limit. ``getDefaultReadLimit`` is ``ReadAllAvailable`` unless a cap is set, then
  ``ReadMaxFiles(cap)``: the Python Data Source API only carries Spark's built-in limits, and here
  one "file" is one subject epoch (a ``ReadMaxRows`` limit is read the same way).
- ``Trigger.AvailableNow`` is supported: the frontier is fixed when the query starts.
- Restarting from a checkpoint resumes at the checkpointed epoch: offsets are plain epoch numbers
  and committed epochs never change, so a re-planned batch reads the same records again.

Several subjects: option ``subjects`` = "a,b" (``subject`` stays for one). Offsets are epoch
vectors ``{"epochs": {"a": Na, "b": Nb}}`` as for one subject: every epoch before N_s of subject s has been read (the
epoch-vector rules of the alignment protocol). ``latestOffset`` advances each subject to one past its
last committed epoch, capped per subject by the read limit, so a batch covers each subject's newly
committed epochs and none of a slower subject that committed nothing new (marker merging). Rows then
end with a ``subject`` column; field columns are the union of the subjects' registered fields (null
where a row's subject does not register one). Lineage records one node per subject the batch covers.

Each batch is planned like a batch read (:func:`aligner.connectors.spark.common.plan_partitions`): one input
partition per (subject,) Kafka partition with records in the batch's epochs, stamps filtered; with
``minRecordsPerTask`` = N, partitions of fewer than N offsets share tasks
(:func:`aligner.connectors.spark.common.pack`).

Lineage: every read task of micro-batch B of query Q creates-if-absent
``{root}/spark/queries/{Q}/batches/{B:012d}/{subject}`` = the epochs [first, last] it covers
(:class:`connectors.spark.models.SparkSourceBatchNode`; a batch of empty epochs gets one empty task
for it). The query id survives restarts from the checkpoint and a batch re-run plans the same span, so
the record is written once; together with the aligned sink's per-epoch lineage it maps every epoch a
Spark query writes onto the subject epochs it read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from aligner.connectors.spark.common import (
    AlignedPartition,
    Connection,
    TaskOptions,
    int_option,
    ledger_for,
    pack,
    plan_partitions,
    read_input,
)
from aligner.connectors.spark.job import JobPlanner
from aligner.connectors.spark.offset import StreamOffset
from aligner.ledger import Ledger


class AlignedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.conn = Connection.from_options(options, multi=True)
        self.schema = schema
        self.starting = int_option(options, "startingEpoch", None)
        cap = int_option(options, "maxEpochsPerBatch", None, minimum=1)
        self.per_batch = cap if cap is not None else int_option(options, "epochsPerBatch", None, minimum=1)
        """At most this many epochs per micro-batch; None: every committed epoch available (keeps up)."""
        self.tasks = TaskOptions.from_options(options)
        self._target: dict[str, int] | None = None
        self.job = options.get("job") or None
        """Run as this registered aligned job (:mod:`aligner.connectors.spark.job`)."""
        self._planner: JobPlanner | None = None

    @property
    def planner(self) -> JobPlanner:
        if self._planner is None:
            assert self.job is not None
            self._planner = JobPlanner(self._ledger, self.conn.kafka, self.job, self._subjects)
        return self._planner

    @property
    def _ledger(self) -> Ledger:
        return ledger_for(self.conn.zk, self.conn.root)

    @property
    def _subjects(self) -> tuple[str, ...]:
        return self.conn.subjects or (self.conn.subject,)

    def _first_epoch(self, subject: str) -> int:
        if self.starting is not None:
            return self.starting
        first = self._ledger.subjects.first_epoch(subject)  # raises UnknownSubjectError
        return first if first is not None else 0

    def _next_uncommitted(self, fresh: bool = False) -> dict[str, int]:
        """Per subject, one past its frontier: the first epoch not yet committed (as a watch keeps it, since
        Spark asks every 10 ms while idle; ``fresh``: read now)."""
        out = {}
        for s in self._subjects:
            frontier = self._ledger.epochs.frontier(s) if fresh else self._ledger.watches.frontier_watched(s)
            out[s] = frontier + 1 if frontier is not None else self._first_epoch(s)
        return out

    def _offset(self, vector: Mapping[str, int]) -> dict:
        return StreamOffset(epochs=dict(vector)).dump()

    def _parse(self, offset: dict) -> StreamOffset:
        return StreamOffset.parse(offset, self._subjects)

    def initialOffset(self) -> dict:
        return self._offset({s: self._first_epoch(s) for s in self._subjects})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.per_batch is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._next_uncommitted(fresh=True)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Per subject: one past its last committed epoch, capped by the limit per subject (marker
        merging: a batch covers each subject's newly committed epochs, none for a subject with none).
        A job's query plans its next job epoch instead (and the swap gate may plan nothing: ``start``)."""
        firsts = self._parse(start).epochs
        cap: int | None = None
        if isinstance(limit, ReadMaxFiles):
            cap = max(1, limit.max_files)
        elif isinstance(limit, ReadMaxRows):
            cap = max(1, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            cap = self.per_batch
        if self.job is not None:
            planned = self.planner.plan(firsts, self._parse(start).job, cap)
            return start if planned is None else planned.offset().dump()
        target = self._target if self._target is not None else self._next_uncommitted()
        ends = {}
        for s, first in firsts.items():
            end = target[s] if cap is None else min(target[s], first + cap)
            ends[s] = max(first, end)
        # Nothing new: the offset as Spark gave it (one it wrote in an earlier shape stays equal to itself).
        return start if ends == firsts else self._offset(ends)

    def reportLatestOffset(self) -> dict | None:
        return self._offset(self._next_uncommitted())

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        firsts, stop_at = self._parse(start).epochs, self._parse(end)
        stops, job_span = stop_at.epochs, stop_at.job_span if self.job is not None else None
        ledger = self._ledger
        parts: list[AlignedPartition] = []
        for s in self._subjects:
            first, stop = firsts[s], stops[s]
            if stop <= first:
                continue
            subject = ledger.subjects.subject(s)
            parts += plan_partitions(ledger, self.conn.kafka, subject, range(first, stop), self.tasks.stall_timeout,
                                     zk=self.conn.zk, lineage=True, subject_column=bool(self.conn.subjects),
                                     job_span=job_span, writes=stop_at.writes)
        return pack(parts, self.tasks.min_records)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_input(partition, self.schema, self.tasks.settle_heap)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        pass
