"""Lineage: which upstream subject epochs an epoch of a job, a Spark sink or a subject contains, transitively.

One walker for every engine. A job's epoch N is its output subject's epoch N; an aligned job epoch
(runtime, Faust, a Spark query running as a job) records the subject epochs it covered, so lineage is
exact; an unaligned one only knows its input offsets, reported as such. A Spark sink records, per
committed epoch, the micro-batch that wrote it, and a streaming read records, per micro-batch, the
subject epochs it read: joined on (query, batch) they map a Spark sink's epochs onto its inputs' too.
Lineage only reads the ledger, so it lives in the ledger layer: ``aligner lineage``, ``aligner status``
and the Spark adapter's consistent cut (option ``lineage``) all build on it without importing an engine.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from aligner.errors import EpochCollectedError, EpochNotCommittedError, LineageError, UnknownJobError
from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.lineage_models import SparkSinkEpochNode, SparkSourceBatchNode
from aligner.models import JobNode, now_ms, parse
from aligner.ops import Create

SOURCE_BATCHES_KEPT = 100_000
"""Source batch nodes kept per query; older ones are deleted as new batches are recorded."""

Tree = dict[str, Any]
"""A lineage tree: a job or Spark sink epoch ({"job", "epoch", "output", "aligned", "inputs"}) or a subject
epoch ({"subject", "epoch", "producers"}), nested; :func:`flatten` turns it into a cut."""


# ---- lineage trees -----------------------------------------------------------------------------------


def job_epoch_lineage(ledger: Ledger, job: str, epoch: int, depth: int = 16) -> Tree:
    """The tree of subject epochs that epoch ``epoch`` of ``job`` derives from (``depth`` levels)."""
    jobs = ledger.jobs
    node = jobs.job(job)
    try:
        committed = ledger.epochs.is_committed(node.output, epoch)
    except EpochNotCommittedError as exc:  # no such epoch at all
        raise LineageError(f"job {job!r} has no epoch {epoch}: {exc}") from None
    if not committed:
        raise LineageError(f"epoch {epoch} of job {job!r} (its output {node.output!r}) is not committed yet; "
                           f"it has no lineage yet")
    covered = jobs.job_epoch(jobs.epoch_line(job), epoch)  # a new version uses the first version's epochs
    entry: Tree = {"job": job, "epoch": epoch, "output": node.output}
    # What each worker committed with the epoch says how it read: a job epoch record is followed by every
    # worker that is aligned, but a worker that is not (a split alignment the coordinator is undoing, an
    # abort) reads on its own in the same epoch, and then the epoch holds no whole input epochs.
    records = {w: jobs.worker_epoch_or_none(job, w, epoch) for w in range(node.parallelism)}
    unaligned = [w for w, r in records.items() if r is not None and r.covered is None]
    if covered is None or unaligned:
        entry["aligned"] = False
        if covered is not None:
            entry["unaligned_workers"] = unaligned
        # else pruned by gc, or another version wrote the epoch
        entry["input_offsets"] = {w: r.offsets for w, r in records.items() if r is not None}
        entry["inputs"] = []
        return entry
    entry["aligned"] = True
    entry["inputs"] = [
        subject_epoch_lineage(ledger, subject, e, depth - 1, inner=True)
        for subject, span in sorted(covered.covered.items()) if span is not None
        for e in range(span.first, span.last + 1)
    ] if depth > 0 else []
    return entry


def spark_epoch_lineage(ledger: Ledger, subject: str, sink: str, epoch: int, depth: int = 16) -> Tree:
    """The tree of epoch ``epoch`` of ``subject`` written by the Spark sink ``sink``: the micro-batch
    that wrote it and, through the epochs that batch read, their lineage."""
    records = SparkLineageLedger(ledger)
    written = records.sink_epoch(subject, sink, epoch)
    if written is None:
        raise LineageError(f"epoch {epoch} of {subject!r} was not written by a micro-batch of Spark sink {sink!r}")
    entry: Tree = {"job": sink, "epoch": epoch, "output": subject, "spark": True,
                   "query": written.query, "batch": written.batch}
    read = records.source_batch(written.query, written.batch) if written.query else {}
    entry["aligned"] = bool(read)
    if not read and written.query and records.batch_collected(written.query, written.batch):
        # Retention keeps each subject by its own policy: the batch's inputs went, and with them the record
        # of what it read. Said as such, not as an unaligned write.
        entry["aligned"] = None
        entry["inputs_collected"] = (f"retention removed the record of what micro-batch {written.batch} of "
                                     f"query {written.query} read (its input epochs were out of retention)")
    entry["inputs"] = [
        subject_epoch_lineage(ledger, node.subject, e, depth - 1, inner=True)
        for node in read.values() for e in range(node.first, node.last + 1)
    ] if depth > 0 else []
    return entry


def subject_epoch_lineage(ledger: Ledger, subject: str, epoch: int, depth: int = 16, inner: bool = False) -> Tree:
    """The tree of an epoch of ``subject``: the jobs and Spark sinks that wrote it and, through them,
    their inputs. A writer that is neither (a plain producer, the epoch marker) ends the walk."""
    try:
        if not ledger.epochs.is_committed(subject, epoch):
            raise LineageError(f"epoch {epoch} of {subject!r} is not committed; it has no lineage yet")
    except EpochCollectedError:
        if not inner:
            raise
        # An input of a retained epoch that retention removed: part of the cut (a read of it says "out of
        # retention"), the end of the walk.
        return {"subject": subject, "epoch": epoch, "producers": [], "collected": True}
    records, jobs = SparkLineageLedger(ledger), ledger.jobs
    producers: list[Tree] = []
    for sink in sorted({split_writer(w)[0] for w in ledger.epochs.epoch_node(subject, epoch).writers}):
        if depth <= 0:
            break
        # A job's epoch records what it covered before it ran, for every engine: exact even where a Spark
        # query's micro-batch spans several job epochs (a new version's catch-up) or ran again after a restart.
        # A micro-batch's record is the lineage of a Spark sink that is no job.
        try:
            job: JobNode | None = jobs.job(sink)
        except UnknownJobError:
            job = None
        spark = records.sink_epoch(subject, sink, epoch) is not None
        if job is not None and job.output == subject and (
                not spark or jobs.job_epoch(jobs.epoch_line(sink), epoch) is not None):
            producers.append({"sink": sink, **job_epoch_lineage(ledger, sink, epoch, depth)})
        elif spark:
            producers.append({"sink": sink, **spark_epoch_lineage(ledger, subject, sink, epoch, depth)})
        elif job is None:
            producers.append({"sink": sink, "job": None})
    return {"subject": subject, "epoch": epoch, "producers": producers}



def epoch_lineage(ledger: Ledger, job: str, epoch: int, subject: str | None = None) -> tuple[str, Tree]:
    """(output subject, lineage tree) of epoch ``epoch`` of ``job``: a registered job (runtime, Faust, a
    Spark query running as a job) or a Spark sink id (``subject`` picks the target when the same sink id
    writes several subjects)."""
    try:
        node = ledger.jobs.job(job)
    except UnknownJobError:
        targets = spark_sink_subjects(ledger, job)
        if not targets:
            raise LineageError(f"unknown job {job!r}: neither a registered job nor a Spark sink id") from None
        if len(targets) > 1:
            if subject not in targets:
                raise LineageError(f"Spark sink {job!r} writes several subjects {targets}; read one of them") \
                    from None
            targets = [subject]
        return targets[0], spark_epoch_lineage(ledger, targets[0], job, epoch)
    return node.output, job_epoch_lineage(ledger, job, epoch)


def flatten(tree: Tree) -> dict[str, list[int]]:
    """All subject epochs a lineage tree contains, per subject (the consistent cut to read)."""
    out: dict[str, set[int]] = {}

    def walk(node: Tree) -> None:
        if "subject" in node and "producers" in node:
            out.setdefault(node["subject"], set()).add(node["epoch"])
            for p in node["producers"]:
                walk(p)
        for child in node.get("inputs", []):
            walk(child)

    walk(tree)
    return {s: sorted(e) for s, e in sorted(out.items())}


def cut(ledger: Ledger, job: str, epoch: int, subject: str | None = None) -> dict[str, list[int]]:
    """The consistent cut named by epoch ``epoch`` of ``job`` (a job or a Spark sink id): every subject
    epoch it derives from, including the epoch of the job's own output."""
    output, tree = epoch_lineage(ledger, job, epoch, subject)
    out = flatten(tree)
    out.setdefault(output, [])
    if epoch not in out[output]:
        out[output] = sorted([*out[output], epoch])
    return dict(sorted(out.items()))


