"""Lineage of Spark queries in ZooKeeper, and the consistent cut behind the batch option ``lineage``.

A streaming read records, per micro-batch, the subject epochs it covered
(:class:`~aligner.connectors.spark.models.SparkSourceBatchNode`); an aligned streaming write records, per
committed epoch, the micro-batch that wrote it (:class:`~aligner.connectors.spark.models.SparkSinkEpochNode`).
Joined on (query id, batch id) they map every epoch a Spark query wrote onto the epochs it read, the
same way a job epoch of the coordinator's jobs does. :func:`cut` follows both kinds transitively.
"""

from __future__ import annotations

from typing import Any

from aligner.connectors.spark.models import SparkSinkEpochNode, SparkSourceBatchNode
from aligner.errors import LineageError, UnknownJobError
from aligner.jobs import JobLedger
from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.lineage import SparkLineageLedger, flatten, job_epoch_lineage
from aligner.models import now_ms

SOURCE_BATCHES_KEPT = 100_000
"""Source batch nodes kept per query; older ones are deleted as new batches are recorded."""


# ---- paths (the layout is aligner.lineage.SparkLineageLedger's) -----------------------------------


def progress_path(ledger: Ledger, subject: str, sink: str) -> str:
    return SparkLineageLedger(ledger).progress_path(subject, sink)


def sink_epochs_path(ledger: Ledger, subject: str, sink: str) -> str:
    return SparkLineageLedger(ledger).sink_epochs_path(subject, sink)


def sink_epoch_path(ledger: Ledger, subject: str, sink: str, epoch: int) -> str:
    return SparkLineageLedger(ledger).sink_epoch_path(subject, sink, epoch)


def query_batches_path(ledger: Ledger, query: str) -> str:
    return SparkLineageLedger(ledger).query_batches_path(query)


def source_batch_path(ledger: Ledger, query: str, batch: int, subject: str) -> str:
    return SparkLineageLedger(ledger).source_batch_path(query, batch, subject)


# ---- recording and reading ------------------------------------------------------------------------


def record_source_batch(ledger: Ledger, query: str, batch: int, subject: str, first: int, last: int,
                        job_span: tuple[int, int] | None = None) -> None:
    """Create-if-absent: micro-batch ``batch`` of ``query`` read epochs first..last of ``subject``
    (and, for a query running as an aligned job, covered job epochs ``job_span``)."""
    job_first, job_last = job_span if job_span is not None else (None, None)
    node = SparkSourceBatchNode(query=query, batch=batch, subject=subject, first=first, last=last,
                                job_first=job_first, job_last=job_last)
    old = SparkLineageLedger(ledger).record_source_batch(node, query, batch, subject, SOURCE_BATCHES_KEPT)
    if (old.first, old.last) != (first, last):
        raise LineageError(
            f"micro-batch {batch} of Spark query {query} was recorded reading epochs {old.first}..{old.last} "
            f"of {subject!r}, now it plans {first}..{last}; the query's checkpoint does not match its lineage"
        )


def source_batch(ledger: Ledger, query: str, batch: int) -> dict[str, SparkSourceBatchNode]:
    """What one micro-batch of a query read, per subject ({} when nothing was recorded)."""
    return SparkLineageLedger(ledger).source_batch(SparkSourceBatchNode, query, batch)


def sink_epoch(ledger: Ledger, subject: str, sink: str, epoch: int) -> SparkSinkEpochNode | None:
    return SparkLineageLedger(ledger).sink_epoch(SparkSinkEpochNode, subject, sink, epoch)


def sink_lineage(ledger: Ledger, subject: str, sink: str) -> dict[int, SparkSinkEpochNode]:
    """Every epoch of ``subject`` the Spark sink ``sink`` wrote, with its (query, batch)."""
    records = SparkLineageLedger(ledger)
    out = {}
    for epoch in records.sink_epoch_numbers(subject, sink):
        node = records.sink_epoch(SparkSinkEpochNode, subject, sink, epoch)
        if node is not None:
            out[node.epoch] = node
    return out


def spark_sink_subjects(ledger: Ledger, sink: str) -> list[str]:
    """Subjects that a Spark sink with this id writes."""
    return SparkLineageLedger(ledger).sink_subjects(sink)


# ---- lineage trees (the shape of aligner.lineage's, so its flatten applies) ------------------------


def spark_epoch_lineage(ledger: Ledger, subject: str, sink: str, epoch: int, depth: int = 16) -> dict[str, Any]:
    """Lineage of epoch ``epoch`` of ``subject`` written by the Spark sink ``sink``."""
    written = sink_epoch(ledger, subject, sink, epoch)
    if written is None:
        raise LineageError(f"epoch {epoch} of {subject!r} was not written by a micro-batch of Spark sink {sink!r}")
    entry: dict[str, Any] = {"job": sink, "epoch": epoch, "output": subject, "spark": True,
                             "query": written.query, "batch": written.batch}
    read = source_batch(ledger, written.query, written.batch) if written.query else {}
    entry["aligned"] = bool(read)
    entry["inputs"] = [
        subject_lineage(ledger, node.subject, e, depth - 1)
        for node in read.values() for e in range(node.first, node.last + 1)
    ] if depth > 0 else []
    return entry


