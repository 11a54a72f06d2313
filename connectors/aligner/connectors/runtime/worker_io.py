"""A runtime worker's sink, source and keyed state, opened at its last committed job epoch.

Opening is also how a worker recovers: after a crash, a broker or a ZooKeeper outage it opens a new
sink attempt, restores its state from its changelog up to the last committed epoch and its source
from that epoch's record, exactly as a restarted process would. A new version that inherits its
old version's state takes it over here (the state hand-off) before its first epoch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from kazoo.exceptions import NoNodeError

from aligner.alignment import ConsumerAlignment, State
from aligner.connectors.idle import Idle
from aligner.connectors.runtime.job_spec import JobSpec
from aligner.connectors.runtime.state import MemoryStore, StateStore, create_changelog, open_store, take_keys
from aligner.connectors.sink import TRANSIENT, FaultHook, SinkProducer, partitions_for
from aligner.connectors.source import SubjectSource
from aligner.connectors.subjects import ensure_shadow
from aligner.errors import AlignerError, UnknownSubjectError
from aligner.keys import sources, worker_of
from aligner.layout import writer_id
from aligner.ledger import Ledger
from aligner.models import WorkerEpochNode
from aligner.zk import StoppedError

log = logging.getLogger(__name__)

Alignments = dict[str, ConsumerAlignment]


class WorkerIO:
    def __init__(self, ledger: Ledger, bootstrap: str, spec: JobSpec, worker: int, fault: FaultHook,
                 idle: Idle) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
        self.bootstrap = bootstrap
        self.spec = spec
        self.worker = worker
        self.fault = fault
        self.idle = idle
        self.state: StateStore = MemoryStore()
        """Kept across in-process reopens (each restores it to the last committed epoch)."""
        self.sink: SinkProducer | None = None
        self.source: SubjectSource | None = None
        self.inherited: str | None = None
        """"old@epoch" while this new version's first epoch carries the state it took over (hand-off)."""
        self.state_base: int | None = None
        """The changelog epoch this worker's state is rebuilt from (see ``WorkerEpochNode.state_base``)."""
        self.mine: list[int] = []
        """This worker's share of the target's partitions (a new version writes them once its swap hands
        them over)."""

    def prepare(self) -> None:
        """The subjects a worker writes besides its output, and its state store."""
        spec = self.spec
        if spec.changelog is not None:
            self._ensure_changelog(spec.changelog)
        if spec.shadow_subject is not None:
            ensure_shadow(self.ledger, self.bootstrap, spec.shadow_subject, spec.output)
        if spec.state == "rocksdb":
            if spec.state_dir is None:
                raise AlignerError(f"job {spec.job!r} keeps its state in RocksDB: give it a state directory")
            self.state = open_store(Path(spec.state_dir) / f"{spec.job}-{self.worker}")

    def may_join(self, line: str) -> bool:
        """Whether this worker may open its sink on the target now. A new version joins only once its line
        decides job epochs (the old version is aligned): joined earlier, its producers would be writers
        of target epochs it can never follow, holding the target's epochs for every reader. A worker that
        has committed has joined already."""
        spec = self.spec
        if spec.follows is None or self.jobs.worker_epoch_numbers(spec.job, self.worker):
            return True
        frontier = self.ledger.epochs.frontier(spec.output)
        return frontier is not None and self.jobs.job_epoch(line, frontier) is not None

    def join_when_aligned(self, line: str) -> bool:
        """Wait (stop-aware, said once in the log) until :meth:`may_join`; True then."""
        said = False
        while not self.may_join(line):
            if self.ledger.stopping():
                raise StoppedError(f"{self.spec.job} worker {self.worker} stopped")
            if not said:  # no consumer report yet (nothing is open): the log says it
                log.warning("%s worker %d: waiting for %s to be aligned: a new version joins %r only while its "
                            "old version decides job epochs (`aligner align %s`)", self.spec.job, self.worker,
                            line, self.spec.output, line)
                said = True
            self.idle.wake.wait(1.0)
            self.idle.wake.clear()
        return True

    def _ensure_changelog(self, name: str) -> None:
        """The job's changelog subject, one partition per worker (created by the first worker to start)."""
        try:
            meta = self.ledger.subjects.subject(name)
        except UnknownSubjectError:
            meta = create_changelog(self.ledger, self.bootstrap, name, self.spec.parallelism)
        if meta.partitions != self.spec.parallelism:
            raise AlignerError(f"job {self.spec.job!r} runs {self.spec.parallelism} workers but its state subject "
                               f"{name!r} has {meta.partitions} partitions: keyed state cannot be rescaled")

    def open(self) -> Alignments:
        """Open the sink (a new attempt) and the source, and restore the last committed job epoch;
        returns the alignment of each source as of that epoch."""
        spec = self.spec
        out_parts = spec.output_partitions or tuple(range(self.ledger.subjects.subject(spec.output).partitions))
        mine = [out_parts[i] for i in partitions_for(self.worker, spec.parallelism, len(out_parts))]
        self.mine = mine
        target = mine
        if self.hands_over:  # until its swap, the partitions it took over already (none before)
            entry = self.ledger.subjects.writers(spec.output)[0].writers.get(writer_id(spec.job, str(self.worker)))
            target = list(entry.partitions) if entry is not None else []
        changelog, shadow = spec.changelog, spec.shadow_subject
        if shadow is not None and self._finished_in(shadow):
            shadow = None  # restarted after its swap: the shadow ended there
        also = {**({changelog: [self.worker]} if changelog else {}), **({shadow: mine} if shadow else {})}
        self.sink = SinkProducer(self.ledger, self.bootstrap, spec.output, spec.job, self.worker, target,
                                 also=also or None, fault=self.fault).open()
        assignment = {s: list(range(self.worker, self.ledger.subjects.subject(s).partitions, spec.parallelism))
                      for s in spec.inputs}
        self.source = SubjectSource(self.ledger, self.bootstrap, assignment,
                                    "at_least_once" if spec.mode == "at_least_once" else "exactly_once")
        if changelog is None:
            self.state.rollback()
        else:  # exact read of this worker's changelog partition up to its last committed epoch
            last = self.sink.leases[changelog].node.committed_epoch
            record = None if last is None else self.jobs.worker_epoch_or_none(spec.job, self.worker, last)
            self.state_base = None if record is None else record.state_base
            self.state.restore(self.ledger, self.bootstrap, changelog, self.worker, last, since=self.state_base,
                               repair=True)
        return self._restore(self.sink.lease.node.committed_epoch)

    @property
    def hands_over(self) -> bool:
        """A new version without partitions of its own: its swap hands it the old version's (from S+1)."""
        return self.spec.node().hands_over

    def take_over(self, swap_epoch: int | None, await_target: Callable[[int], None]) -> None:
        """The first writing epoch of a new version that writes no partition yet: once the swap epoch is
        committed at the target (``await_target``), take over the old version's partitions of this
        worker's share of the target."""
        assert self.sink is not None and self.spec.follows is not None
        if swap_epoch is None:
            raise AlignerError(f"{self.spec.job} worker {self.worker} writes no partition of {self.spec.output!r} "
                               f"and no hot-swap hands it any")
        await_target(swap_epoch)
        self.sink.take_over(self.mine, self.spec.follows, swap_epoch)
        log.info("%s worker %d: took partitions %s of %r over from %s after epoch %d", self.spec.job, self.worker,
                 self.mine, self.spec.output, self.spec.follows, swap_epoch)

    def _finished_in(self, subject: str) -> bool:
        """Whether this worker's producer of ``subject`` was finished (a shadow after the swap)."""
        writers, _ = self.ledger.subjects.writers(subject)
        entry = writers.writers.get(writer_id(self.spec.job, str(self.worker)))
        return entry is not None and entry.finished_after is not None

    def state_base_for(self, epoch: int) -> int:
        """The state base ``epoch`` commits: the epoch itself when it writes the whole state (its base is
        due, or the state was just handed over), else the last one."""
        base = self.state_base
        if self.inherited is not None or base is None or epoch - base >= self.spec.state_snapshot_every:
            return epoch
        return base

    def _restore(self, last: int | None) -> Alignments:
        spec, source = self.spec, self.source
        assert source is not None and self.sink is not None
        alignment = {s: ConsumerAlignment() for s in spec.inputs}
        if last is not None:
            try:
                committed = self.jobs.worker_epoch(spec.job, self.worker, last)
            except NoNodeError:
                pass  # the output epoch committed without a job record: an old sink's epoch
            else:
                source.restore(committed.offsets, committed.load_from)
                alignment.update(committed.alignment)
                for subject, a in alignment.items():
                    source.set_limit(subject, a.load_limit)
        if spec.follows is not None and last is None:
            # A new version is aligned from its first epoch: it follows the old version's epochs (no
            # (k, J) of its own: its workers' first epochs may differ, and it never runs an alignment).
            alignment = {s: ConsumerAlignment(state=State.ALIGNED) for s in spec.inputs}
            if spec.inherit_state:
                self._inherit(spec.follows, self.sink.next_epoch - 1)
        return alignment

    def _inherit(self, old: str, epoch: int) -> None:
        """State hand-off: take the old version's state and input positions as of its job epoch ``epoch``
        (exact read of its changelog partition), and write the whole state into this version's own
        changelog with the first epoch, which records where it came from."""
        spec = self.spec
        old_node = self.jobs.job(old)
        if spec.changelog is None:
            raise AlignerError(f"{spec.job} declares no state (state='none'); it cannot inherit {old}'s")
        assert self.source is not None
        if old_node.parallelism != spec.parallelism:
            self._inherit_rescaled(old, old_node.parallelism, epoch)
        else:
            committed = self._await_old_epoch(old, self.worker, epoch)
            self.state.restore(self.ledger, self.bootstrap, f"{old}.state", self.worker, epoch,
                               since=committed.state_base)
            self.source.restore(committed.offsets, committed.load_from)
        self.state.mark_all_changed()
        self.inherited = f"{old}@{epoch}"

    def _inherit_rescaled(self, old: str, workers: int, epoch: int) -> None:
        """State hand-off across a change of parallelism: read every changelog partition of the old version
        exactly up to ``epoch`` and keep the keys this worker reads (:func:`aligner.keys.worker_of`); take
        the positions of this worker's input partitions from whichever old worker read them."""
        spec = self.spec
        counts = {self.ledger.subjects.subject(s).partitions for s in spec.inputs}
        if len(counts) != 1:
            raise AlignerError(f"{spec.job} cannot rescale {old}'s state: keyed state follows a key's input "
                               f"partition, and its inputs have different partition counts {sorted(counts)}")
        (partitions,) = counts
        olds = sources(self.worker, spec.parallelism, workers)  # the old workers that can hold this one's keys
        records = [self._await_old_epoch(old, i, epoch) for i in olds]

        def mine(key: str) -> bool:
            return worker_of(key.encode(), partitions, spec.parallelism) == self.worker

        kept = sum(take_keys(self.ledger, self.bootstrap, f"{old}.state", i, epoch, committed.state_base, self.state,
                             mine) for i, committed in zip(olds, records, strict=True))
        offsets: dict[str, dict[int, int]] = {}
        load_from: dict[str, int] = {}
        for committed in records:
            for subject, positions in committed.offsets.items():
                offsets.setdefault(subject, {}).update(positions)
            for subject, first in committed.load_from.items():
                load_from[subject] = min(first, load_from.get(subject, first))
        assert self.source is not None
        self.source.restore(offsets, load_from)
        log.info("%s worker %d: took %d keys of %s's state as of epoch %d from its %d workers", spec.job,
                 self.worker, kept, old, epoch, workers)

    def _await_old_epoch(self, old: str, worker: int, epoch: int) -> WorkerEpochNode:
        path = self.ledger.layout.worker_epoch(old, worker, epoch)
        said = False
        while (committed := self.jobs.worker_epoch_or_none(old, worker, epoch)) is None:
            if self.ledger.stopping():
                raise StoppedError(f"{self.spec.job} worker {self.worker} stopped")
            later = [e for e in self.jobs.worker_epoch_numbers(old, worker) if e > epoch]
            if later and not said:  # records are written in epoch order: this one will not come
                said = True
                log.warning("%s worker %d: %s worker %d has no record of epoch %d, the state this worker takes "
                            "over, but has one of %d: it was removed (by `aligner gc` before retention kept "
                            "a followed version's records?); waiting for it", self.spec.job, self.worker, old,
                            worker, epoch, later[0])
            self.idle.waiting(f"{old} worker {worker} to commit epoch {epoch} (state hand-off)")
            self.idle.arm(path, lambda cb: self.ledger.watches.watch_node(path, cb))
            self.idle.wake.wait(1.0)
            self.idle.wake.clear()
        self.idle.got_input()
        return committed

    def reopen(self, stop: threading.Event, describe: Callable[[BaseException], str]) -> Alignments | None:
        """After a broker or ZooKeeper failure: drop the open epoch and resume from the last committed
        one, retrying with backoff until it works (the alignments restored) or ``stop`` (None)."""
        delay = 0.2
        while not stop.is_set():
            self.close_io()
            try:
                return self.open()
            except StoppedError:
                return None
            except TRANSIENT as exc:
                log.warning("%s worker %d: reopening failed (%s); retrying in %.1fs", self.spec.job, self.worker,
                            describe(exc), delay)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
        return None

    def close_io(self) -> None:
        sink, source, self.sink, self.source = self.sink, self.source, None, None
        if sink is not None:
            with contextlib.suppress(Exception):  # closing after a failure: the next open starts from ZooKeeper
                sink.close()
        if source is not None:
            with contextlib.suppress(Exception):  # closing after a failure: the next open starts from ZooKeeper
                source.close()

    def close(self) -> None:
        self.close_io()
        self.state.close()