def lineage_epochs(ledger: Ledger, spec: str, subject: str) -> list[int]:
    """The epochs of ``subject`` in the cut named by ``spec`` = "JOB:EPOCH" (the Spark read option ``lineage``)."""
    job, sep, raw = spec.rpartition(":")
    if not sep or not job or not raw.strip().isdigit():
        raise LineageError(f"option lineage={spec!r} must be 'JOB:EPOCH' (a job or Spark sink id and its epoch)")
    epoch = int(raw)
    ledger.subjects.subject(subject)  # raises UnknownSubjectError
    found = cut(ledger, job, epoch, subject)
    if subject not in found:
        raise LineageError(
            f"the consistent cut of {job}:{epoch} holds subjects {sorted(found)}, not {subject!r}; "
            f"read one of those or name another job epoch"
        )
    return found[subject]


# ---- where Spark queries record lineage --------------------------------------------------------------


class SparkLineageLedger:
    """Where Spark queries record lineage, and the reads and create-if-absent writes of those records.

    Layout (under the ledger root)::

        subjects/{subject}/sinks/{sink}/spark                       the sink's progress (the adapter's model)
        subjects/{subject}/sinks/{sink}/spark/epochs/{epoch:010d}   which micro-batch wrote a sink epoch
        spark/queries/{queryId}/batches/{batch:012d}/{subject}      which subject epochs a micro-batch read
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    # ---- paths (declared in aligner.layout) ----------------------------------------------------

    def progress_path(self, subject: str, sink: str) -> str:
        return self.ledger.layout.spark_progress(subject, sink)

    def sink_epochs_path(self, subject: str, sink: str) -> str:
        return self.ledger.layout.spark_sink_epochs(subject, sink)

    def sink_epoch_path(self, subject: str, sink: str, epoch: int) -> str:
        return self.ledger.layout.spark_sink_epoch(subject, sink, epoch)

    def query_batches_path(self, query: str) -> str:
        return self.ledger.layout.query_batches(query)

    def batch_path(self, query: str, batch: int) -> str:
        return self.ledger.layout.query_batch(query, batch)

    def source_batch_path(self, query: str, batch: int, subject: str) -> str:
        return self.ledger.layout.source_batch(query, batch, subject)

    # ---- source batches -----------------------------------------------------------------------

    def record_source_batch(self, node: SparkSourceBatchNode, kept: int = SOURCE_BATCHES_KEPT) -> SparkSourceBatchNode:
        """Create-if-absent the record of what a micro-batch read of a subject; returns the record that
        stands (an earlier one wins: the caller compares). A new record drops the batch ``kept`` batches
        older, so a query's records stay bounded."""
        path = self.source_batch_path(node.query, node.batch, node.subject)
        # One request in the common case (the batch's first subject, its bucket there): the batch node and
        # the record together. Otherwise the record alone, its parents made as needed.
        results = self.ledger.zk.transaction([Create(self.batch_path(node.query, node.batch)),
                                              Create(path, node.dump())]).commit()
        if any(isinstance(r, Exception) for r in results):
            try:
                self.ledger.zk.create(path, node.dump(), makepath=True)
            except NodeExistsError:
                return parse(SparkSourceBatchNode, path, self.ledger.zk.get(path)[0])
        if node.batch >= kept:
            with contextlib.suppress(NoNodeError):
                self.ledger.zk.delete(self.batch_path(node.query, node.batch - kept), recursive=True)
        return node

    def source_batch(self, query: str, batch: int) -> dict[str, SparkSourceBatchNode]:
        """What one micro-batch of a query read, per subject ({} when nothing was recorded)."""
        base = self.batch_path(query, batch)
        try:
            names = self.ledger.zk.get_children(base)
        except NoNodeError:
            return {}
        out = {}
        for name in sorted(names):
            path = f"{base}/{name}"
            with contextlib.suppress(NoNodeError):
                out[name] = parse(SparkSourceBatchNode, path, self.ledger.zk.get(path)[0])
        return out

    def queries(self) -> list[str]:
        """Ids of the streaming queries that recorded micro-batches."""
        try:
            return sorted(self.ledger.zk.get_children(self.ledger.layout.spark_queries))
        except NoNodeError:
            return []

    def batch_collected(self, query: str, batch: int) -> bool:
        """Whether retention removed ``batch``'s record: the query's oldest recorded batch is a later one."""
        with contextlib.suppress(NoNodeError):
            numbers = self.ledger.numbers(self.query_batches_path(query))
            return bool(numbers) and numbers[0] > batch
        return False

    def last_batch(self, query: str) -> int | None:
        """The newest micro-batch a query recorded (None: none)."""
        try:
            return next((numbers[-1] for numbers in self.ledger.numbers_from_last(self.query_batches_path(query))
                         if numbers), None)
        except NoNodeError:
            return None

    # ---- sink epochs --------------------------------------------------------------------------

    def sink_epoch(self, subject: str, sink: str, epoch: int) -> SparkSinkEpochNode | None:
        """Which micro-batch wrote epoch ``epoch`` of ``subject`` through Spark sink ``sink`` (None: none)."""
        path = self.sink_epoch_path(subject, sink, epoch)
        try:
            raw, _ = self.ledger.zk.get(path)
        except NoNodeError:
            return None
        return parse(SparkSinkEpochNode, path, raw)

    def sink_epoch_numbers(self, subject: str, sink: str) -> list[int]:
        """The epochs of ``subject`` that the Spark sink ``sink`` recorded, in order."""
        try:
            return self.ledger.numbers(self.sink_epochs_path(subject, sink))
        except NoNodeError:
            return []

    def sink_subjects(self, sink: str) -> list[str]:
        """Subjects that a Spark sink with this id writes."""
        return [s for s in self.ledger.subjects.subject_names() if self.ledger.zk.exists(self.progress_path(s, sink))]


