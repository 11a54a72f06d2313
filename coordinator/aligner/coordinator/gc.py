"""Retention: drop ZooKeeper state that no reader, restart, swap or lineage query can still need.

One policy (:class:`aligner.retention_policy.RetentionPolicy`: keep 24 h and at least 1,000 epochs
per subject by default), applied by the leading coordinator every interval (``aligner retention``)
and by hand (``aligner gc``, whose flags override its bounds). Per subject the floor is the policy's,
lowered to what is still needed: every job consumer's position, a swap in flight (nothing of its
target from S on), a shadow lane and its target (kept together for ``aligner verify``). The floor is
written before anything is deleted, so reading a collected epoch is a clear out-of-retention error.
Below it go the epochs, the Spark sinks' lineage records and the producer nodes of swapped-out jobs;
Spark queries' micro-batch records whose epochs are all gone; worker records but the last N (all of
them while a new version following the job has a worker without a record: it may still inherit); job
epochs below the output's floor but the last N; and what a job swapped out leaves (worker, source
and decision state, once its sink finished; its changelog too, once every version following it committed
a record for each worker). A job's changelog (``{job}.state``) is collected like a
subject but never below a state base a retained worker epoch restores from (the oldest retained
record's ``state_base`` of each worker; a record without one holds the whole changelog), and a
changelog no job owns is never collected. This module chooses; ``aligner.retention`` deletes.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from aligner.errors import AlignerError
from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.models import JobNode, SwapNode
from aligner.retention import Retention
from aligner.retention_policy import (
    CHANGELOG_SUFFIX,
    RetentionPolicy,
    collectable,
    needed_floor,
    policy_from_env,
    retention_floor,
    victims,
)

_SETTLED = ("done", "aborted")


class Needs:
    """What the jobs still need, read once per pass: per subject the lowest epoch some reader needs."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
        self.nodes: list[JobNode] = [self.jobs.job(j) for j in self.jobs.job_names()]
        self.swaps: dict[str, SwapNode] = {}
        for node in self.nodes:
            swap, _ = self.jobs.swap(node.job)
            if swap is not None:
                self.swaps[node.job] = swap
        self.floors: dict[str, list[int]] = {}
        self.changelogs: set[str] = set()
        """Changelog subjects whose owners' needs were read (only those may be collected)."""
        for node in self.nodes:
            self.changelogs.add(f"{node.job}{CHANGELOG_SUFFIX}")
            if not self.swapped_out(node.job):
                self._consumers(node)
                self._state_bases(node)
        self._swaps_in_flight()
        self.dropped: set[str] = {f"{n.job}{CHANGELOG_SUFFIX}" for n in self.nodes if self._state_handed_over(n)}
        """Changelogs of swapped-out versions that nothing reads again: all their epochs go."""

    def _state_handed_over(self, node: JobNode) -> bool:
        """A swapped-out version whose sink finished, and each version following it has a committed record for
        every worker: those restore from their own changelog (a new version that inherited the state wrote it
        whole into its own with its first epoch), so the old changelog is read by nobody again."""
        if not self.swapped_out(node.job) or not self.finished_sink(self.ledger, node.job, self.swaps[node.job].target):
            return False
        return not any(n.follows == node.job and not self.committed_everywhere(n) for n in self.nodes)

    def committed_everywhere(self, node: JobNode) -> bool:
        """Every worker of ``node`` has a committed record. Until then a new version's worker may still be
        starting: it takes the old version's state as of the epoch before its first (the old worker's record
        of that epoch and the changelog from its base), however long its start takes."""
        workers = self.jobs.worker_ids(node.job)
        return len(workers) >= node.parallelism and all(self.jobs.worker_epoch_numbers(node.job, w) for w in workers)

    def swapped_out(self, job: str) -> bool:
        swap = self.swaps.get(job)
        return swap is not None and swap.phase == "done" and swap.old == job

    def _need(self, subject: str, epoch: int) -> None:
        self.floors.setdefault(subject, []).append(epoch)

    def _consumers(self, node: JobNode) -> None:
        for subject in node.inputs:
            try:
                consumers = self.jobs.consumers(node.job, subject)
            except AlignerError:  # no source state any more (cleared): it needs nothing of this input
                continue
            for c in consumers.values():
                self._need(subject, needed_floor(c.subject_epoch))
            if len(consumers) < node.parallelism:  # a worker not started yet reads from the start of retention
                self._need(subject, self.ledger.subjects.first_retained(subject))
        self._restarts(node)

    def _restarts(self, node: JobNode) -> None:
        """A worker restarts from its last committed worker epoch: the epochs it would load again stay
        (its consumer report may run ahead of that record)."""
        for worker in self.jobs.worker_ids(node.job):
            numbers = self.jobs.worker_epoch_numbers(node.job, worker)
            last = self.jobs.worker_epoch_or_none(node.job, worker, numbers[-1]) if numbers else None
            for subject, first in (last.load_from.items() if last is not None else ()):
                self._need(subject, first)

    def _state_bases(self, node: JobNode) -> None:
        """A worker restores its state from the base of a retained worker epoch: the oldest one's base
        stays (a worker without records, or a record without a base, holds the whole changelog)."""
        changelog = f"{node.job}{CHANGELOG_SUFFIX}"
        workers = self.jobs.worker_ids(node.job)
        if len(workers) < node.parallelism:
            self._need(changelog, 0)
        for worker in workers:
            numbers = self.jobs.worker_epoch_numbers(node.job, worker)
            oldest = self.jobs.worker_epoch_or_none(node.job, worker, numbers[0]) if numbers else None
            self._need(changelog, 0 if oldest is None or oldest.state_base is None else oldest.state_base)

    def _swaps_in_flight(self) -> None:
        for swap in self.swaps.values():
            if swap.phase not in _SETTLED:
                self._need(swap.target, swap.epoch)

    def pairs(self) -> list[tuple[str, str]]:
        """(shadow, target) lanes ``aligner verify`` compares: their floors move together."""
        out = []
        for node in self.nodes:
            old = next((n for n in self.nodes if n.job == node.follows), None)
            if node.shadow and old is not None and not self.swapped_out(old.job):
                out.append((node.shadow, old.output))
        return out

    def of(self, subject: str) -> list[int]:
        return self.floors.get(subject, [])

    def finished_sink(self, ledger: Ledger, job: str, target: str) -> bool:
        """Whether the swapped-out ``job``'s producers on ``target`` all finished (it writes no more)."""
        try:
            doc, _ = ledger.subjects.writers(target)
        except AlignerError:
            return True
        mine = [e for w, e in doc.writers.items() if split_writer(w)[0] == job]
        return all(e.finished_after is not None for e in mine)


