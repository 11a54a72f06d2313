"""The ``aligned`` Python data source: batch reads by epoch, streaming reads by epoch, aligned writes.

Batch::

    spark.read.format("aligned").option("zk", ZK).option("kafka", KAFKA).option("subject", "orders")
         .option("epochs", "3:7").load()

Exactly one of ``epoch`` (N), ``epochs`` ("A:B", inclusive), ``asOf`` (every committed epoch up to N)
or ``lineage`` ("JOB:EPOCH": the subject's epochs in the consistent cut named by an epoch of a
downstream job, a coordinator job or a Spark sink id; see :mod:`aligner.connectors.spark.lineage`).
The epochs are resolved in ZooKeeper while Spark plans the query, so an unknown subject, an epoch
that is not committed or an epoch whose first offset the log no longer holds fails before any
task runs. A committed epoch never changes, so the same options return the same rows forever.

Planning makes one Spark input partition per Kafka partition that holds records in the span (with
``minRecordsPerTask`` = N, partitions of fewer than N offsets share tasks: a task costs Spark about 0.1 s
before its first record, see ``TASK_RECORDS``); a task assigns (never subscribes) a consumer to each of its
partitions in turn, reads the span's offset ranges and keeps only records whose stamp is the attempt
ZooKeeper committed for their epoch.

Columns: the subject's registered fields, parsed from JSON values (only for ``value_format`` json;
values that do not parse become nulls), then ``key`` and ``value`` (binary), ``partition``,
``offset``, ``epoch`` and ``timestamp`` (the Kafka record timestamp).

Other options: ``root`` (ZooKeeper root, default "/aligner"), ``stallTimeout`` (seconds a task
waits for the log to reach an epoch's end before reporting data loss, default 30), ``settleHeap``
(default false; reads and writes): freeze what survived Spark's per-task garbage collections in the Python
processes Spark reuses, a process-wide change of the collector that the application opts in to
(:func:`aligner.connectors.spark.common.settle_spark_heap`).
Streaming reads and writes: see :mod:`aligner.connectors.spark.stream` and :mod:`aligner.connectors.spark.writer`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from aligner.connectors.spark.common import (
    Connection,
    TaskOptions,
    batch_epochs,
    bool_option,
    ledger_for,
    pack,
    plan_partitions,
    read_input,
    read_schema,
    settle_spark_heap,
)

SHORT_NAME = "aligned"


class AlignedDataSource(DataSource):
    """``format("aligned")``: subjects read and written by committed epoch."""

    _unpickled = False
    """Spark made this instance by unpickling one it made earlier (see :meth:`streamWriter`)."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._unpickled = True

    def _settle(self) -> None:
        """Each method runs in one of Spark's reused Python processes on the driver."""
        if bool_option(self.options, "settleHeap"):
            settle_spark_heap()

    def schema(self) -> StructType:
        self._settle()
        conn = Connection.from_options(self.options, multi=True)  # subjects: streaming reads only
        ledger = ledger_for(conn.zk, conn.root)
        if conn.subjects:
            return read_schema([ledger.subjects.subject(s) for s in conn.subjects])
        return read_schema(ledger.subjects.subject(conn.subject))

    def reader(self, schema: StructType) -> DataSourceReader:
        self._settle()
        return AlignedBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from aligner.connectors.spark.stream import AlignedStreamReader

        return AlignedStreamReader(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """PySpark builds the writer it pickles to a micro-batch's tasks from a data source it makes for that,
        and the writer that commits the batch from the query's data source unpickled: only the former plans the
        batch when built (:class:`aligner.connectors.spark.writer.AlignedStreamWriter`). Should PySpark build
        them otherwise, the cost is a second plan (a commit's writer planning when built) or a planning error
        reported from pickling (a tasks' writer planning when pickled), never a task planning on its own."""
        self._settle()
        from aligner.connectors.spark.writer import AlignedStreamWriter

        return AlignedStreamWriter(self.options, schema, plan_now=not self._unpickled)


class AlignedBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.conn = Connection.from_options(options)
        self.options = options  # as Spark passes them: case-insensitive keys
        self.schema = schema
        self.tasks = TaskOptions.from_options(options)

    def partitions(self) -> Sequence[InputPartition]:
        ledger = ledger_for(self.conn.zk, self.conn.root)
        subject = ledger.subjects.subject(self.conn.subject)
        epochs = batch_epochs(self.options, ledger, subject.name)
        parts = plan_partitions(ledger, self.conn.kafka, subject, epochs, self.tasks.stall_timeout)
        # Spark wants at least one partition; an all-empty span reads nothing.
        return pack(parts, self.tasks.min_records) or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_input(partition, self.schema, self.tasks.settle_heap)
