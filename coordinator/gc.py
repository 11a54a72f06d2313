"""`aligner gc`: drop ZooKeeper state that no reader, restart or lineage query can still need.

Retention: keep the last N committed epochs of every subject (or those younger than T seconds),
but never an epoch a job's consumer has not consumed yet. The retention floor is written before
anything is deleted, so reading a collected epoch is a clear out-of-retention error. A job
swapped out by a hot-swap loses its worker and source state; its aligned job epochs stay for
lineage (the new version follows them) and are pruned like the rest.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from kazoo.exceptions import NoNodeError

from aligner.jobs import JobLedger
from aligner.ledger import Ledger


def collect(ledger: Ledger, keep_epochs: int, keep_seconds: float | None = None,
            subjects: list[str] | None = None, dry_run: bool = False) -> dict[str, Any]:
    jobs = JobLedger(ledger)
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
        if dry_run or not victims:
            continue
        path = ledger.layout.retention(subject)
        try:
            ledger.zk.set(path, str(floor).encode())
        except NoNodeError:
            ledger.zk.create(path, str(floor).encode())
        for e in victims:
            ledger.zk.delete(ledger.layout.epoch(subject, e), recursive=True)
    for job in job_nodes:
        report["jobs"][job.job] = _collect_job(ledger, jobs, job.job, keep_epochs, dry_run)
    return report


def _collect_job(ledger: Ledger, jobs: JobLedger, job: str, keep: int, dry_run: bool) -> dict[str, Any]:
    lay = ledger.layout
    deleted = 0
    numbers = jobs.job_epoch_numbers(job)
    old_job_epochs = numbers[:-keep] if len(numbers) > keep else []
    swap, _ = jobs.swap(job)
    swapped_out = swap is not None and swap.phase == "done" and swap.old == job
    workers_path = f"{lay.job(job)}/workers"
    try:
        workers = ledger.zk.get_children(workers_path)
    except NoNodeError:
        workers = []
    victims = [lay.job_epoch(job, e) for e in old_job_epochs]
    for w in workers:
        epochs = sorted(ledger.zk.get_children(lay.worker_epochs(job, int(w))))
        victims += [f"{lay.worker_epochs(job, int(w))}/{e}" for e in (epochs if swapped_out else epochs[:-keep])]
    if swapped_out:
        victims += [workers_path, f"{lay.job(job)}/sources", lay.decision(job)]
    if not dry_run:
        for path in victims:
            with contextlib.suppress(NoNodeError):
                ledger.zk.delete(path, recursive=True)
                deleted += 1
    return {"deleted_nodes": deleted if not dry_run else len(victims), "swapped_out": swapped_out}