# ---- recording and reading Spark lineage ----------------------------------------------------------


def record_source_batch(ledger: Ledger, query: str, batch: int, subject: str, first: int, last: int,
                        job_span: tuple[int, int] | None = None) -> None:
    """Create-if-absent: micro-batch ``batch`` of ``query`` read epochs first..last of ``subject``
    (and, for a query running as an aligned job, covered job epochs ``job_span``)."""
    job_first, job_last = job_span if job_span is not None else (None, None)
    node = SparkSourceBatchNode(query=query, batch=batch, subject=subject, first=first, last=last,
                                job_first=job_first, job_last=job_last)
    old = SparkLineageLedger(ledger).record_source_batch(node)
    if (old.first, old.last) != (first, last):
        raise LineageError(
            f"micro-batch {batch} of Spark query {query} was recorded reading epochs {old.first}..{old.last} "
            f"of {subject!r}, now it plans {first}..{last}; the query's checkpoint does not match its lineage"
        )


def source_batch(ledger: Ledger, query: str, batch: int) -> dict[str, SparkSourceBatchNode]:
    """What one micro-batch of a query read, per subject ({} when nothing was recorded)."""
    return SparkLineageLedger(ledger).source_batch(query, batch)


def sink_epoch(ledger: Ledger, subject: str, sink: str, epoch: int) -> SparkSinkEpochNode | None:
    return SparkLineageLedger(ledger).sink_epoch(subject, sink, epoch)


