"""Lineage: which upstream subject epochs an epoch of a job or a subject contains, transitively.

A job's epoch N is its output subject's epoch N. An aligned job epoch records the subject epochs
it covered, so lineage is exact; an unaligned one only knows its input offsets, reported as such.
Lineage only reads the ledger, so it lives in the ledger layer: the coordinator's ``aligner
lineage`` and the Spark adapter's consistent cut (``aligner.connectors.spark.lineage``) both
build on it. :class:`SparkLineageLedger` holds the ZooKeeper side of the Spark adapter's lineage
records; the adapter owns their models, so this layer imports no engine.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from aligner.errors import EpochNotCommittedError, FencedError, LineageError, UnknownJobError
from aligner.jobs import JobLedger
from aligner.layout import epoch_name, split_writer
from aligner.ledger import Ledger
from aligner.models import M, Node, parse

# ---- lineage trees of coordinator jobs -------------------------------------------------------------


def job_epoch_lineage(ledger: Ledger, job: str, epoch: int, depth: int = 16) -> dict[str, Any]:
    """The tree of subject epochs that epoch ``epoch`` of ``job`` derives from (``depth`` levels)."""
    jobs = JobLedger(ledger)
    node = jobs.job(job)
    try:
        committed = ledger.is_committed(node.output, epoch)
    except EpochNotCommittedError as exc:  # no such epoch at all
        raise LineageError(f"job {job!r} has no epoch {epoch}: {exc}") from None
    if not committed:
        raise LineageError(f"epoch {epoch} of job {job!r} (its output {node.output!r}) is not committed yet; "
                           f"it has no lineage yet")
    covered = jobs.job_epoch(jobs.epoch_line(job), epoch)  # a new version uses the first version's epochs
    entry: dict[str, Any] = {"job": job, "epoch": epoch, "output": node.output}
    if covered is None:
        entry["aligned"] = False
        offsets = {}
        for worker in range(node.parallelism):
            recorded = jobs.worker_epoch_or_none(job, worker, epoch)
            if recorded is not None:  # else pruned by gc, or another version wrote the epoch
                offsets[worker] = recorded.offsets
        entry["input_offsets"] = offsets
        entry["inputs"] = []
        return entry
    entry["aligned"] = True
    entry["inputs"] = [
        subject_epoch_lineage(ledger, subject, e, depth - 1)
        for subject, span in sorted(covered.covered.items()) if span is not None
        for e in range(span.first, span.last + 1)
    ] if depth > 0 else []
    return entry


def subject_epoch_lineage(ledger: Ledger, subject: str, epoch: int, depth: int = 16) -> dict[str, Any]:
    """The tree of an epoch of ``subject``: the jobs that wrote it and, through them, their inputs."""
    if not ledger.is_committed(subject, epoch):
        raise LineageError(f"epoch {epoch} of {subject!r} is not committed; it has no lineage yet")
    writers = ledger.epoch_node(subject, epoch).writers
    jobs = JobLedger(ledger)
    producers: list[dict[str, Any]] = []
    for sink in sorted({split_writer(w)[0] for w in writers}):
        try:
            job = jobs.job(sink)
        except UnknownJobError:
            producers.append({"sink": sink, "job": None})
            continue
        if job.output == subject and depth > 0:
            producers.append({"sink": sink, **job_epoch_lineage(ledger, sink, epoch, depth)})
    return {"subject": subject, "epoch": epoch, "producers": producers}


def flatten(tree: dict[str, Any]) -> dict[str, list[int]]:
    """All subject epochs a lineage tree contains, per subject (the consistent cut to read)."""
    out: dict[str, set[int]] = {}

    def walk(node: dict[str, Any]) -> None:
        if "subject" in node and "producers" in node:
            out.setdefault(node["subject"], set()).add(node["epoch"])
            for p in node["producers"]:
                walk(p)
        for child in node.get("inputs", []):
            walk(child)

    walk(tree)
    return {s: sorted(e) for s, e in sorted(out.items())}


# ---- the Spark adapter's lineage records ------------------------------------------------------------


class SparkLineageLedger:
    """Where Spark queries record lineage, and the reads and create-if-absent writes of those records.

    Layout (under the ledger root)::

        subjects/{subject}/sinks/{sink}/spark/epochs/{epoch:010d}   which micro-batch wrote a sink epoch
        spark/queries/{queryId}/batches/{batch:012d}/{subject}      which subject epochs a micro-batch read

    Methods take the node model from the caller (the Spark adapter defines it), like ``Ledger.read``.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    # ---- paths --------------------------------------------------------------------------------

    def progress_path(self, subject: str, sink: str) -> str:
        return f"{self.ledger.layout.sink(subject, sink)}/spark"

    def sink_epochs_path(self, subject: str, sink: str) -> str:
        return f"{self.progress_path(subject, sink)}/epochs"

    def sink_epoch_path(self, subject: str, sink: str, epoch: int) -> str:
        return f"{self.sink_epochs_path(subject, sink)}/{epoch_name(epoch)}"

    def query_batches_path(self, query: str) -> str:
        return f"{self.ledger.layout.root}/spark/queries/{query}/batches"

    def batch_path(self, query: str, batch: int) -> str:
        return f"{self.query_batches_path(query)}/{batch:012d}"

    def source_batch_path(self, query: str, batch: int, subject: str) -> str:
        return f"{self.batch_path(query, batch)}/{subject}"

    # ---- source batches -----------------------------------------------------------------------

    def record_source_batch(self, node: M, query: str, batch: int, subject: str, kept: int) -> M:
        """Create-if-absent the record of what micro-batch ``batch`` read of ``subject``; returns the
        record that stands (an earlier one wins: the caller compares). A new record drops the batch
        ``kept`` batches older, so a query's records stay bounded."""
        path = self.source_batch_path(query, batch, subject)
        try:
            self.ledger.zk.create(path, node.dump(), makepath=True)
        except NodeExistsError:
            return parse(type(node), path, self.ledger.zk.get(path)[0])
        if batch >= kept:
            with contextlib.suppress(NoNodeError):
                self.ledger.zk.delete(self.batch_path(query, batch - kept), recursive=True)
        return node

    def source_batch(self, model: type[M], query: str, batch: int) -> dict[str, M]:
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
                out[name] = parse(model, path, self.ledger.zk.get(path)[0])
        return out

    def queries(self) -> list[str]:
        """Ids of the streaming queries that recorded micro-batches."""
        try:
            return sorted(self.ledger.zk.get_children(f"{self.ledger.layout.root}/spark/queries"))
        except NoNodeError:
            return []

    def last_batch(self, query: str) -> int | None:
        """The newest micro-batch a query recorded (None: none)."""
        try:
            names = self.ledger.zk.get_children(self.query_batches_path(query))
        except NoNodeError:
            return None
        return max((int(n) for n in names), default=None)

    def write_progress(self, node: Node, subject: str, sink: str, version: int) -> None:
        """Record a sink's progress without an epoch commit (a batch whose output was voided before its
        producers' first epoch): created with its epochs folder the first time, else compare-and-set."""
        path = self.progress_path(subject, sink)
        try:
            if version < 0:
                t = self.ledger.zk.transaction()
                t.create(path, node.dump())
                t.create(self.sink_epochs_path(subject, sink), b"")
                results = t.commit()
                failed = [r for r in results if isinstance(r, Exception)]
                if failed:
                    raise failed[0]
            else:
                self.ledger.zk.set(path, node.dump(), version=version)
        except (BadVersionError, NodeExistsError) as exc:
            raise FencedError(f"the progress of sink {sink!r} on {subject!r} changed concurrently "
                              f"({type(exc).__name__}); nothing was recorded") from exc

    # ---- sink epochs --------------------------------------------------------------------------

    def sink_epoch(self, model: type[M], subject: str, sink: str, epoch: int) -> M | None:
        """Which micro-batch wrote epoch ``epoch`` of ``subject`` through Spark sink ``sink`` (None: none)."""
        path = self.sink_epoch_path(subject, sink, epoch)
        try:
            raw, _ = self.ledger.zk.get(path)
        except NoNodeError:
            return None
        return parse(model, path, raw)

    def sink_epoch_numbers(self, subject: str, sink: str) -> list[int]:
        """The epochs of ``subject`` that the Spark sink ``sink`` recorded, in order."""
        try:
            return sorted(int(n) for n in self.ledger.zk.get_children(self.sink_epochs_path(subject, sink)))
        except NoNodeError:
            return []

    def sink_subjects(self, sink: str) -> list[str]:
        """Subjects that a Spark sink with this id writes."""
        return [s for s in self.ledger.subject_names() if self.ledger.zk.exists(self.progress_path(s, sink))]
