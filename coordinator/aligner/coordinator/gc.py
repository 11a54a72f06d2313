"""`aligner gc`: drop ZooKeeper state that no reader, restart or lineage query can still need.

Retention: keep the last N committed epochs of every subject (or those younger than T seconds),
but never an epoch a job's consumer has not consumed yet. The retention floor is written before
anything is deleted, so reading a collected epoch is a clear out-of-retention error. A job
swapped out by a hot-swap loses its worker and source state; its aligned job epochs stay for
lineage (the new version follows them) and are pruned like the rest. This module is the policy;
``aligner.retention`` does the deletes.
"""

from __future__ import annotations

import time
from typing import Any

from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from aligner.retention import Retention


def collect(ledger: Ledger, keep_epochs: int, keep_seconds: float | None = None,
            subjects: list[str] | None = None, dry_run: bool = False) -> dict[str, Any]:
    jobs = JobLedger(ledger)
    retention = Retention(ledger)
    job_nodes = [jobs.job(j) for j in jobs.job_names()]
    report: dict[str, Any] = {"subjects": {}, "jobs": {}}
    now_ms = time.time() * 1000
    for subject in subjects or ledger.subject_names():
        frontier = ledger.frontier(subject)
        numbers = ledger.epoch_numbers(subject)
        if frontier is None or not numbers:
            continue
        floor = frontier - keep_epochs + 1
        for job in job_nodes:
            if subject in job.inputs:
                for c in jobs.consumers(job.job, subject).values():
                    floor = min(floor, (c.subject_epoch if c.subject_epoch is not None else -1) + 1)
        if keep_seconds is not None:
            while floor - 1 >= numbers[0] and ledger.is_committed(subject, floor - 1) and \
                    ledger.committed(subject, floor - 1).committed_at > now_ms - keep_seconds * 1000:
                floor -= 1
        floor = max(floor, ledger.first_retained(subject))
        victims = [e for e in numbers if e < floor]
        report["subjects"][subject] = {"first_retained": floor, "deleted_epochs": len(victims)}
        if not dry_run and victims:
            retention.collect_subject(subject, floor, victims)
    for job in job_nodes:
        swap, _ = jobs.swap(job.job)
        swapped_out = swap is not None and swap.phase == "done" and swap.old == job.job
        garbage = retention.job_garbage(job.job, keep_epochs, swapped_out)
        deleted = len(garbage) if dry_run else retention.delete(garbage)
        report["jobs"][job.job] = {"deleted_nodes": deleted, "swapped_out": swapped_out}
    return report
