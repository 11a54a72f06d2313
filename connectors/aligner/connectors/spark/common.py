"""Shared pieces of the Spark adapter: options, schemas, planning, Arrow conversion, process caches.

Everything here runs in plain Python processes that Spark starts (planner workers on the driver,
Python workers on executors), so it keeps no state beyond per-process connection caches.
"""

from __future__ import annotations

import base64
import gc
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pydantic import ValidationError
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from aligner.connectors.kafka import end_offsets
from aligner.connectors.reader import Segment, segments_by_partition
from aligner.epochs import CommittedEpoch, check_retention, parse_epoch_span
from aligner.errors import AlignedOptionError, AlignerError, EpochNotCommittedError
from aligner.ledger import Ledger
from aligner.models import FieldSpec, SubjectNode
from aligner.recipes.spark import SparkBatchRecipes
from aligner.settings import Settings

log = logging.getLogger(__name__)

RAW_COLUMNS = ("key", "value", "partition", "offset", "epoch", "timestamp")
SUBJECT_COLUMN = "subject"
"""Last column of multi-subject streaming reads only: the subject a row was read from."""
ARROW_BATCH_ROWS = 65536

_SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(), "long": LongType(), "double": DoubleType(), "boolean": BooleanType(),
    "binary": BinaryType(), "timestamp": TimestampType(),
}


# ---- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    zk: str
    kafka: str
    root: str
    subject: str
    subjects: tuple[str, ...] = ()
    """Multi-subject streaming reads (option ``subjects`` = "a,b"): the subjects; ``subject`` is then ""."""

    @classmethod
    def from_options(cls, options: Mapping[str, str], multi: bool = False) -> Connection:
        """Connection options as Spark passes them (case-insensitive keys), else the ``ALIGNER_*`` settings
        every component reads (:class:`aligner.settings.Settings`); ``multi`` accepts ``subjects`` (several
        subjects) instead of ``subject``."""
        try:
            settings = Settings.model_validate({k: options[k] for k in ("zk", "kafka", "root") if options.get(k)})
        except ValidationError as exc:
            raise AlignedOptionError(f"format('aligned'): {exc.errors()[0]['msg']}") from None
        zk = settings.zk if "zk" in settings.model_fields_set else None
        kafka = settings.kafka if "kafka" in settings.model_fields_set else None
        root = settings.root
        subject = options.get("subject")
        listed = options.get("subjects")
        subjects: tuple[str, ...] = ()
        if listed is not None:
            if not multi:
                raise AlignedOptionError("option subjects is only for spark.readStream.format('aligned'); "
                                         "use option subject")
            if subject:
                raise AlignedOptionError("format('aligned') takes option subject or subjects, not both")
            subjects = tuple(dict.fromkeys(s.strip() for s in listed.split(",") if s.strip()))
            if not subjects:
                raise AlignedOptionError(f"option subjects={listed!r} names no subject")
            subject = ""
        need = [("zk", zk), ("kafka", kafka)] + ([] if subjects else [("subject", subject)])
        missing = [n for n, v in need if not v]
        if missing:
            raise AlignedOptionError(
                f"format('aligned') needs option(s) {', '.join(missing)} (zk and kafka may also come from "
                "ALIGNER_ZK / ALIGNER_KAFKA)"
            )
        return cls(zk=str(zk), kafka=str(kafka), root=root, subject=str(subject), subjects=subjects)