def subject_lineage(ledger: Ledger, subject: str, epoch: int, depth: int = 16) -> dict[str, Any]:
    """Like ``aligner.lineage.subject_epoch_lineage``, also following Spark sinks."""
    if not ledger.is_committed(subject, epoch):
        raise LineageError(f"epoch {epoch} of {subject!r} is not committed; it has no lineage yet")
    producers: list[dict[str, Any]] = []
    for sink in sorted({split_writer(w)[0] for w in ledger.epoch_node(subject, epoch).writers}):
        if depth <= 0:
            break
        if sink_epoch(ledger, subject, sink, epoch) is not None:
            producers.append({"sink": sink, **spark_epoch_lineage(ledger, subject, sink, epoch, depth)})
            continue
        try:
            job = JobLedger(ledger).job(sink)
        except UnknownJobError:
            producers.append({"sink": sink, "job": None})
            continue
        if job.output == subject:
            producers.append({"sink": sink, **job_epoch_lineage(ledger, sink, epoch, depth)})
    return {"subject": subject, "epoch": epoch, "producers": producers}


def cut(ledger: Ledger, job: str, epoch: int, subject: str | None = None) -> dict[str, list[int]]:
    """The consistent cut named by epoch ``epoch`` of ``job``: every subject epoch it derives from,
    including the epoch of the job's own output. ``job`` is a coordinator job or a Spark sink id
    (``subject`` picks the target when the same sink id writes several subjects)."""
    try:
        node = JobLedger(ledger).job(job)
    except UnknownJobError:
        targets = spark_sink_subjects(ledger, job)
        if not targets:
            raise LineageError(f"{job!r} is neither a registered job nor a Spark sink id") from None
        if len(targets) > 1:
            if subject not in targets:
                raise LineageError(f"Spark sink {job!r} writes several subjects {targets}; read one of them") \
                    from None
            targets = [subject]
        output = targets[0]
        tree = spark_epoch_lineage(ledger, output, job, epoch)
    else:
        output = node.output
        if JobLedger(ledger).job_epoch(job, epoch) is None and not ledger.is_committed(output, epoch):
            raise LineageError(f"job {job!r} has no epoch {epoch}")
        tree = job_epoch_lineage(ledger, job, epoch)
    out = flatten(tree)
    out.setdefault(output, [])
    if epoch not in out[output]:
        out[output] = sorted([*out[output], epoch])
    return dict(sorted(out.items()))


def lineage_epochs(ledger: Ledger, spec: str, subject: str) -> list[int]:
    """The epochs of ``subject`` in the cut named by ``spec`` = "JOB:EPOCH"."""
    job, sep, raw = spec.rpartition(":")
    if not sep or not job or not raw.strip().isdigit():
        raise LineageError(f"option lineage={spec!r} must be 'JOB:EPOCH' (a job or Spark sink id and its epoch)")
    epoch = int(raw)
    ledger.subject(subject)  # raises UnknownSubjectError
    found = cut(ledger, job, epoch, subject)
    if subject not in found:
        raise LineageError(
            f"the consistent cut of {job}:{epoch} holds subjects {sorted(found)}, not {subject!r}; "
            f"read one of those or name another job epoch"
        )
    return found[subject]


def query_status(ledger: Ledger, query: str) -> dict[str, Any]:
    """A streaming query as ``aligner status`` shows it: its last micro-batch, the subject epochs that
    batch read, and how far behind each subject's last committed epoch it is (epochs and seconds)."""
    spark = SparkLineageLedger(ledger)
    batch = spark.last_batch(query)
    read = source_batch(ledger, query, batch) if batch is not None else {}
    subjects = {}
    for subject, node in read.items():
        frontier = ledger.frontier(subject)
        behind = 0 if frontier is None else max(0, frontier - node.last)
        seconds = 0.0
        if behind:
            oldest = ledger.committed(subject, node.last + 1)
            seconds = max(0.0, (now_ms() - oldest.committed_at) / 1000)
        subjects[subject] = {"first": node.first, "last": node.last, "behind_epochs": behind,
                             "behind_seconds": round(seconds, 2)}
    return {"query": query, "batch": batch, "subjects": subjects}


def query_statuses(ledger: Ledger) -> list[dict[str, Any]]:
    return [query_status(ledger, q) for q in SparkLineageLedger(ledger).queries()]