def sink_lineage(ledger: Ledger, subject: str, sink: str) -> dict[int, SparkSinkEpochNode]:
    """Every epoch of ``subject`` the Spark sink ``sink`` wrote, with its (query, batch)."""
    records = SparkLineageLedger(ledger)
    out = {}
    for epoch in records.sink_epoch_numbers(subject, sink):
        node = records.sink_epoch(subject, sink, epoch)
        if node is not None:
            out[node.epoch] = node
    return out


def spark_sink_subjects(ledger: Ledger, sink: str) -> list[str]:
    """Subjects that a Spark sink with this id writes."""
    return SparkLineageLedger(ledger).sink_subjects(sink)


def query_status(ledger: Ledger, query: str) -> dict[str, Any]:
    """A streaming query as ``aligner status`` shows it: its last micro-batch, the subject epochs that
    batch read, and how far behind each subject's last committed epoch it is (epochs and seconds)."""
    spark = SparkLineageLedger(ledger)
    batch = spark.last_batch(query)
    read = spark.source_batch(query, batch) if batch is not None else {}
    subjects = {}
    for subject, node in read.items():
        frontier = ledger.epochs.frontier(subject)
        behind = 0 if frontier is None else max(0, frontier - node.last)
        seconds = 0.0
        if behind:
            oldest = ledger.epochs.committed(subject, node.last + 1)
            seconds = max(0.0, (now_ms() - oldest.committed_at) / 1000)
        subjects[subject] = {"first": node.first, "last": node.last, "behind_epochs": behind,
                             "behind_seconds": round(seconds, 2)}
    return {"query": query, "batch": batch, "subjects": subjects}


def query_statuses(ledger: Ledger) -> list[dict[str, Any]]:
    return [query_status(ledger, q) for q in SparkLineageLedger(ledger).queries()]
