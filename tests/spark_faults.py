"""The aligned sink with faults, for tests: ``format("aligned_faulty")``, the product's data source whose writer
carries a :class:`Faults` hook (:class:`aligner.connectors.spark.writer.SinkHook`) built from the options below.
The product's ``format("aligned")`` has none of them.

Options: ``failFirstAttemptAfter`` = N makes every task's first attempt flush its first N records (or more:
whole Arrow batches) to Kafka and then fail; ``pauseAfterCommit`` = B makes the driver hang right after batch
B's ZooKeeper commit, before Spark's commit log records it (to be killed); ``hangTask`` = ``"B/S"`` (micro-batch
B, slot S; ``"*/S"``: any micro-batch once armed) holds that task's first attempt at ``hangAt`` = ``write``
(records flushed to Kafka, the transaction open) or ``precommit`` (the Kafka transaction committed, the commit
message not yet returned); ``hangFile`` (the attempt writes its process id there, so a test finds the executor to
kill), ``hangSeconds`` (default 3600; a short hold makes Spark speculate) and ``hangArm`` (a file: the hold happens
only while it exists, and the first attempt to get there takes it, so a test picks the moment, e.g. a hot-swap's
pre-commit). ``countRequests`` (a file): the driver's commit of every micro-batch appends to it the ZooKeeper
requests its writer sent while Spark built it and while it committed, one JSON line per batch (its bucket
look-ups aside: once per process and bucket).

Spark's Python workers (executors of a standalone cluster, a Connect server) need not have this checkout on
their path: :func:`register` makes cloudpickle ship this module's classes by value.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from aligner.connectors.spark.common import AlignedOptionError, Connection, int_option, ledger_for
from aligner.connectors.spark.source import AlignedDataSource
from aligner.connectors.spark.writer import AlignedStreamWriter, SinkHook
from aligner.errors import AlignerError
from aligner.ledger import Ledger

FAULTY = "aligned_faulty"
POINTS = ("write", "precommit")
OPTIONS = frozenset({"failFirstAttemptAfter", "pauseAfterCommit", "hangTask", "hangAt", "hangFile", "hangSeconds",
                     "hangArm", "countRequests"})
"""The options of :class:`Faults`: a driver that is given one writes through ``format("aligned_faulty")``."""


def register(spark: Any) -> None:
    """Register ``format("aligned_faulty")`` with a SparkSession (classic or Connect)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(FaultyDataSource)


@dataclass(frozen=True)
class TaskHang:
    batch: int | None
    """None: any micro-batch (with ``arm``)."""
    slot: int
    point: str
    path: str
    seconds: int
    arm: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TaskHang | None:
        task = options.get("hangTask")
        if task is None:
            return None
        try:
            batch, slot = task.split("/")
            parsed = cls(None if batch == "*" else int(batch), int(slot), options.get("hangAt") or "write",
                         options.get("hangFile") or "", int_option(options, "hangSeconds", 3600, minimum=1) or 3600,
                         options.get("hangArm"))
        except ValueError:
            raise AlignedOptionError(f"option hangTask={task!r} is not BATCH/SLOT") from None
        if parsed.point not in POINTS or not parsed.path or (parsed.batch is None and not parsed.arm):
            raise AlignedOptionError(f"option hangTask needs hangAt (one of {', '.join(POINTS)}) and hangFile "
                                     "(and hangArm for any batch)")
        return parsed

    def at(self, point: str, ctx: Any, slot: int) -> bool:
        """Hold here when this is the chosen point of the chosen task's first attempt (and, armed, the arm is
        taken); returns whether it held."""
        if ctx is None or point != self.point or slot != self.slot or ctx.attemptNumber() != 0:
            return False
        if self.batch is not None and ctx.getLocalProperty("streaming.sql.batchId") != str(self.batch):
            return False
        if self.arm is not None:
            try:
                os.rename(self.arm, f"{self.arm}.taken")  # atomic: one attempt takes the arm
            except OSError:
                return False
        tmp = f"{self.path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, self.path)
        parent, deadline = os.getppid(), time.monotonic() + self.seconds
        while time.monotonic() < deadline and os.getppid() == parent:  # not outliving a killed executor
            time.sleep(0.2)
        return True


@dataclass(frozen=True)
class Faults(SinkHook):
    fail_first_attempt_after: int | None = None
    pause_after_commit: int | None = None
    hang: TaskHang | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Faults:
        return cls(int_option(options, "failFirstAttemptAfter", None, minimum=1),
                   int_option(options, "pauseAfterCommit", None), TaskHang.from_options(options))

    def task(self, point: str, ctx: Any, slot: int, out: Any) -> None:
        first = ctx is not None and ctx.attemptNumber() == 0
        if point == "sent" and first and self.fail_first_attempt_after is not None \
                and out.records >= self.fail_first_attempt_after:
            out.flush()  # the records are on the broker when the attempt dies
            raise AlignerError(f"injected failure of task {slot} attempt 0 after {out.records} records")
        if self.hang is not None and point in POINTS:
            if point == "write" and self.hang.point == "write":
                out.flush()  # held with its records on the broker, the transaction open
            self.hang.at(point, ctx, slot)

    def committed(self, batch: int, epoch: int) -> None:
        if batch == self.pause_after_commit:
            time.sleep(3600)  # committed in ZooKeeper, not in Spark's commit log: the test kills the driver now


class FaultyDataSource(AlignedDataSource):
    """``format("aligned_faulty")``: the aligned data source, its writer carrying :class:`Faults`."""

    @classmethod
    def name(cls) -> str:
        return FAULTY

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        path = self.options.get("countRequests")
        if path:
            conn = Connection.from_options(self.options)
            with zk_requests(ledger_for(conn.zk, conn.root)) as built:
                writer = super().streamWriter(schema, overwrite)
        else:
            writer = super().streamWriter(schema, overwrite)
        assert isinstance(writer, AlignedStreamWriter)
        writer.hook = Faults.from_options(self.options)
        if path:
            writer.commit = _counted(writer, path, built)  # type: ignore[method-assign]
        return writer


@contextlib.contextmanager
def zk_requests(ledger: Ledger) -> Iterator[list[tuple[str, str | None]]]:
    """Every request ``ledger``'s ZooKeeper client sends inside the block: (type, path), bucket look-ups aside."""
    kazoo, quiet = ledger.zk.kazoo, threading.local()
    sent: list[tuple[str, str | None]] = []
    call, ensure_bucket = kazoo._call, ledger.ensure_bucket

    def counting(request: Any, async_object: Any) -> Any:
        if not getattr(quiet, "on", False):
            sent.append((type(request).__name__, getattr(request, "path", None)))
        return call(request, async_object)

    def bucket(node: str) -> None:
        quiet.on = True
        try:
            ensure_bucket(node)
        finally:
            quiet.on = False

    kazoo._call, ledger.ensure_bucket = counting, bucket  # type: ignore[method-assign, assignment]
    try:
        yield sent
    finally:
        del kazoo._call, ledger.ensure_bucket


def _counted(writer: AlignedStreamWriter, path: str, built: list[tuple[str, str | None]]) -> Any:
    """``writer.commit`` recording the requests sent while it runs, and ``built``: those sent while Spark built it."""
    commit = writer.commit

    def counted(messages: Any, batchId: int) -> None:
        with zk_requests(ledger_for(writer.spec.conn.zk, writer.spec.conn.root)) as sent:
            commit(messages, batchId)
        with open(path, "a") as f:
            f.write(json.dumps({"batch": batchId, "built": built, "requests": sent}) + "\n")

    return counted
