"""A Spark query's job: its registration and what both its planner and its sink need (no Spark import).

The sink's commit (``spark/writer.py``) and the planner (``spark/job.py``) decide with the same
helpers, so a batch is voided or written, and S+1 waits for S at the target, by one rule
(:mod:`aligner.epoch_step`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aligner import epoch_step
from aligner.alignment import ConsumerAlignment, State
from aligner.connectors.swap_gate import await_target
from aligner.errors import AlignedOptionError, UnknownJobError
from aligner.ledger import Ledger
from aligner.models import ConsumerNode, JobNode, SwapNode


def register_query(ledger: Ledger, job: str, inputs: Sequence[str], output: str, follows: str | None = None,
                   output_partitions: Sequence[int] | None = None, version: str = "1",
                   shadow: bool = False) -> JobNode:
    """Register a Spark query as aligned job ``job`` (idempotent: a restart registers the same node).

    ``shadow`` (a new version only): what it voids at the target before the swap goes to its private
    subject ``{job}.shadow``, one epoch per job epoch, for ``aligner verify`` / ``hotswap --verify-epochs``."""
    if shadow and follows is None:
        raise AlignedOptionError(f"job {job!r}: only a new version (follows=OLD) writes a shadow subject")
    node = JobNode(job=job, version=version, inputs=tuple(inputs), output=output, parallelism=1, mode="aligned",
                   follows=follows, output_partitions=tuple(output_partitions) if output_partitions else None,
                   shadow=f"{job}.shadow" if shadow else None, engine="spark")
    return ledger.jobs.register(node)


def job_of(ledger: Ledger, job: str) -> JobNode:
    try:
        return ledger.jobs.job(job)
    except UnknownJobError:
        raise AlignedOptionError(f"option job={job!r} names no registered job: register the query first "
                                 "(aligner.connectors.spark.job.register_query)") from None


def output_partitions(ledger: Ledger, node: JobNode) -> tuple[int, ...]:
    """The target partitions the job's sink writes (one producer per partition)."""
    return node.output_partitions or tuple(range(ledger.subjects.subject(node.output).partitions))


def swap_in(ledger: Ledger, node: JobNode) -> SwapNode | None:
    """The hot-swap that hands the target to the job: its predecessor's (None for a first version)."""
    return ledger.jobs.swap(node.follows)[0] if node.follows is not None else None


def swap_out(ledger: Ledger, node: JobNode) -> SwapNode | None:
    """The hot-swap of the job itself for a newer version."""
    return ledger.jobs.swap(node.job)[0]


def batch_writes(node: JobNode, swap: SwapNode | None, first_job: int) -> bool:
    """Whether a batch starting at job epoch ``first_job`` writes its output (else it is voided).

    The old version plans only batches it writes; a new version writes once the swap committed and
    only from S+1 (the planner never lets one batch run across S)."""
    return epoch_step.writes(swap, first_job, node.follows is not None)


def awaits(node: JobNode, swap: SwapNode | None, epoch: int) -> bool:
    """The new version's sink waits for S at the target before committing S+1."""
    return epoch_step.step(epoch, swap, None, node.follows is not None).await_target is not None


def report(ledger: Ledger, node: JobNode, **fields: Any) -> None:
    """Update the job's consumer node on every input (aligned; ``fields`` such as job_epoch, swap_seen)."""
    jobs = ledger.jobs
    for subject in node.inputs:
        extra = dict(fields)
        if "subject_epoch" in extra and isinstance(extra["subject_epoch"], Mapping):
            if subject in extra["subject_epoch"]:
                extra["subject_epoch"] = extra["subject_epoch"][subject]
            else:  # the batch read nothing new of this subject: it stands where it stood
                del extra["subject_epoch"]

        def change(current: ConsumerNode | None, extra: dict[str, Any] = extra) -> ConsumerNode | None:
            base = current or ConsumerNode(alignment=ConsumerAlignment(state=State.ALIGNED), mode="aligned")
            update = {"alignment": ConsumerAlignment(state=State.ALIGNED), "mode": "aligned", **extra}
            if current is not None and all(getattr(current, k) == v for k, v in update.items()):
                return None
            return base.model_copy(update=update)

        jobs.update_consumer(node.job, subject, 0, change)


def wait_target(ledger: Ledger, node: JobNode, swap: SwapNode) -> None:
    """The new version's S+1 commits only after the old version committed S at the target."""
    await_target(ledger, node.job, node.output, swap.epoch)
