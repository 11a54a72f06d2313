"""Streaming reads by epoch: ``spark.readStream.format("aligned")``.

Spark offsets are subject epoch numbers: ``{"epoch": N}`` means "every epoch before N has been
read", so a micro-batch from ``{"epoch": a}`` to ``{"epoch": b}`` covers exactly the committed epochs
a .. b-1 and nothing else. Batches are therefore aligned with the subject: with the default
``epochsPerBatch`` = 1 every micro-batch is exactly one committed epoch.

- ``initialOffset``: option ``startingEpoch``, else the subject's first epoch (0 for a new subject).
- ``latestOffset(start, limit)``: one past the last committed epoch (the frontier), capped by the
  read limit. ``getDefaultReadLimit`` is ``ReadMaxFiles(epochsPerBatch)``: the Python Data Source
  API only carries Spark's built-in limits, and here one "file" is one subject epoch (a
  ``ReadMaxRows`` limit is read the same way). ``ReadAllAvailable`` (e.g. ``Trigger.Once``) reads
  up to the frontier.
- ``Trigger.AvailableNow`` is supported: the frontier is fixed when the query starts.
- Restarting from a checkpoint resumes at the checkpointed epoch: offsets are plain epoch numbers
  and committed epochs never change, so a re-planned batch reads the same records again.

Each batch is planned like a batch read (:func:`connectors.spark.common.plan_partitions`): one input
partition per Kafka partition with records in the batch's epochs, stamps filtered.

Lineage: every read task of micro-batch B of query Q creates-if-absent
``{root}/spark/queries/{Q}/batches/{B:012d}/{subject}`` = the epochs [first, last] it covers
(:class:`connectors.spark.models.SparkSourceBatchNode`; a batch of empty epochs gets one empty task
for it). The query id survives restarts from the checkpoint and a batch re-run plans the same span, so
the record is written once; together with the aligned sink's per-epoch lineage it maps every epoch a
Spark query writes onto the subject epochs it read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

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

from aligner.errors import AlignerError
from connectors.spark.common import (
    AlignedPartition,
    Connection,
    float_option,
    int_option,
    ledger_for,
    plan_partitions,
    read_aligned_partition,
)


def _epoch_of(offset: dict) -> int:
    try:
        return int(offset["epoch"])
    except (KeyError, TypeError, ValueError):
        raise AlignerError(f"offset {offset!r} of format('aligned') is not {{'epoch': N}}") from None


class AlignedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.conn = Connection.from_options(options)
        self.schema = schema
        self.starting = int_option(options, "startingEpoch", None)
        self.per_batch = int_option(options, "epochsPerBatch", 1, minimum=1)
        self.stall_timeout = float_option(options, "stallTimeout", 30.0)
        self._target: int | None = None

    @property
    def _ledger(self):  # type: ignore[no-untyped-def]
        return ledger_for(self.conn.zk, self.conn.root)

    def _next_uncommitted(self) -> int:
        """One past the frontier: the first epoch not yet committed."""
        frontier = self._ledger.frontier(self.conn.subject)
        if frontier is not None:
            return frontier + 1
        return self.initialOffset()["epoch"]

    def initialOffset(self) -> dict:
        if self.starting is not None:
            return {"epoch": self.starting}
        numbers = self._ledger.epoch_numbers(self.conn.subject)  # raises UnknownSubjectError
        return {"epoch": numbers[0] if numbers else 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.per_batch)  # type: ignore[arg-type]

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._next_uncommitted()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first = _epoch_of(start)
        end = self._target if self._target is not None else self._next_uncommitted()
        if isinstance(limit, ReadMaxFiles):
            end = min(end, first + max(1, limit.max_files))
        elif isinstance(limit, ReadMaxRows):
            end = min(end, first + max(1, limit.max_rows))
        elif not isinstance(limit, ReadAllAvailable):
            end = min(end, first + self.per_batch)
        return {"epoch": max(first, end)}

    def reportLatestOffset(self) -> dict | None:
        return {"epoch": self._next_uncommitted()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, stop = _epoch_of(start), _epoch_of(end)
        if stop <= first:
            return []
        ledger = self._ledger
        subject = ledger.subject(self.conn.subject)
        return plan_partitions(ledger, self.conn.kafka, subject, range(first, stop), self.stall_timeout,
                               zk=self.conn.zk, lineage=True)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, AlignedPartition):
            yield from read_aligned_partition(partition, self.schema)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        pass
