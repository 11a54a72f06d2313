"""Epoch job runtime for plain Python jobs: consume -> user function -> stamped sink.

Worker ``i`` of a job with parallelism ``P`` is consumer ``i`` of every input subject and
producer ``i`` of the output subject and of the job's changelog subject (its keyed state). One job
epoch is one output subject epoch and one Kafka transaction: the output, the changed keys, and (in
the same ZooKeeper multi-op) the input offsets and alignment state commit together, so a worker
killed anywhere restarts from its last committed epoch and replays the same input into the same
state. The protocol's decisions are the pure machines of ``aligner.alignment``, ``aligner.coverage``
and ``aligner.swap``; this module drives them.

Unaligned epochs end on the worker's own timer. Aligned epochs end exactly at subject epoch
boundaries: the first worker to start aligned job epoch E fixes which subject epochs it covers
(create-if-absent), and each worker starts reading them as soon as ZooKeeper reports them
committed (zero alignment shift, thesis 6.4.1).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kazoo.exceptions import NoNodeError

from aligner import coverage
from aligner.alignment import Command, ConsumerAlignment, Receipt, State
from aligner.connectors.idle import Idle
from aligner.connectors.sink import TRANSIENT, FaultHook, SinkProducer, partitions_for
from aligner.connectors.source import SourceRecord, SubjectSource
from aligner.connectors.state import MemoryStore, StateStore, create_changelog, open_store
from aligner.connectors.subjects import create_subject
from aligner.errors import AlignerError, UnknownSubjectError
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from aligner.metrics import KAFKA_RETRIES
from aligner.models import (
    ConsumerNode,
    JobNode,
    Mode,
    Span,
    SwapNode,
    WorkerEpochNode,
)
from aligner.swap import Gate, Phase, awaits_target
from aligner.swap import gate as swap_gate
from aligner.zk import StoppedError

log = logging.getLogger("aligner.runtime")

KeyedState = StateStore
"""A job's keyed state: JSON values by string key (see :mod:`aligner.connectors.state`)."""

StateKind = Literal["memory", "rocksdb", "none"]

JobFunction = Callable[[SourceRecord, KeyedState], Iterable[tuple[bytes | None, bytes]]]
"""A job: for each input record, given the keyed state, the (key, value) records to emit."""


@dataclass(frozen=True)
class JobSpec:
    job: str
    inputs: tuple[str, ...]
    output: str
    parallelism: int = 1
    version: str = "1"
    interval: float = 1.0
    """Own checkpoint interval of unaligned epochs, in seconds."""
    mode: Mode = "exactly_once"
    epochs_per_checkpoint: int = 1
    """Aligned mode: subject epochs per job epoch (thesis 8.2.5 variable intervals)."""
    deterministic: bool = True
    per_key_order: bool = False
    follows: str | None = None
    """Run as the new version of this (aligned) job: same epochs, output voided until a hot-swap."""
    output_partitions: tuple[int, ...] | None = None
    """The output partitions this job's producers share (default: all); a new version beside an old
    one writes other partitions of the same target."""
    state: StateKind = "memory"
    """Where keyed state lives between epochs: in memory, in RocksDB under ``state_dir`` (state larger
    than memory; a restart on the same disk replays only the changelog's tail), or nowhere (a
    stateless job writes no changelog)."""
    state_dir: str | None = None
    """RocksDB stores go to ``state_dir/{job}-{worker}`` (state "rocksdb" only)."""
    inherit_state: bool = False
    """A new version (``follows``) starts from the old version's keyed state and input positions as of
    the epoch before its first, instead of rebuilding its state from the start of its inputs: for a
    change of logic that keeps the state's format. Both versions need the same parallelism."""

    shadow: bool = False
    """A new version (``follows``) writes what it voids to its private subject ``{job}.shadow``, epoch
    for epoch, so it can be compared with the old version before the swap (``aligner verify``)."""

    @property
    def shadow_subject(self) -> str | None:
        return f"{self.job}.shadow" if self.shadow else None

    @property
    def changelog(self) -> str | None:
        """The subject that holds this job's keyed state, one partition per worker."""
        return None if self.state == "none" else f"{self.job}.state"

    def node(self) -> JobNode:
        return JobNode(job=self.job, version=self.version, inputs=self.inputs, output=self.output,
                       parallelism=self.parallelism, deterministic=self.deterministic,
                       per_key_order=self.per_key_order, mode=self.mode, follows=self.follows,
                       output_partitions=self.output_partitions, shadow=self.shadow_subject)


