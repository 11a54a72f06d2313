"""The driver's commit of a Spark micro-batch: one ledger recipe call, from the plan its tasks carried back.

Every slot's task returns a :class:`SlotCommit` holding the :class:`~aligner.connectors.spark.plan.BatchPlan`
the batch was written from; the commit builds every contribution, the sink's progress and the epoch's lineage
from it and the messages, and makes them one multi-op (:class:`aligner.recipes.spark.SparkBatchRecipes`),
the epoch node included. Whatever changed since the plan (a zombie driver, a restarted one) fails a version
check of that multi-op, and nothing is committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

from aligner.connectors.spark.common import spark_recipes
from aligner.connectors.spark.job_node import awaits, batch_writes, report, wait_target
from aligner.connectors.spark.lineage import spark_lineage
from aligner.connectors.spark.models import SparkProgressNode, SparkSinkEpochNode
from aligner.connectors.spark.plan import BatchPlan, SinkSpec, load_slots
from aligner.connectors.stamped import epoch_ranges
from aligner.errors import AlignerError
from aligner.ledger import Contribution, Lease, Ledger
from aligner.models import Range

log = logging.getLogger(__name__)


@dataclass
class SlotCommit(WriterCommitMessage):
    """What one successful task attempt wrote, and the plan it wrote from."""

    slot: int
    epoch: int | None
    attempt: int | None
    last: dict[int, int] = field(default_factory=dict)
    records: int = 0
    query: str | None = None
    counts: dict[int, int] = field(default_factory=dict)
    """Records written per partition: readers skip stamp checks where a range holds nothing else."""
    shadow: bool = False
    """Written to the job's shadow subject (a voided batch of a new version in shadow mode)."""
    plan: BatchPlan | None = None


def slot_contributions(leases: Sequence[Lease], by_slot: dict[int, SlotCommit], batch_id: int) -> list[Contribution]:
    """Every slot's contribution to the epoch: what its task attempt wrote, or empty ranges (no task,
    or a task without rows)."""
    contributions = []
    for i, lease in enumerate(leases):
        m = by_slot.get(i)
        if m is None or m.attempt is None:
            ranges = {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()}
            contributions.append(Contribution(lease, 0, ranges))
            continue
        ranges = epoch_ranges(lease.node.next_offsets, m.last, m.counts, f"batch {batch_id} producer {i}")
        contributions.append(Contribution(lease, m.attempt, ranges, m.counts or None))
    return contributions


@dataclass(frozen=True)
class BatchCommit:
    """One micro-batch's commit messages with the plan they were written from."""

    spec: SinkSpec
    plan: BatchPlan
    batch: int
    messages: tuple[SlotCommit, ...]

    @classmethod
    def of(cls, spec: SinkSpec, messages: Sequence[object], batch: int,
           fallback: Callable[[], BatchPlan]) -> BatchCommit:
        """The batch's commit messages with the plan they carried back; ``fallback()`` plans the batch only when
        none carries one."""
        msgs = tuple(m for m in messages if isinstance(m, SlotCommit))
        plan = next((m.plan for m in msgs if m.plan is not None), None)
        return cls(spec, plan if plan is not None else fallback(), batch, msgs)

    @property
    def query(self) -> str | None:
        return next((m.query for m in self.messages if m.query), None)

    def committed_before(self) -> bool:
        """A batch Spark runs again after a restart: its (query, batch) is the sink's progress already."""
        progress = self.plan.progress
        return progress is not None and progress.query == self.query and self.batch <= progress.batch

    def by_slot(self, epoch: int) -> dict[int, SlotCommit]:
        """The target's messages by slot, each checked to have stamped ``epoch``."""
        out: dict[int, SlotCommit] = {}
        for m in self.messages:
            if m.shadow:
                continue
            if m.slot in out:
                raise AlignerError(f"batch {self.batch}: two commit messages for producer {m.slot} of sink "
                                   f"{self.spec.sink!r}")
            if m.epoch is not None and m.epoch != epoch:
                raise AlignerError(
                    f"batch {self.batch}: producer {m.slot} of sink {self.spec.sink!r} stamped epoch {m.epoch} but "
                    f"the sink's next epoch is {epoch}; another writer committed meanwhile, nothing was committed")
            out[m.slot] = m
        return out


def commit_batch(ledger: Ledger, commit: BatchCommit, job_epoch: int | None = None) -> int | None:
    """The driver's commit of one micro-batch as one epoch: one ZooKeeper multi-op. Returns the epoch,
    or None when this (query, batch) was committed before (a re-run after a restart)."""
    if commit.committed_before():
        return None
    plan, subject, sink = commit.plan, commit.spec.conn.subject, commit.spec.sink
    epoch = plan.epoch
    contributions = slot_contributions(plan.leases, commit.by_slot(epoch), commit.batch)
    progress = SparkProgressNode(query=commit.query, batch=commit.batch, epoch=epoch, producers=len(plan.leases),
                                 job_epoch=job_epoch)
    lineage = SparkSinkEpochNode(query=commit.query, batch=commit.batch, epoch=epoch)
    spark_recipes(ledger).commit_sink_batch(subject, sink, commit.batch, epoch, contributions, progress,
                                            plan.progress_version, lineage, writers=plan.writers)
    return epoch