def subject_floors(ledger: Ledger, policy: RetentionPolicy, needs: Needs,
                   subjects: list[str]) -> dict[str, tuple[int, list[int]]]:
    """Each collectable subject's new floor under ``policy`` and ``needs`` (shadow lanes tied together),
    with its epoch numbers."""
    now_ms = time.time() * 1000
    floors: dict[str, tuple[int, list[int]]] = {}
    for subject in subjects:
        if not collectable(subject, needs.changelogs):
            continue
        numbers = ledger.subjects.epoch_numbers(subject)
        if subject in needs.dropped:  # a swapped-out version's changelog: nothing reads it again
            floors[subject] = max(numbers[-1] + 1 if numbers else 0, ledger.subjects.first_retained(subject)), numbers
            continue
        epoch_time = partial(ledger.epochs.epoch_time, subject)
        floor = retention_floor(numbers, ledger.epochs.frontier(subject, numbers), epoch_time,
                                now_ms, policy, needs.of(subject), ledger.subjects.first_retained(subject))
        floors[subject] = floor, numbers
    for shadow, target in needs.pairs():
        if shadow in floors and target in floors:
            low = min(floors[shadow][0], floors[target][0])
            for s in (shadow, target):
                floors[s] = max(low, ledger.subjects.first_retained(s)), floors[s][1]
    return floors


def collect(ledger: Ledger, keep_epochs: int | None = None, keep_seconds: float | None = None,
            subjects: list[str] | None = None, dry_run: bool = False,
            policy: RetentionPolicy | None = None) -> dict[str, Any]:
    """One retention pass; ``keep_epochs``/``keep_seconds`` override the policy's bounds (``aligner gc``)."""
    policy = (policy or policy_from_env()).with_bounds(keep_epochs, keep_seconds)
    retention, needs = Retention(ledger), Needs(ledger)
    report: dict[str, Any] = {"subjects": {}, "jobs": {}, "deleted_nodes": 0, "spark_batches": 0,
                              "enabled": policy.enabled}
    if not policy.enabled:
        return report
    names = subjects or ledger.subjects.subject_names()
    for subject, (floor, numbers) in subject_floors(ledger, policy, needs, names).items():
        gone = victims(numbers, floor)
        report["subjects"][subject] = {"first_retained": floor, "deleted_epochs": len(gone)}
        if not dry_run:
            report["deleted_nodes"] += retention.collect_subject(subject, floor, gone)
            gone_sinks = [j for j in needs.swaps if needs.swapped_out(j) and needs.finished_sink(ledger, j, subject)]
            report["deleted_nodes"] += retention.delete(retention.dead_producers(subject, floor, gone_sinks), depth=0)
            forgotten = retention.forget_writers(subject, floor, gone_sinks)
            if forgotten:
                report["subjects"][subject]["forgotten_writers"] = forgotten
    report["jobs"] = _collect_jobs(ledger, retention, needs, policy, dry_run)
    report["deleted_nodes"] += 0 if dry_run else sum(j["deleted_nodes"] for j in report["jobs"].values())
    if not dry_run and subjects is None:
        kept = {s: ledger.subjects.first_retained(s) for s in ledger.subjects.subject_names()}
        report["spark_batches"] = retention.delete(retention.query_batch_garbage(kept), depth=1)
        report["deleted_nodes"] += report["spark_batches"]
    return report


def _collect_jobs(ledger: Ledger, retention: Retention, needs: Needs, policy: RetentionPolicy,
                  dry_run: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    followed = {n.follows for n in needs.nodes if n.follows and not needs.swapped_out(n.follows)}
    inherited = {n.follows for n in needs.nodes if n.follows and not needs.committed_everywhere(n)}
    for node in needs.nodes:
        swapped_out = needs.swapped_out(node.job)
        if swapped_out and not needs.finished_sink(ledger, node.job, needs.swaps[node.job].target):
            swapped_out = False  # its sink has not finished yet: its state stays until it has
        keep_from = None if node.job in followed else ledger.subjects.first_retained(node.output)
        garbage = retention.job_garbage(node.job, policy.min_epochs, swapped_out,
                                        keep_from=keep_from if keep_from is not None else -1,
                                        workers=node.job not in inherited)
        deleted = len(garbage) if dry_run else retention.delete(garbage)
        out[node.job] = {"deleted_nodes": deleted, "swapped_out": needs.swapped_out(node.job)}
    return out
