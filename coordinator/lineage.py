"""Lineage: which upstream subject epochs an epoch of a job or a subject contains, transitively.

A job's epoch N is its output subject's epoch N. An aligned job epoch records the subject epochs
it covered, so lineage is exact; an unaligned one only knows its input offsets, reported as such.
"""

from __future__ import annotations

from typing import Any

from kazoo.exceptions import NoNodeError

from aligner.errors import AlignerError, EpochNotCommittedError
from aligner.jobs import JobLedger, UnknownJobError
from aligner.layout import split_writer
from aligner.ledger import Ledger


def job_epoch_lineage(ledger: Ledger, job: str, epoch: int, depth: int = 16) -> dict[str, Any]:
    jobs = JobLedger(ledger)
    node = jobs.job(job)
    try:
        committed = ledger.is_committed(node.output, epoch)
    except EpochNotCommittedError as exc:  # no such epoch at all
        raise AlignerError(f"job {job!r} has no epoch {epoch}: {exc}") from None
    if not committed:
        raise AlignerError(f"epoch {epoch} of job {job!r} (its output {node.output!r}) is not committed yet; "
                           f"it has no lineage yet")
    covered = jobs.job_epoch(node.follows or job, epoch)  # a new version uses the old one's epochs
    entry: dict[str, Any] = {"job": job, "epoch": epoch, "output": node.output}
    if covered is None:
        entry["aligned"] = False
        offsets = {}
        for worker in range(node.parallelism):
            try:
                offsets[worker] = jobs.worker_epoch(job, worker, epoch).offsets
            except NoNodeError:
                continue  # this worker has no record of the epoch (pruned by gc, or another version wrote it)
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
    if not ledger.is_committed(subject, epoch):
        raise AlignerError(f"epoch {epoch} of {subject!r} is not committed; it has no lineage yet")
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