def job_span(ledger: Ledger, query: str | None, batch_id: int) -> tuple[tuple[int, int], dict[str, int]] | None:
    """The job epochs a micro-batch of a job's query covers (recorded by its read tasks), and the last
    subject epoch it read per subject; None when its read tasks recorded nothing (a no-data batch)."""
    read = spark_lineage(ledger).source_batch(query, batch_id) if query else {}
    if not read:
        return None
    spans = {(r.job_first, r.job_last) for r in read.values() if r.job_first is not None and r.job_last is not None}
    if len(spans) != 1:
        raise AlignerError(f"micro-batch {batch_id} of query {query} recorded no job epochs ({sorted(spans)}): "
                           "read it with option job on the aligned source too")
    return spans.pop(), {s: r.last for s, r in read.items()}


def commit_job_batch(ledger: Ledger, commit: BatchCommit) -> int | None:
    """The commit of a micro-batch of a query running as job ``spec.job``: its job epochs [a, b].

    Written (the old version, or the new one after the swap; then a == b): epoch b of the target,
    after S for the new version's S+1. Voided (the new version up to S): the target epochs from the
    producers' next one to b close empty, the last with the batch's progress, so a re-run after a
    restart is recognised; a batch entirely before the producers' first epoch records its progress only.
    Returns the target epoch it committed with the progress, or None."""
    plan = commit.plan
    assert plan.node is not None
    node, swap = plan.node, plan.swap
    if commit.committed_before():
        return None
    ledger.sync()  # the batch's lineage was recorded by its read tasks' sessions: read it as it is now
    read = job_span(ledger, commit.query, commit.batch)
    if read is None:
        if any(m.attempt is not None for m in commit.messages):
            raise AlignerError(f"micro-batch {commit.batch} of job {node.job!r} wrote records but its read tasks "
                               "recorded no job epochs: read it with option job on the aligned source too")
        log.info("job %s: micro-batch %d read no job epoch (a no-data batch); nothing to commit", node.job,
                 commit.batch)
        return None
    (first, last), subject_epochs = read
    if batch_writes(node, swap, first):
        if first != last:
            raise AlignerError(f"micro-batch {commit.batch} of job {node.job!r} writes job epochs {first}..{last}; "
                               "a written batch is one job epoch")
        if awaits(node, swap, first):
            assert swap is not None
            wait_target(ledger, node, swap)
        epoch = commit_batch(ledger, commit, job_epoch=last)
    else:
        if any(m.attempt is not None and not m.shadow for m in commit.messages):
            raise AlignerError(f"micro-batch {commit.batch} of job {node.job!r} is voided but a task wrote records")
        epoch = _commit_void(ledger, commit, (first, last), _shadow_contributions(ledger, commit, last))
    report(ledger, node, job_epoch=last, subject_epoch=subject_epochs)
    return epoch


def _shadow_contributions(ledger: Ledger, commit: BatchCommit, last: int) -> list[Contribution]:
    """A shadowing new version's voided batch: its records in the shadow subject, as epoch ``last``
    (the planner brought the shadow's producers there before the batch's tasks stamped)."""
    node = commit.plan.node
    assert node is not None
    if node.shadow is None:
        return []
    leases = load_slots(ledger, node.shadow, node.job, range(len(commit.plan.leases)))
    by_slot = {m.slot: m for m in commit.messages if m.shadow}
    if any(lease.next_epoch != last for lease in leases) or any(m.epoch != last for m in by_slot.values()):
        raise AlignerError(f"micro-batch {commit.batch} of job {node.job!r}: its shadow {node.shadow!r} is not at "
                           f"epoch {last} (producers at {sorted({lease.next_epoch for lease in leases})}); nothing "
                           "was committed")
    ledger.commits.ensure_epoch(node.shadow, last)
    return slot_contributions(leases, by_slot, commit.batch)


def _commit_void(ledger: Ledger, commit: BatchCommit, span: tuple[int, int], shadow: list[Contribution]) -> int | None:
    """A voided batch: the target's epochs up to ``last`` close empty, the last one with the batch's progress."""
    subject, sink, plan = commit.spec.conn.subject, commit.spec.sink, commit.plan
    first, last = span
    leases = list(plan.leases)
    nxt = min(lease.next_epoch for lease in leases)
    progress = SparkProgressNode(query=commit.query, batch=commit.batch, epoch=last if nxt <= last else None,
                                 producers=len(leases), job_epoch=last)
    empties: list[Contribution] = []
    if nxt <= last:
        leases = [ledger.commits.close_empty(lease, last) for lease in leases]
        ledger.commits.ensure_epoch(subject, last)
        empties = [Contribution(lease, None, {p: Range(start=o, end=o) for p, o in lease.node.next_offsets.items()})
                   for lease in leases]
    # The micro-batch's record as the lineage of target epoch ``last`` only when the batch covers that job epoch
    # alone: a catch-up batch read the input of every job epoch it covers, not of ``last``'s (the job epoch
    # nodes hold each epoch's exact lineage). The progress alone when it closes nothing.
    lineage = SparkSinkEpochNode(query=commit.query, batch=commit.batch, epoch=last) if empties and first == last \
        else None
    spark_recipes(ledger).commit_sink_batch(subject, sink, commit.batch, last, [*empties, *shadow], progress,
                                            plan.progress_version, lineage)
    return last if empties or shadow else None