def int_option(options: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise AlignedOptionError(f"option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise AlignedOptionError(f"option {name}={value} must be >= {minimum}")
    return value


def bool_option(options: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise AlignedOptionError(f"option {name}={raw!r} is not true or false")


def float_option(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    try:
        return default if raw is None else float(raw)
    except ValueError:
        raise AlignedOptionError(f"option {name}={raw!r} is not a number") from None


@dataclass(frozen=True)
class TaskOptions:
    """The options a batch read and a stream read plan their tasks by, read once for both."""

    stall_timeout: float
    """Seconds a task waits on a partition that serves nothing before it says what it saw."""
    min_records: int
    """``minRecordsPerTask``: partitions of fewer offsets share tasks (0: a task per partition)."""
    settle_heap: bool = False
    """``settleHeap``: :func:`settle_spark_heap` in the Python processes Spark reuses (off by default)."""

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TaskOptions:
        return cls(stall_timeout=float_option(options, "stallTimeout", 30.0),
                   min_records=int_option(options, "minRecordsPerTask", 0) or 0,
                   settle_heap=bool_option(options, "settleHeap"))


def batch_epochs(options: Mapping[str, str], ledger: Ledger, subject: str) -> list[int]:
    """The epochs a batch read covers: exactly one of epoch, epochs ("A:B"), asOf (0..N) or lineage
    ("JOB:EPOCH": the subject's epochs in the consistent cut named by a downstream job epoch)."""
    given = [n for n in ("epoch", "epochs", "asOf", "lineage") if options.get(n) is not None]
    if len(given) != 1:
        raise AlignedOptionError(
            "spark.read.format('aligned') needs exactly one of the options epoch, epochs ('A:B'), asOf or "
            f"lineage ('JOB:EPOCH'), got {given or 'none'}"
        )
    name = given[0]
    raw = str(options[name])
    if name == "lineage":
        from aligner.connectors.spark.lineage import lineage_epochs

        return lineage_epochs(ledger, raw, subject)
    try:
        if name == "epoch":
            first, last = parse_epoch_span(raw)
            if first != last:
                raise ValueError(f"epoch={raw!r} names a span; use epochs='A:B'")
        elif name == "epochs":
            first, last = parse_epoch_span(raw)
        else:
            first, last = 0, parse_epoch_span(raw)[1]
            if ":" in raw:
                raise ValueError(f"asOf={raw!r} must be one epoch number")
    except ValueError as exc:
        raise AlignedOptionError(str(exc)) from None
    if name == "asOf":
        oldest = ledger.subjects.first_epoch(subject)  # raises UnknownSubjectError
        if oldest is None:
            raise EpochNotCommittedError(subject, last, "the subject has no epochs yet")
        first = oldest  # epochs before the first one kept in ZooKeeper were garbage-collected
        if last < first:
            raise EpochNotCommittedError(subject, last, f"the subject's first epoch is {first}")
    return list(range(first, last + 1))


# ---- schema -------------------------------------------------------------------------------------


def field_columns(subject: SubjectNode, subject_column: bool = False) -> tuple[FieldSpec, ...]:
    """Registered fields that become columns: only JSON subjects are parsed."""
    if subject.value_format != "json":
        return ()
    raw = (*RAW_COLUMNS, SUBJECT_COLUMN) if subject_column else RAW_COLUMNS
    clash = [f.name for f in subject.fields if f.name in raw]
    if clash:
        raise AlignerError(
            f"subject {subject.name!r} registers field(s) {clash} whose names clash with the raw columns "
            f"{list(raw)} of format('aligned')"
        )
    return subject.fields


def read_schema(subject: SubjectNode | Sequence[SubjectNode]) -> StructType:
    """Registered fields, then the raw columns. Several subjects (multi-subject streaming reads): the
    union of their fields (a name registered twice must have one type), raw columns, then ``subject``."""
    multi = not isinstance(subject, SubjectNode)
    subjects = list(subject) if not isinstance(subject, SubjectNode) else [subject]
    types: dict[str, str] = {}
    for s in subjects:
        for f in field_columns(s, subject_column=multi):
            if types.setdefault(f.name, f.type) != f.type:
                raise AlignerError(f"field {f.name!r} has type {types[f.name]} in one subject and {f.type} in "
                                   f"subject {s.name!r}; format('aligned') cannot read them as one stream")
    fields = [StructField(name, _SPARK_TYPES[kind], True) for name, kind in types.items()]
    extra = [StructField(SUBJECT_COLUMN, StringType(), False)] if multi else []
    return StructType([
        *fields,
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("epoch", LongType(), False),
        StructField("timestamp", TimestampType(), True),
        *extra,
    ])


# ---- planning -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadPlan:
    """What an executor needs to read one input partition; plain data, pickled to executors."""

    kafka: str
    subject: str
    topic: str
    fields: tuple[tuple[str, str], ...]
    stall_timeout: float
    zk: str = ""
    root: str = ""
    span: tuple[int, int] | None = None
    """Streaming reads: the micro-batch's epochs [first, last], recorded as lineage by its tasks."""
    subject_column: bool = False
    """Multi-subject streaming reads: rows end with the ``subject`` column."""
    job_span: tuple[int, int] | None = None
    """A query running as an aligned job: the job epochs [first, last] the micro-batch covers."""
    writes: bool | None = None
    """A query running as an aligned job: whether the micro-batch writes its output (else it is voided), as the
    planner decided it; its write tasks in this process take it from here."""


class AlignedPartition(InputPartition):
    """One Kafka partition over a span of consecutive epochs: its non-empty segments in order."""

    def __init__(self, plan: ReadPlan, partition: int, segments: list[Segment], records: bool = False) -> None:
        super().__init__(partition)
        self.plan = plan
        self.partition = partition
        self.segments = segments
        self.records = records
        """This task records the micro-batch's lineage (streaming reads: one task per subject)."""

    def __repr__(self) -> str:
        epochs = f"{self.segments[0].epoch}..{self.segments[-1].epoch}" if self.segments else "-"
        return f"AlignedPartition({self.plan.subject}[{self.partition}] epochs {epochs})"


def plan_partitions(ledger: Ledger, kafka: str, subject: SubjectNode, epochs: Sequence[int],
                    stall_timeout: float, zk: str = "", lineage: bool = False,
                    subject_column: bool = False, job_span: tuple[int, int] | None = None,
                    writes: bool | None = None) -> list[AlignedPartition]:
    """Resolve committed epochs and split them into input partitions; every error surfaces here.

    Raises UnknownSubjectError, EpochNotCommittedError or EpochOutOfRetentionError before any task runs.
    With ``lineage`` (streaming reads of consecutive epochs) every task records the batch's span, and
    a batch whose epochs hold no record still gets one (empty) partition to record it.
    """
    committed: list[CommittedEpoch] = [ledger.epochs.committed(subject.name, e) for e in epochs]
    by_partition = segments_by_partition(committed)
    if by_partition:
        log_start = end_offsets(kafka, subject.topic, sorted(by_partition), earliest=True)
        for p, segs in by_partition.items():
            check_retention(subject.name, segs[0].epoch, p, segs[0].slice.start, log_start[p])
    span = (min(epochs), max(epochs)) if lineage and epochs else None
    plan = ReadPlan(kafka=kafka, subject=subject.name, topic=subject.topic,
                    fields=tuple((f.name, f.type) for f in field_columns(subject)), stall_timeout=stall_timeout,
                    zk=zk, root=ledger.layout.root, span=span, subject_column=subject_column,
                    job_span=job_span, writes=writes)
    parts = [AlignedPartition(plan, p, by_partition[p], records=i == 0) for i, p in enumerate(sorted(by_partition))]
    if span is not None and not parts:
        parts = [AlignedPartition(plan, 0, [], records=True)]
    return parts


TASK_RECORDS = 10_000
"""A good ``minRecordsPerTask`` for small micro-batches. A Python read task costs Spark about 0.1 s before its
first record (100-130 ms per task of a few hundred records in the demo, 10-30 ms of it reading),
about what reading 10,000 records costs. Off by default: packing makes a batch's task count depend on its
size, and the aligned sink refuses more write tasks than producers, so a narrow query into it would pass
small batches and fail large ones; a query that shuffles before its sink (the demo's) loses nothing."""


class PackedPartition(InputPartition):
    """Small input partitions that one task reads one after the other."""

    def __init__(self, parts: list[AlignedPartition]) -> None:
        super().__init__(tuple((p.plan.subject, p.partition) for p in parts))
        self.parts = parts

    def __repr__(self) -> str:
        return f"PackedPartition({', '.join(map(repr, self.parts))})"


def _offsets(part: AlignedPartition) -> int:
    return sum(s.slice.end - s.slice.start for s in part.segments)


def pack(parts: Sequence[AlignedPartition], min_records: int) -> list[InputPartition]:
    """One task per partition whose ranges span ``min_records`` offsets or more; the smaller ones fill
    shared tasks up to ``min_records`` (0: a task per partition, as planned)."""
    if min_records <= 0:
        return list(parts)
    tasks: list[InputPartition] = []
    group: list[AlignedPartition] = []
    filled = 0
    for part in parts:
        size = _offsets(part)
        if size >= min_records:
            tasks.append(part)
            continue
        group.append(part)
        filled += size
        if filled >= min_records:
            tasks.append(PackedPartition(group))
            group, filled = [], 0
    if group:
        tasks.append(group[0] if len(group) == 1 else PackedPartition(group))
    return tasks


# ---- process caches -----------------------------------------------------------------------------

SETTLE_OBJECTS = 20_000
"""Objects that survived the last full collection, above which :func:`settle_spark_heap` freezes them."""


def settle_spark_heap() -> None:
    """Opt-in (option ``settleHeap=true`` of a read or write): it changes the collector of processes Spark owns
    and shares with every other Python code of the application, so the application decides. Called where Spark
    enters this library in its own Python processes (executors' workers, the driver's planner and commit
    runners). Spark reuses them and runs a full ``gc.collect()`` after every task or call (pyspark/daemon.py);
    with pyarrow, pandas and this library loaded, that walks ~100,000 objects, 40-50 ms, several times per
    micro-batch (py-spy on the demo's workers: over half their CPU). Once more than SETTLE_OBJECTS have
    survived such a collection (modules, clients, caches: live objects), they are frozen out of the collector's
    sight (``gc.freeze()``), as ``settle_heap`` does for a job worker. That happens a few times per process;
    each freeze also keeps the calling task's young objects, so a process keeps at most a few tasks' worth
    that the collector would have freed."""
    if len(gc.get_objects(generation=2)) > SETTLE_OBJECTS:
        gc.freeze()

_LEDGERS: dict[tuple[str, str, int], Ledger] = {}
_RECIPES: dict[int, SparkBatchRecipes] = {}
_LOCK = threading.Lock()


def ledger_for(zk: str, root: str) -> Ledger:
    """One ZooKeeper session per process and (hosts, root).

    The session rides out outages by itself (every request is retried until ZooKeeper is back), so
    a disconnected session is kept; a ZooKeeper that is down when the first session opens is
    waited for too: a Spark query must not fail because ZooKeeper restarted under it."""
    from kazoo.handlers.threading import KazooTimeoutError

    key = (zk, root, os.getpid())
    with _LOCK:
        led = _LEDGERS.get(key)
        while led is None:
            try:
                led = Ledger.connect(zk, root, timeout=5.0)
            except KazooTimeoutError:
                log.warning("ZooKeeper at %s unreachable; retrying", zk)
        _LEDGERS[key] = led
        return led


def spark_recipes(ledger: Ledger) -> SparkBatchRecipes:
    """The Spark sink's batch-commit recipe over ``ledger``: built once per ledger and process, and shared."""
    with _LOCK:
        recipes = _RECIPES.get(id(ledger))
        if recipes is None or recipes.store is not ledger:
            recipes = _RECIPES[id(ledger)] = SparkBatchRecipes(ledger, ledger.commits)
        return recipes


# ---- reading ------------------------------------------------------------------------------------


def _iso_us(text: str) -> int | None:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(dt.timestamp() * 1_000_000)


def _convert(kind: str, v: Any) -> Any:
    """A JSON value as the column type wants it, or None (permissive: bad values become nulls)."""
    if v is None:
        return None
    if kind == "string":
        return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    if kind == "long":
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            return v
        return int(v) if isinstance(v, float) and v.is_integer() else None
    if kind == "double":
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if kind == "boolean":
        return v if isinstance(v, bool) else None
    if kind == "binary":
        try:
            return base64.b64decode(v, validate=True) if isinstance(v, str) else None
        except ValueError:
            return None
    if kind == "timestamp":  # epoch milliseconds or an ISO-8601 string
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v * 1000)
        return _iso_us(v) if isinstance(v, str) else None
    return None


def messages_to_batches(messages: list[Any], epoch: int, partition: int, fields: Sequence[tuple[str, str]],
                        pa_schema: pa.Schema, subject: str | None = None) -> Iterator[pa.RecordBatch]:
    """Kept confluent messages of one epoch as Arrow record batches in ``pa_schema``.

    ``pa_schema`` starts with field columns (those not in ``fields``, registered by another subject of
    a multi-subject read, are null), then the raw columns, then ``subject`` when it is given."""
    kinds = dict(fields)
    tail = len(RAW_COLUMNS) + (1 if subject is not None else 0)
    columns = [pa_schema.field(i) for i in range(len(pa_schema) - tail)]
    for lo in range(0, len(messages), ARROW_BATCH_ROWS):
        chunk = messages[lo:lo + ARROW_BATCH_ROWS]
        n = len(chunk)
        values = [m.value() for m in chunk]
        arrays: list[pa.Array] = []
        docs: list[Any] = []
        if kinds:
            for v in values:
                try:
                    d = json.loads(v) if v is not None else None
                except ValueError:
                    d = None
                docs.append(d if isinstance(d, dict) else None)
        for column in columns:
            kind = kinds.get(column.name)
            if kind is None:
                arrays.append(pa.nulls(n, type=column.type))
                continue
            col = [None if d is None else _convert(kind, d.get(column.name)) for d in docs]
            arrays.append(pa.array(col, type=column.type))
        base = len(columns)
        arrays.append(pa.array([m.key() for m in chunk], type=pa.binary()))
        arrays.append(pa.array(values, type=pa.binary()))
        arrays.append(pa.array([partition] * n, type=pa.int32()))
        arrays.append(pa.array([m.offset() for m in chunk], type=pa.int64()))
        arrays.append(pa.array([epoch] * n, type=pa.int64()))
        ts = pa.array([m.timestamp()[1] for m in chunk], type=pa.int64())
        arrays.append(ts.cast(pa.timestamp("ms", tz="UTC")).cast(pa_schema.field(base + 5).type))
        if subject is not None:
            arrays.append(pa.array([subject] * n, type=pa.string()))
        yield pa.RecordBatch.from_arrays(arrays, schema=pa_schema)


def record_batch_lineage(partition: AlignedPartition) -> None:
    """Executor side of a streaming read: record (query id, batch id) -> the batch's subject epochs.

    A plain read records it from one task per subject (the driver's commit runs after every task
    succeeded). A job's read records it from every task, once per process: the batch's write tasks decide
    from it whether they write, and one may run before the first read task did."""
    from pyspark import TaskContext

    from aligner.connectors.spark.lineage import record_source_batch

    plan = partition.plan
    ctx = TaskContext.get()
    if ctx is None or plan.span is None:
        return
    query, batch = ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty("streaming.sql.batchId")
    if not query or batch is None:
        return
    key = (plan.zk, plan.root, query, int(batch), plan.subject)
    if plan.job_span is not None:
        _remember((*key[:4], "job"), plan.job_span)
        if plan.writes is not None:
            _remember((*key[:4], "act"), (int(plan.writes), int(plan.writes)))
    elif not partition.records:
        return
    if _recalled(key) is None:
        record_source_batch(ledger_for(plan.zk, plan.root), query, int(batch), plan.subject, *plan.span,
                            job_span=plan.job_span)
        _remember(key, plan.span)


def batch_job_span(conn: Connection, query: str | None, batch: int,
                   lookup: Callable[[Ledger], tuple[int, int]]) -> tuple[int, int]:
    """The job epochs micro-batch ``batch`` of a job's query covers: from this process's own read task of
    the batch, else ``lookup`` (the lineage its read tasks recorded), once per process and batch."""
    key = (conn.zk, conn.root, query or "", batch, "job")
    span = _recalled(key)
    if span is None:
        span = lookup(ledger_for(conn.zk, conn.root))
        _remember(key, span)
    return span


def recalled_act(conn: Connection, query: str | None, batch: int) -> bool | None:
    """The planner's decision for micro-batch ``batch`` of a job's query (write, else void), when this
    process ran one of the batch's read tasks; None otherwise."""
    act = _recalled((conn.zk, conn.root, query or "", batch, "act"))
    return None if act is None else bool(act[0])


_BATCHES: OrderedDict[tuple[str, str, str, int, str], tuple[int, int]] = OrderedDict()
"""What this process recorded or looked up of recent micro-batches: (zk, root, query, batch, subject or
"job") -> epochs. Bounded, so a long-running executor keeps a few batches' worth, not its uptime's."""
_BATCHES_KEPT = 512


def _remember(key: tuple[str, str, str, int, str], span: tuple[int, int]) -> None:
    with _LOCK:
        _BATCHES[key] = span
        while len(_BATCHES) > _BATCHES_KEPT:
            _BATCHES.popitem(last=False)


def _recalled(key: tuple[str, str, str, int, str]) -> tuple[int, int] | None:
    with _LOCK:
        return _BATCHES.get(key)


def read_input(partition: InputPartition, schema: StructType, settle: bool = False) -> Iterator[pa.RecordBatch]:
    """Executor side: one task's input, a planned partition or several packed ones (``settle``: option
    ``settleHeap``)."""
    if settle:
        settle_spark_heap()
    if isinstance(partition, AlignedPartition):
        yield from read_aligned_partition(partition, schema)
    elif isinstance(partition, PackedPartition):
        for part in partition.parts:
            yield from read_aligned_partition(part, schema)


def read_aligned_partition(partition: AlignedPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    """Executor side: read one input partition's segments with an assigned consumer, stamps filtered."""
    from aligner.connectors.kafka import FetchingConsumer
    from aligner.connectors.reader import read_partition

    plan = partition.plan
    if plan.span is not None:
        record_batch_lineage(partition)
    if not partition.segments:
        return
    pa_schema = to_arrow_schema(schema, timezone="UTC")
    fc = FetchingConsumer(plan.kafka)  # its wait rises if the broker answers but returns nothing
    try:
        for epoch, kept, _dropped in read_partition(fc, plan.topic, partition.partition, partition.segments,
                                                    plan.stall_timeout):
            if kept:
                yield from messages_to_batches(kept, epoch, partition.partition, plan.fields, pa_schema,
                                               plan.subject if plan.subject_column else None)
    finally:
        fc.close()
