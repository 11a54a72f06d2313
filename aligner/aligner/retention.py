"""The deletes of ``aligner gc``: the only place that removes ledger state, and only what a policy chose.

The policy (how many epochs to keep, which ones a consumer still needs) is the coordinator's;
this module knows where the records live and removes them in a safe order: a subject's retention
floor is written before any epoch below it is deleted, so a reader that meets a collected epoch
gets a clear out-of-retention error instead of a missing node.
"""

from __future__ import annotations

import contextlib

from kazoo.exceptions import NoNodeError

from aligner.jobs import JobLedger
from aligner.ledger import Ledger


class Retention:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.jobs = JobLedger(ledger)

    def collect_subject(self, subject: str, floor: int, epochs: list[int]) -> None:
        """Record ``floor`` as the subject's first retained epoch, then delete ``epochs`` (all below it)."""
        zk, path = self.ledger.zk, self.ledger.layout.retention(subject)
        try:
            zk.set(path, str(floor).encode())
        except NoNodeError:
            zk.create(path, str(floor).encode())
        for e in epochs:
            zk.delete(self.ledger.layout.epoch(subject, e), recursive=True)

    def job_garbage(self, job: str, keep: int, swapped_out: bool) -> list[str]:
        """The records of ``job`` past retention: all but its last ``keep`` job epochs and, per worker,
        all but its last ``keep`` epoch records; a job swapped out also loses its worker, source and
        decision state (its job epochs stay for lineage: the new version follows them)."""
        lay = self.ledger.layout
        numbers = self.jobs.job_epoch_numbers(job)
        victims = [lay.job_epoch(job, e) for e in (numbers[:-keep] if len(numbers) > keep else [])]
        for w in self.jobs.worker_ids(job):
            epochs = self.jobs.worker_epoch_numbers(job, w)
            victims += [lay.worker_epoch(job, w, e) for e in (epochs if swapped_out else epochs[:-keep])]
        if swapped_out:
            victims += [lay.workers(job), lay.sources(job), lay.decision(job)]
        return victims

    def delete(self, paths: list[str]) -> int:
        """Delete each node and its children; returns how many existed (others removed them meanwhile)."""
        deleted = 0
        for path in paths:
            with contextlib.suppress(NoNodeError):
                self.ledger.zk.delete(path, recursive=True)
                deleted += 1
        return deleted