class JobWorker:
    """Drives one worker of a job: epochs, alignment commands and the hot-swap gate.

    Always on: it waits for input as long as it takes (woken by ZooKeeper watches), rides out
    broker and ZooKeeper outages by aborting the open epoch and reopening from its last committed
    one (a new attempt of the same epoch), and ends any wait within a second once ``stop`` is set.
    """

    def __init__(self, ledger: Ledger, bootstrap: str, spec: JobSpec, worker: int, fn: JobFunction,
                 fault: FaultHook | None = None,
                 on_commit: Callable[[WorkerEpochNode], None] | None = None) -> None:
        self.ledger = ledger
        self.jobs = JobLedger(ledger)
        self.bootstrap = bootstrap
        self.spec = spec
        self.worker = worker
        self.fn = fn
        self.fault = fault or (lambda point: None)
        self.on_commit = on_commit
        """Called after every committed job epoch (instrumentation, e.g. :class:`connectors.latency.LatencyProbe`)."""
        self.state: StateStore = MemoryStore()
        """Opened by ``open``; kept across in-process reopens (each restores it to the last committed epoch)."""
        self.alignment: dict[str, ConsumerAlignment] = {s: ConsumerAlignment() for s in spec.inputs}
        self._commands: dict[str, Command] = {s: Command() for s in spec.inputs}
        self.idle = Idle(spec.job, worker, self._report_all)
        self.records_in = 0
        self.records_out = 0
        self._voiding = False
        self._rejected: dict[str, int] = {}
        self._swap_seen: tuple[int, int] | None = None
        self._swap: SwapNode | None = None
        """A swap of this version for a newer one (the swap node of this job)."""
        self._swap_in: SwapNode | None = None
        """For a new version: the swap that hands it the target (the swap node of the job it follows)."""
        self._inherited: str | None = None
        """"old@epoch" while this new version's first epoch carries the state it took over (hand-off)."""
        self.sink: SinkProducer | None = None  # type: ignore[assignment]
        self.source: SubjectSource | None = None  # type: ignore[assignment]

    # ---- set-up -------------------------------------------------------------------------------

    def open(self) -> JobWorker:
        spec = self.spec
        if spec.shadow and spec.follows is None:
            raise AlignerError(f"job {spec.job!r}: only a new version (follows=OLD) writes a shadow subject")
        self.jobs.register(spec.node())
        self._epochs_of = self.jobs.epoch_line(spec.job)
        """Whose aligned job epoch nodes this job uses: its own, or its first version's (through the
        versions it follows), so that every version covers the same input with the same epochs."""
        self.jobs.ensure_worker_path(spec.job, self.worker)
        if spec.changelog is not None:
            self._ensure_changelog(spec.changelog)
        if spec.shadow_subject is not None:
            self._ensure_shadow(spec.shadow_subject)
        if spec.state == "rocksdb":
            if spec.state_dir is None:
                raise AlignerError(f"job {spec.job!r} keeps its state in RocksDB: give it a state directory")
            self.state = open_store(Path(spec.state_dir) / f"{spec.job}-{self.worker}")
        self._open_io()
        # DataWatch recipes re-read their node after a connection loss or a new session.
        for subject in spec.inputs:
            self.jobs.follow_command(spec.job, subject, lambda cmd, s=subject: self._on_command(s, cmd))
        if spec.follows is not None:  # the swap that hands the target over to this version
            self.jobs.follow_swap(spec.follows, self._on_swap_in)
        self.jobs.follow_swap(spec.job, self._on_swap)  # a swap of this version for a newer one
        return self

    def _open_io(self) -> None:
        """Open the sink (a new attempt) and the source, and restore the last committed job epoch."""
        spec = self.spec
        out_parts = spec.output_partitions or tuple(range(self.ledger.subject(spec.output).partitions))
        mine = [out_parts[i] for i in partitions_for(self.worker, spec.parallelism, len(out_parts))]
        changelog, shadow = spec.changelog, spec.shadow_subject
        also = {**({changelog: [self.worker]} if changelog else {}), **({shadow: mine} if shadow else {})}
        self.sink = SinkProducer(self.ledger, self.bootstrap, spec.output, spec.job, self.worker, mine,
                                 also=also or None, fault=self.fault).open()
        assignment = {s: list(range(self.worker, self.ledger.subject(s).partitions, spec.parallelism))
                      for s in spec.inputs}
        self.source = SubjectSource(self.ledger, self.bootstrap, assignment,
                                    "at_least_once" if spec.mode == "at_least_once" else "exactly_once")
        if changelog is None:
            self.state.rollback()
        else:  # exact read of this worker's changelog partition up to its last committed epoch
            self.state.restore(self.ledger, self.bootstrap, changelog, self.worker,
                               self.sink.leases[changelog].node.committed_epoch, repair=True)
        self.alignment = {s: ConsumerAlignment() for s in spec.inputs}
        last = self.sink.lease.node.committed_epoch
        if last is not None:
            try:
                committed = self.jobs.worker_epoch(spec.job, self.worker, last)
            except NoNodeError:
                pass  # the output epoch committed without a job record: an old sink's epoch
            else:
                self.source.restore(committed.offsets, committed.load_from)
                self.alignment.update(committed.alignment)
                for subject, alignment in self.alignment.items():
                    self.source.set_limit(subject, alignment.load_limit)
        if spec.follows is not None and last is None:
            # A new version is aligned from its first epoch: it follows the old version's epochs (no
            # (k, J) of its own: its workers' first epochs may differ, and it never runs an alignment).
            first = self.sink.next_epoch
            self.alignment = {s: ConsumerAlignment(state=State.ALIGNED) for s in spec.inputs}
            if spec.inherit_state:
                self._inherit(spec.follows, first - 1)

    def _inherit(self, old: str, epoch: int) -> None:
        """State hand-off: take the old version's state and input positions as of its job epoch ``epoch``
        (exact read of its changelog partition), and write the whole state into this version's own
        changelog with the first epoch, which records where it came from."""
        spec = self.spec
        old_node = self.jobs.job(old)
        if old_node.parallelism != spec.parallelism:
            raise AlignerError(f"{spec.job} cannot inherit the state of {old}: {spec.parallelism} workers "
                               f"against {old_node.parallelism}")
        if spec.changelog is None:
            raise AlignerError(f"{spec.job} declares no state (state='none'); it cannot inherit {old}'s")
        while (committed := self.jobs.worker_epoch_or_none(old, self.worker, epoch)) is None:
            if self.ledger.stopping():
                raise StoppedError(f"{spec.job} worker {self.worker} stopped")
            self.idle.waiting(f"{old} worker {self.worker} to commit epoch {epoch} (state hand-off)")
            self.idle.arm(self.ledger.layout.worker_epoch(old, self.worker, epoch),
                      lambda cb, o=old: self.ledger.watch_node(self.ledger.layout.worker_epoch(o, self.worker, epoch),
                                                               cb))
            self.idle.wake.wait(1.0)
            self.idle.wake.clear()
        self.idle.got_input()
        self.state.restore(self.ledger, self.bootstrap, f"{old}.state", self.worker, epoch)
        self.state.mark_all_changed()
        self.source.restore(committed.offsets, committed.load_from)
        self._inherited = f"{old}@{epoch}"

    def _ensure_shadow(self, name: str) -> None:
        """The shadow subject, shaped like the output (created by the first worker to start)."""
        out = self.ledger.subject(self.spec.output)
        try:
            self.ledger.subject(name)
        except UnknownSubjectError:
            create_subject(self.ledger, self.bootstrap, name, out.partitions, value_format=out.value_format)

    def _ensure_changelog(self, name: str) -> None:
        """The job's changelog subject, one partition per worker (created by the first worker to start)."""
        try:
            meta = self.ledger.subject(name)
        except UnknownSubjectError:
            meta = create_changelog(self.ledger, self.bootstrap, name, self.spec.parallelism)
        if meta.partitions != self.spec.parallelism:
            raise AlignerError(f"job {self.spec.job!r} runs {self.spec.parallelism} workers but its state subject "
                               f"{name!r} has {meta.partitions} partitions: keyed state cannot be rescaled")

    def _reopen(self, stop: threading.Event) -> None:
        """After a broker or ZooKeeper failure: drop the open epoch and resume from the last committed
        one, exactly as a restarted process would, retrying with backoff until it works or ``stop``."""
        delay = 0.2
        while not stop.is_set():
            self._close_io()
            try:
                self._open_io()
                return
            except StoppedError:
                return
            except TRANSIENT as exc:
                log.warning("%s worker %d: reopening failed (%s); retrying in %.1fs", self.spec.job, self.worker,
                            one_line(exc), delay)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)

    def _close_io(self) -> None:
        sink, source, self.sink, self.source = self.sink, self.source, None, None
        if sink is not None:
            with contextlib.suppress(Exception):
                sink.close()
        if source is not None:
            with contextlib.suppress(Exception):
                source.close()

    def _on_swap(self, swap: SwapNode | None) -> None:
        self._swap = swap
        self.idle.wake.set()

    @property
    def swap(self) -> SwapNode | None:
        """The swap that gates this worker now: the one handing it the target until that is done, then
        a swap of it for a newer version."""
        if self._swap_in is not None and self._swap_in.phase != Phase.DONE:
            return self._swap_in
        return self._swap

    def _on_swap_in(self, swap: SwapNode | None) -> None:
        self._swap_in = swap
        self.idle.wake.set()

    def close(self) -> None:
        self._close_io()
        self.state.close()
        self.idle.close()

    def _on_command(self, subject: str, command: Command) -> None:
        self._commands[subject] = command
        self.idle.wake.set()

    def _watch_epoch(self, subject: str, epoch: int) -> None:
        self.idle.arm(self.ledger.layout.epoch(subject, epoch), lambda cb: self.ledger.arm_watch(subject, epoch, cb))

    @property
    def waiting_since(self) -> float | None:
        """Monotonic time since which the worker has had no input to read (None while reading)."""
        return self.idle.since

    def _report_all(self) -> None:
        for subject in self.spec.inputs:
            self._report(subject)

    # ---- alignment ----------------------------------------------------------------------------

    def _apply_commands(self, open_epoch: int, boundary: bool) -> None:
        """Hand new commands to the alignment machine; its state decides the source's load limit."""
        for subject, cmd in self._commands.items():
            new, receipt = self.alignment[subject].receive(cmd, open_epoch, self.source.next_load(subject), boundary)
            if receipt in (Receipt.IGNORED, Receipt.DEFERRED):
                continue
            if receipt is Receipt.REJECTED:
                self._rejected[subject] = cmd.seq  # reported until a later command; the coordinator retries
                log.info("%s worker %d: %s command %d rejected in state %s", self.spec.job, self.worker, cmd.kind,
                         cmd.seq, self.alignment[subject].state.value)
            else:
                self.source.set_limit(subject, new.load_limit)
            self.alignment[subject] = new
            self._report(subject)

    def _report(self, subject: str) -> None:
        node = ConsumerNode(alignment=self.alignment[subject], mode=self.mode_of(subject),
                            job_epoch=self.sink.lease.node.committed_epoch,
                            subject_epoch=self.source.consumed(subject),
                            rejected_seq=self._rejected.get(subject, 0),
                            swap_seen=self._swap_seen,
                            waiting_since=self.idle.reported_since)
        self.jobs.report(self.spec.job, subject, self.worker, node)

    def mode_of(self, subject: str) -> Mode:
        if self.alignment[subject].aligned:
            return "aligned"
        return "at_least_once" if self.spec.mode == "at_least_once" else "exactly_once"

    @property
    def aligned(self) -> bool:
        return all(a.aligned for a in self.alignment.values())

    # ---- epochs -------------------------------------------------------------------------------

    def _process(self, records: list[SourceRecord]) -> None:
        fn, state, send = self.fn, self.state, self.sink.send
        shadow = self.spec.shadow_subject
        if self._voiding and shadow is not None:
            send_to = self.sink.send_to
            for r in records:
                for key, value in fn(r, state):  # voided at the target, kept in the shadow for comparison
                    send_to(shadow, value, key)
        elif self._voiding:
            for r in records:
                for _ in fn(r, state):  # state advances; the output is voided
                    pass
        else:
            for r in records:
                for key, value in fn(r, state):
                    send(value, key)
                    self.records_out += 1
        self.records_in += len(records)

    # ---- hot-swap -----------------------------------------------------------------------------

    def _swap_gate(self, epoch: int, stop: threading.Event) -> Gate:
        """The swap machine's gate for ``epoch``, acknowledging S first; waits out a pre-commit at S+1.

        A new version is gated by the swap that hands it the target (void until S, then write) and,
        once it writes, by a swap of itself for a newer version (write until S', then stop)."""
        while True:
            swap, outcome = self._swap_in, Gate.WRITE
            if self.spec.follows is not None:
                outcome = swap_gate(swap, epoch, new_version=True)
            if outcome is Gate.WRITE:
                swap = self._swap
                outcome = swap_gate(swap, epoch, new_version=False)
            if swap is not None and swap.phase != Phase.ABORTED:
                self._report_swap(swap, epoch)
            if outcome is not Gate.WAIT:
                return outcome
            self.idle.waiting(f"the outcome of the hot-swap at epoch {swap.epoch if swap else '?'}")
            self.idle.sleep(stop, 1.0)

    def _report_swap(self, swap: SwapNode, epoch: int) -> None:
        seen = self._swap_seen
        if seen is None or seen[0] != swap.epoch:
            self._swap_seen = (swap.epoch, epoch)
            self._report_all()

    def _drain_until(self, done: Callable[[], bool], stop: threading.Event, open_epoch: int,
                     until: float | None = None) -> bool:
        """Read and process loaded epochs until ``done``; returns False when the inputs finished first.

        With nothing left to read it sleeps until a watch says the next input epoch committed (or a
        command arrives, or ``until``, the unaligned epoch's timer, passes): no fixed timeout, and
        no CPU spent on a quiet input.
        """
        source = self.source
        assert source is not None
        loaded_at = 0.0
        while not done():
            if stop.is_set():
                raise StoppedError(f"{self.spec.job} worker {self.worker} stopped")
            self._apply_commands(open_epoch, boundary=False)
            now = time.monotonic()
            if not source.readable() or now - loaded_at > 0.1:
                source.load()  # ZooKeeper is asked for new epochs when nothing is left to read, or now and then
                loaded_at = now
            records = source.poll()
            if records:
                self.idle.got_input()
                self._process(records)
                continue
            if not source.caught_up():
                continue  # loaded data still on its way from the broker
            if self._inputs_finished():
                return done()
            for subject in self.spec.inputs:
                self._watch_epoch(subject, source.next_load(subject))
            if source.load():
                continue
            self.idle.waiting(f"the next epoch of {', '.join(self.spec.inputs)}")
            left = None if until is None else until - time.monotonic()
            self.idle.sleep(stop, 1.0 if left is None or left <= 0 else left)  # past the timer: woken by watches
        return True

    def _inputs_finished(self) -> bool:
        for subject in self.spec.inputs:
            last = self.ledger.finished(subject)
            if last is None or self.source.consumed(subject) < last:
                return False
        return True

    def _run_unaligned(self, epoch: int, stop: threading.Event) -> None:
        """An epoch on the worker's own timer, unless an accepted Align makes it the last before J:
        then it ends exactly where subject epoch k starts, however long that takes. The Align may
        arrive while the epoch runs, so the rule is checked as the epoch goes, not only at its start."""
        ends = time.monotonic() + self.spec.interval
        source = self.source
        assert source is not None

        def done() -> bool:
            last_before_j = {s: a for s, a in self.alignment.items()
                             if a.state is State.ALIGNING and a.job_epoch == epoch + 1}
            if last_before_j:
                return all(source.consumed(s) >= (a.subject_epoch or 0) - 1 for s, a in last_before_j.items())
            return time.monotonic() >= ends

        self._drain_until(done, stop, epoch, until=ends)

    def _covered(self, epoch: int, stop: threading.Event) -> dict[str, Span | None]:
        """The subject epochs aligned job epoch ``epoch`` covers: decided once, by the first worker."""
        existing = self.jobs.job_epoch(self._epochs_of, epoch)
        if existing is not None:
            return existing.covered
        follows = self.spec.follows is not None
        if follows and not self._old_finished(epoch):
            followed = self._await_followed(epoch, stop)
            if followed is not None:
                return followed
        previous = self.jobs.job_epoch(self._epochs_of, epoch - 1)
        start = coverage.starts(epoch, self.alignment, previous.next if previous else None, follows)
        per = self.spec.epochs_per_checkpoint
        while True:
            # Zero alignment shift: woken by ZooKeeper watches as soon as an epoch commits.
            for s, first in start.items():
                self._watch_epoch(s, first + per - 1)
            finished = {s: self.ledger.finished(s) for s in start}
            frontier = {s: first + self._committed_prefix(s, first, coverage.wanted(first, per, finished[s])) - 1
                        for s, first in start.items()}
            decided = coverage.decide(start, per, frontier, finished)
            if decided is not None:
                break
            self.idle.waiting(f"subject epochs {start} to commit")
            self.idle.sleep(stop, 1.0)
        self.idle.got_input()
        return self.jobs.fix_job_epoch(self._epochs_of, epoch, decided.covered, decided.next).covered

    def _old_finished(self, epoch: int) -> bool:
        """After a committed swap the old version decides no epoch past S: the new one does."""
        return swap_gate(self._swap_in, epoch, new_version=True) is Gate.WRITE

    def _await_followed(self, epoch: int, stop: threading.Event) -> dict[str, Span | None] | None:
        """A new version waits for the old one to decide the job epoch (watch on its node).

        None when the old version will not decide it (swapped out, or its inputs finished)."""
        path = self.ledger.layout.job_epoch(self._epochs_of, epoch)
        while True:
            self.idle.arm(path, lambda cb: self.ledger.watch_node(path, cb))
            node = self.jobs.job_epoch(self._epochs_of, epoch)
            if node is not None:
                return node.covered
            if self._old_finished(epoch) or self._inputs_finished():
                return None
            self.idle.waiting(f"{self._epochs_of} to decide job epoch {epoch}")
            self.idle.sleep(stop, 1.0)

    def _committed_prefix(self, subject: str, start: int, per: int) -> int:
        n = 0
        while n < per:
            try:
                if not self.ledger.is_committed(subject, start + n):
                    break
            except AlignerError:
                break
            n += 1
        return n

    def _run_aligned(self, epoch: int, stop: threading.Event) -> dict[str, Span | None]:
        covered = self._covered(epoch, stop)
        source = self.source
        assert source is not None
        for subject, span in covered.items():
            source.set_limit(subject, span.last if span is not None else source.consumed(subject))
        self._drain_until(lambda: all(span is None or source.consumed(s) >= span.last
                                      for s, span in covered.items()), stop, epoch)
        return covered

    def step(self, stop: threading.Event) -> bool:
        """Run one job epoch; returns False once every input finished and was consumed (or the old
        version of a hot-swap wrote its last epoch). Raises StoppedError when ``stop`` is set."""
        sink, source = self.sink, self.source
        assert sink is not None and source is not None, "open() first"
        epoch = sink.next_epoch
        self._apply_commands(epoch, boundary=True)
        gate = self._swap_gate(epoch, stop)
        if gate is Gate.STOP:
            sink.finish()  # the old version wrote its last epoch, S; the new one writes S+1 on
            return False
        self._voiding = gate is Gate.VOID
        self.alignment = {s: a.started(epoch) for s, a in self.alignment.items()}
        sink.begin()
        covered = self._run_aligned(epoch, stop) if self.aligned else None
        if covered is None:
            self._run_unaligned(epoch, stop)
        node = WorkerEpochNode(epoch=epoch, mode="aligned" if covered is not None else self.spec.mode,
                               offsets=source.offsets(), load_from=source.load_from(), covered=covered,
                               alignment=self.alignment, state_from=self._inherited)
        changelog = self.spec.changelog
        if changelog is not None:
            for key, value in self.state.records():  # changed keys, in the epoch's transaction
                sink.send_to(changelog, value, key, self.worker)
        elif self.state.dirty:
            raise AlignerError(f"job {self.spec.job!r} declares no state (state='none') but its function put some")
        swap = self._swap_in
        if not self._voiding and awaits_target(swap, epoch, self.spec.follows is not None):
            assert swap is not None
            while not self.ledger.wait_committed(self.spec.output, swap.epoch, timeout=1.0, stop=stop):
                if stop.is_set():
                    raise StoppedError(f"{self.spec.job} worker {self.worker} stopped")
        done = sink.commit(extra=[self.jobs.worker_epoch_op(self.spec.job, self.worker, node)])
        if changelog is not None:
            written = done.also[changelog].get(self.worker)
            self.state.mark_committed(epoch, written.end if written is not None else None)
            self._inherited = None
        if self.on_commit is not None:
            try:
                self.on_commit(node)
            except Exception:  # instrumentation must not stop a job whose epoch is committed
                log.exception("on_commit hook of %s worker %d failed at epoch %d", self.spec.job, self.worker, epoch)
        self.fault("after_epoch")
        ahead = source.second_last_ahead()
        for subject in self.spec.inputs:
            self.alignment[subject] = self.alignment[subject].caught_up(ahead)
            self._report(subject)
        if self._inputs_finished() and source.caught_up():
            sink.finish()
            return False
        return True

    def run(self, stop: threading.Event, max_epochs: int | None = None,
            on_epoch: Callable[[int], None] | None = None) -> int:
        """Run epochs until the inputs finish, ``max_epochs`` ran or ``stop`` is set; returns how many.

        A broker or ZooKeeper failure aborts the open epoch, which runs again under a new attempt
        once the worker has reopened from its last committed epoch (with backoff, as long as the
        outage lasts). Mistakes and fencing by another incarnation of this worker end the run.
        """
        self.ledger.stop_on(stop)
        done = 0
        failures = 0
        while not stop.is_set() and (max_epochs is None or done < max_epochs):
            try:
                if not self.step(stop):
                    break
            except StoppedError:
                break
            except TRANSIENT as exc:
                if stop.is_set():
                    break
                failures += 1
                KAFKA_RETRIES.labels(self.spec.job, str(self.worker)).inc()
                log.warning("%s worker %d: epoch failed (%s); resuming from the last committed epoch",
                            self.spec.job, self.worker, one_line(exc))
                stop.wait(min(0.2 * 2 ** min(failures, 5), 5.0))
                self._reopen(stop)
                continue
            failures = 0
            done += 1
            if on_epoch is not None:
                assert self.sink is not None
                on_epoch(self.sink.lease.node.committed_epoch or 0)
        return done


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


if __name__ == "__main__":  # the documented `python -m aligner.connectors.runtime`; the process is worker.py's
    from aligner.connectors.worker import main

    main()
