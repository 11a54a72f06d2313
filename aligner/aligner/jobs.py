"""Job state in ZooKeeper: registration, alignment commands and states, committed job epochs.

Everything here is compare-and-set or create-if-absent: the first worker to reach an aligned job
epoch fixes the subject epochs it covers; every other worker reads that decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from aligner.alignment import Command, ConsumerAlignment, aggregate
from aligner.errors import AlignerError, MalformedNodeError, UnknownJobError, UnknownSubjectError
from aligner.models import (
    AlignmentDecision,
    CommandNode,
    ConsumerNode,
    JobEpochNode,
    JobNode,
    M,
    Node,
    Span,
    SwapNode,
    WorkerEpochNode,
    parse,
)
from aligner.ops import Create, Op, raise_failure
from aligner.recipes.store import Store
from aligner.recipes.subjects import SubjectRecipes

log = logging.getLogger(__name__)


class JobLedger:
    """Jobs' recipes over a ledger's store (``ledger.jobs``: one per ledger, shared)."""

    def __init__(self, ledger: Store, subjects: SubjectRecipes | None = None) -> None:
        self.ledger = ledger
        self.subjects = subjects or SubjectRecipes(ledger)
        self.zk = ledger.zk
        self.layout = ledger.layout

    # ---- registration -------------------------------------------------------------------------

    def register(self, node: JobNode) -> JobNode:
        for subject in (*node.inputs, node.output):
            self.subjects.subject(subject)
        lay = self.layout
        self.zk.ensure_path(lay.jobs)
        # One multi-op: a visible job node always has its sources, command and consumer nodes.
        ops: list[Op] = [Create(lay.job(node.job), node.dump()), Create(lay.sources(node.job))]
        for subject in node.inputs:
            ops += [Create(lay.source(node.job, subject)), Create(lay.command(node.job, subject), CommandNode().dump()),
                    Create(lay.consumers(node.job, subject))]
        results = self.ledger.multi(*ops)
        if isinstance(results[0], NodeExistsError):
            existing = self.job(node.job)
            if not existing.same_shape(node):
                raise AlignerError(
                    f"job {node.job!r} is registered as version {existing.version} reading {list(existing.inputs)} "
                    f"into {existing.output!r} with parallelism {existing.parallelism}; register a new job id for a "
                    "different shape"
                ) from None
            return existing
        raise_failure(results)
        return node

    def job(self, job: str) -> JobNode:
        try:
            return self.ledger.read(JobNode, self.layout.job(job))[0]
        except NoNodeError:
            raise UnknownJobError(job) from None

    def epoch_line(self, job: str) -> str:
        """Whose job epoch nodes a job uses: the first version's, through its chain of ``follows``
        (v3 follows v2, which follows v1: all three decide and read v1's epochs), so that every
        version of a job covers the same input epochs with the same job epoch numbers."""
        seen = {job}
        node = self.job(job)
        while node.follows is not None:
            if node.follows in seen:
                raise AlignerError(f"job {job!r}: its versions follow each other in a cycle ({sorted(seen)})")
            seen.add(node.follows)
            node = self.job(node.follows)
        return node.job

    def job_names(self) -> list[str]:
        try:
            return sorted(self.zk.get_children(self.layout.jobs))
        except NoNodeError:
            return []

    # ---- alignment commands and states ----------------------------------------------------------

    def command(self, job: str, subject: str) -> tuple[Command, int]:
        path = self.layout.command(job, subject)
        node, version = self.ledger.read_registered(lambda: self.ledger.read(CommandNode, path),
                                                    lambda: self.job(job), lambda: UnknownSubjectError(subject))
        return node.command, version

    def send(self, job: str, subject: str, command: Command, version: int) -> None:
        """Write a command; the version check makes two coordinators unable to interleave."""
        try:
            self.zk.set(self.layout.command(job, subject), CommandNode(command=command).dump(), version=version)
        except BadVersionError:
            raise AlignerError(f"command node of {job}/{subject} changed concurrently; another coordinator?") from None

    def has_sources(self, job: str) -> bool:
        """Whether the job's source state is there (retention removes a swapped-out job's)."""
        return self.zk.exists(self.layout.sources(job)) is not None

    def consumers(self, job: str, subject: str) -> dict[int, ConsumerNode]:
        path = self.layout.consumers(job, subject)
        names: list[str] = self.ledger.read_registered(
            lambda: self.zk.get_children(path), lambda: self.job(job),
            lambda: AlignerError(f"job {job!r} does not read subject {subject!r}"))
        return {int(n): self.ledger.read(ConsumerNode, f"{path}/{n}")[0] for n in names}

    def report(self, job: str, subject: str, worker: int, node: ConsumerNode) -> None:
        path = self.layout.consumer(job, subject, worker)
        try:
            self.zk.set(path, node.dump())
        except NoNodeError:
            self.zk.create(path, node.dump(), makepath=True)

    def report_async(self, job: str, subject: str, worker: int, node: ConsumerNode) -> Any:
        """``report`` to a consumer node that exists, without waiting: ``get()`` on the result waits (and
        raises NoNodeError when the node was removed meanwhile)."""
        return self.zk.set_async(self.layout.consumer(job, subject, worker), node.dump())

    def update_consumer(self, job: str, subject: str, worker: int,
                        change: Callable[[ConsumerNode | None], ConsumerNode | None]) -> ConsumerNode | None:
        """Read-modify-write of a consumer node (compare-and-set, retried): for a consumer whose fields
        several processes report (a Spark query's planner acknowledges a swap, its sink the job epochs).
        ``change`` returns None to leave the node as it is."""
        return self.ledger.update(ConsumerNode, self.layout.consumer(job, subject, worker), change, makepath=True)

    def source_state(self, job: str, subject: str) -> ConsumerAlignment:
        job_node = self.job(job)
        consumers = self.consumers(job, subject)
        states = [consumers[i].alignment if i in consumers else ConsumerAlignment()
                  for i in range(job_node.parallelism)]
        return aggregate(states)

    def decision(self, job: str) -> tuple[AlignmentDecision | None, int]:
        return self._read_versioned(AlignmentDecision, self.layout.decision(job))

    def decide(self, decision: AlignmentDecision, version: int) -> int:
        """Record the coordinator's next step before taking it; returns the new version."""
        return self._write_versioned(self.layout.decision(decision.job), decision, version)

    # ---- hot-swap -----------------------------------------------------------------------------

    def swap(self, old_job: str) -> tuple[SwapNode | None, int]:
        return self._read_versioned(SwapNode, self.layout.swap(old_job))

    def write_swap(self, node: SwapNode, version: int) -> int:
        """Create or compare-and-set the swap node; written before the jobs act on it."""
        return self._write_versioned(self.layout.swap(node.old), node, version)

    def _read_versioned(self, model: type[M], path: str) -> tuple[M | None, int]:
        """(node, version), or (None, -1) before the first write: the version :meth:`_write_versioned` creates at."""
        try:
            return self.ledger.read(model, path)
        except NoNodeError:
            return None, -1

    def _write_versioned(self, path: str, node: Node, version: int) -> int:
        """Create the node (``version`` -1) or compare-and-set it: a step recorded before it is taken, by one
        writer at a time; returns the new version."""
        if version < 0:
            self.zk.create(path, node.dump())
            return 0
        return self.zk.set(path, node.dump(), version=version).version

    # ---- epochs -------------------------------------------------------------------------------

    def worker_epoch(self, job: str, worker: int, epoch: int) -> WorkerEpochNode:
        return self.ledger.read(WorkerEpochNode, self.layout.worker_epoch(job, worker, epoch))[0]

    def worker_epoch_op(self, job: str, worker: int, node: WorkerEpochNode) -> Create:
        """The create op that commits a worker epoch atomically with its sink's commit (its bucket made first)."""
        path = self.layout.worker_epoch(job, worker, node.epoch)
        self.ledger.ensure_bucket(path)
        return Create(path, node.dump())

    def ensure_worker_path(self, job: str, worker: int) -> None:
        self.zk.ensure_path(self.layout.worker_epochs(job, worker))

    def job_epoch(self, job: str, epoch: int) -> JobEpochNode | None:
        try:
            return self.ledger.read(JobEpochNode, self.layout.job_epoch(job, epoch))[0]
        except NoNodeError:
            return None

    def fix_job_epoch(self, job: str, epoch: int, covered: Mapping[str, Span | None],
                      nxt: Mapping[str, int]) -> JobEpochNode:
        """Create-if-absent: the first worker's choice of covered subject epochs wins for all."""
        return self.fix_job_epoch_async(job, epoch, covered, nxt).get()

    def fix_job_epoch_async(self, job: str, epoch: int, covered: Mapping[str, Span | None],
                            nxt: Mapping[str, int]) -> PendingJobEpoch:
        """``fix_job_epoch`` with its round trip in flight: ``get()`` gives the record that stands."""
        node = JobEpochNode(epoch=epoch, covered=dict(covered), next=dict(nxt))
        path = self.layout.job_epoch(job, epoch)
        try:  # the bucket is looked up once per process; the job's epochs node is made only when it is missing
            self.ledger.ensure_bucket(path)
        except NoNodeError:
            self.zk.ensure_path(self.layout.job_epochs(job))
            self.ledger.ensure_bucket(path)
        return PendingJobEpoch(self, job, node, self.ledger.multi_async(Create(path, node.dump())))

    def job_epoch_numbers(self, job: str, since: int | None = None) -> list[int]:
        """The job's epochs in order (with ``since``: at least those from ``since`` on)."""
        try:
            return self.ledger.numbers(self.layout.job_epochs(job), since)
        except NoNodeError:
            return []

    # ---- worker epochs, as lineage, the chaos checker and gc read them ----------------------------

    def worker_epoch_or_none(self, job: str, worker: int, epoch: int) -> WorkerEpochNode | None:
        """A worker's record of a job epoch; None when it has none (pruned by gc, or another version wrote it)."""
        try:
            return self.worker_epoch(job, worker, epoch)
        except NoNodeError:
            return None

    def worker_ids(self, job: str) -> list[int]:
        """The workers of ``job`` that have recorded epochs (gc prunes their records)."""
        try:
            return sorted(int(w) for w in self.zk.get_children(self.layout.workers(job)))
        except NoNodeError:
            return []

    def first_job_epoch(self, job: str) -> int | None:
        try:
            return self.ledger.first_number(self.layout.job_epochs(job))
        except NoNodeError:
            return None

    def worker_epoch_numbers(self, job: str, worker: int, since: int | None = None) -> list[int]:
        try:
            return self.ledger.numbers(self.layout.worker_epochs(job, worker), since)
        except NoNodeError:
            return []

    def worker_epochs(self, job: str, worker: int) -> dict[int, WorkerEpochNode]:
        """Every epoch record of one worker (a record gc removes meanwhile is left out)."""
        out = {}
        for epoch in self.worker_epoch_numbers(job, worker):
            node = self.worker_epoch_or_none(job, worker, epoch)
            if node is not None:
                out[epoch] = node
        return out

    # ---- watches (kazoo recipes: they re-arm after a connection loss and on a new session) ------

    def on_data_change(self, path: str, wake: Callable[[], object]) -> None:
        """Call ``wake`` now and whenever the node at ``path`` is created, changed or deleted."""

        def fired(_data: bytes | None, _stat: object) -> None:
            wake()

        self.zk.DataWatch(path, fired)

    def on_children_change(self, path: str, wake: Callable[[], object]) -> None:
        """Call ``wake`` now and whenever ``path`` gains or loses a child (nothing if it does not exist)."""

        def fired(_children: list[str]) -> None:
            wake()

        self.zk.ChildrenWatch(path, fired)

    def watch_consumers(self, job: str, subjects: Iterable[str], wake: Callable[[], object]) -> None:
        """Call ``wake`` on every consumer report of ``job`` on ``subjects``, and when consumers join."""
        parallelism = self.job(job).parallelism
        for subject in subjects:
            self.on_children_change(self.layout.consumers(job, subject), wake)
            for worker in range(parallelism):
                self.on_data_change(self.layout.consumer(job, subject, worker), wake)

    def watch_swap(self, old_job: str, wake: Callable[[], object]) -> None:
        """Call ``wake`` whenever the hot-swap node of ``old_job`` is written."""
        self.on_data_change(self.layout.swap(old_job), wake)

    def follow_command(self, job: str, subject: str, on_command: Callable[[Command], object]) -> None:
        """Call ``on_command`` with the source's command now and after every change (re-armed by kazoo's
        DataWatch after outages). A malformed node is logged and skipped, never applied."""
        path = self.layout.command(job, subject)

        def fired(data: bytes | None, _stat: object) -> None:
            if data:
                try:
                    on_command(parse(CommandNode, path, data).command)
                except MalformedNodeError as exc:
                    log.error("%s", exc)

        self.zk.DataWatch(path, fired)

    def follow_swap(self, old_job: str, on_swap: Callable[[SwapNode | None], object]) -> None:
        """Call ``on_swap`` with the hot-swap node of ``old_job`` (None while there is none) now and after
        every change; a malformed node is logged and skipped."""
        self.zk.ensure_path(self.layout.job(old_job))
        self.on_swap(old_job, on_swap)

    def on_swap(self, old_job: str, on_swap: Callable[[SwapNode | None], object]) -> None:
        """``follow_swap`` for a reader that writes nothing (``aligner console``): the job node must exist."""
        path = self.layout.swap(old_job)

        def fired(data: bytes | None, _stat: object) -> None:
            try:
                on_swap(parse(SwapNode, path, data) if data else None)
            except MalformedNodeError as exc:
                log.error("%s", exc)

        self.zk.DataWatch(path, fired)

    def election(self, identifier: str) -> Any:
        """The coordinators' leader election: kazoo's Election recipe on this session."""
        return self.zk.Election(self.layout.election, identifier)

    def retention_election(self, identifier: str) -> Any:
        """The retention loops' leader election (one collects, the others stand by); a pass also holds the
        coordinators' election while it runs, so it never overlaps an alignment or a hot-swap."""
        return self.zk.Election(self.layout.retention_election, identifier)


class PendingJobEpoch:
    """A job epoch's coverage record on its way to ZooKeeper (create-if-absent)."""

    def __init__(self, jobs: JobLedger, job: str, node: JobEpochNode, result: Any) -> None:
        self.jobs, self.job, self.node, self._result = jobs, job, node, result

    def get(self) -> JobEpochNode:
        """The record that stands: this one, or the one another worker created first."""
        results = self._result.get()
        if isinstance(results[0], NodeExistsError):
            existing = self.jobs.job_epoch(self.job, self.node.epoch)
            assert existing is not None
            return existing
        raise_failure(results)
        return self.node


class PipelinedReports:
    """One worker's consumer reports, each sent without waiting for its answer: the answer is checked when
    the same subject's next report goes, or at ``flush``. A report after every epoch costs a round trip
    a worker need not wait for; one session sends in order, so reports never overtake each other."""

    def __init__(self, jobs: JobLedger, job: str, worker: int) -> None:
        self.jobs, self.job, self.worker = jobs, job, worker
        self._pending: dict[str, Any] = {}
        self._exists: set[str] = set()

    def send(self, subject: str, node: ConsumerNode) -> None:
        self._check_answer(subject)
        if subject in self._exists:
            self._pending[subject] = self.jobs.report_async(self.job, subject, self.worker, node)
        else:  # the first report (or one after the node was removed) creates the node: waited for
            self.jobs.report(self.job, subject, self.worker, node)
            self._exists.add(subject)

    def flush(self) -> None:
        """Wait for every report sent."""
        for subject in list(self._pending):
            self._check_answer(subject)

    def _check_answer(self, subject: str) -> None:
        pending = self._pending.pop(subject, None)
        if pending is not None:
            try:
                pending.get()
            except NoNodeError:
                self._exists.discard(subject)  # removed meanwhile: the next report creates it again
