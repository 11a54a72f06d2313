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

import gc
import logging
import threading
import time
from collections.abc import Callable

from aligner.alignment import State
from aligner.connectors.idle import Idle
from aligner.connectors.runtime.job_epochs import JobEpochs
from aligner.connectors.runtime.job_spec import Emitted, JobFunction, JobSpec, KeyedState, StateKind, batch, takes_batch
from aligner.connectors.runtime.source_alignment import SourceAlignment
from aligner.connectors.runtime.worker_io import WorkerIO
from aligner.connectors.sink import TRANSIENT, FaultHook
from aligner.connectors.source import Records
from aligner.connectors.swap_gate import SwapGate
from aligner.epoch_step import Act
from aligner.errors import AlignerError
from aligner.jobs import PipelinedReports
from aligner.ledger import Ledger
from aligner.metrics import KAFKA_RETRIES
from aligner.models import Span, WorkerEpochNode
from aligner.zk import StoppedError

__all__ = ["JobFunction", "JobSpec", "JobWorker", "KeyedState", "StateKind", "batch", "one_line"]

log = logging.getLogger(__name__)


class JobWorker:
    """Drives one worker of a job: epochs, alignment commands and the hot-swap gate.

    Always on: it waits for input as long as it takes (woken by ZooKeeper watches), rides out
    broker and ZooKeeper outages by aborting the open epoch and reopening from its last committed
    one (a new attempt of the same epoch), and ends any wait within a second once ``stop`` is set.
    The rules are the pure machines'; its parts do the I/O: :class:`WorkerIO` (sink, source, state,
    recovery and hand-off), :class:`SourceAlignment` (commands), :class:`SwapGate` (both swaps) and
    :class:`JobEpochs` (aligned coverage). Callers read a value from the part that owns it: ``io.sink``,
    ``io.source``, ``io.state`` (kept across in-process reopens, each restoring the last committed epoch),
    ``sources.states``, ``sources.aligned``, ``sources.mode_of``, ``gate.swap`` and ``idle.since``.
    """

    def __init__(self, ledger: Ledger, bootstrap: str, spec: JobSpec, worker: int, fn: JobFunction,
                 fault: FaultHook | None = None,
                 on_commit: Callable[[WorkerEpochNode], None] | None = None) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
        self.reports = PipelinedReports(self.jobs, spec.job, worker)
        self.bootstrap = bootstrap
        self.spec = spec
        self.worker = worker
        self.fn = fn
        self.fault = fault or (lambda point: None)
        self.on_commit = on_commit
        """Called after every committed job epoch (instrumentation, e.g. :class:`connectors.latency.LatencyProbe`)."""
        self.idle = Idle(spec.job, worker, self._report_all)
        self.io = WorkerIO(ledger, bootstrap, spec, worker, self.fault, self.idle)
        self.sources = SourceAlignment(self.jobs, spec.job, worker, spec.inputs, spec.mode, self.idle)
        self.gate = SwapGate(ledger, spec.job, spec.follows, self.idle, self._report_all)
        self.records_in = self.records_out = 0
        self._voiding = False

    # ---- set-up -------------------------------------------------------------------------------

    def open(self) -> JobWorker:
        spec = self.spec
        if spec.shadow and spec.follows is None:
            raise AlignerError(f"job {spec.job!r}: only a new version (follows=OLD) writes a shadow subject")
        self.jobs.register(spec.node())
        self.epochs = JobEpochs(self.ledger, self.jobs.epoch_line(spec.job), spec.epochs_per_checkpoint,
                                spec.follows is not None, self.idle)
        self.jobs.ensure_worker_path(spec.job, self.worker)
        self.io.prepare()
        if self.io.may_join(self.epochs.line):  # else the first step waits for the old version's alignment
            self._join()
        return self

    def _join(self) -> None:
        self.sources.states = self.io.open()
        self.sources.follow()
        self.gate.follow()

    def _reopen(self, stop: threading.Event) -> None:
        alignment = self.io.reopen(stop, one_line)
        if alignment is not None:
            self.sources.states = alignment

    def close(self) -> None:
        try:
            self.reports.flush()
        except Exception as exc:  # closing after an outage or a stop: safe, the next incarnation reports again
            log.info("%s worker %d: last reports not confirmed: %s", self.spec.job, self.worker, exc)
        self.io.close()
        self.idle.close()

    # ---- reports ------------------------------------------------------------------------------

    def _report_all(self) -> None:
        for subject in self.spec.inputs:
            self._report(subject)

    def _report(self, subject: str) -> None:
        assert self.io.sink is not None and self.io.source is not None
        node = self.sources.node(subject, job_epoch=self.io.sink.lease.node.committed_epoch,
                                 subject_epoch=self.io.source.consumed(subject), swap_seen=self.gate.seen,
                                 waiting_since=self.idle.reported_since)
        self.reports.send(subject, node)

    def _apply_commands(self, open_epoch: int, boundary: bool) -> None:
        assert self.io.source is not None
        self.sources.apply(self.io.source, open_epoch, boundary, self._report)

    # ---- epochs -------------------------------------------------------------------------------

    def _process(self, records: Records) -> None:
        assert self.io.sink is not None
        shadow = self.spec.shadow_subject
        outputs = self._outputs(records)
        if self._voiding and shadow is not None:
            self.io.sink.lane(shadow).send_many(outputs)  # voided at the target, kept in the shadow for comparison
        elif self._voiding:
            for _ in outputs:  # state advances; the output is voided
                pass
        else:
            self.records_out += self.io.sink.send_many(outputs)
        self.records_in += len(records)

    def _outputs(self, records: Records) -> Emitted:
        """The job function's outputs for one fetched batch: one call for a batch function, one per record
        otherwise (lazily, so each record's outputs are sent before the next record is processed)."""
        fn, state = self.fn, self.io.state
        if takes_batch(fn):  # asked per fetch, not per record: ``fn`` may be replaced (benchmarks)
            return fn(records, state)  # type: ignore[arg-type]
        return (kv for r in records for kv in fn(r, state))  # type: ignore[arg-type]

    def _drain_until(self, done: Callable[[], bool], stop: threading.Event, open_epoch: int,
                     until: float | None = None) -> bool:
        """Read and process loaded epochs until ``done``; returns False when the inputs finished first.

        With nothing left to read it sleeps until a watch says the next input epoch committed (or a
        command arrives, or ``until``, the unaligned epoch's timer, passes): no fixed timeout, and
        no CPU spent on a quiet input.
        """
        source = self.io.source
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
                self.epochs.watch_epoch(subject, source.next_load(subject))
            if source.load():
                continue
            self.idle.waiting(f"the next epoch of {', '.join(self.spec.inputs)}")
            left = None if until is None else until - time.monotonic()
            self.idle.sleep(stop, 1.0 if left is None or left <= 0 else left)  # past the timer: woken by watches
        return True

    def _inputs_finished(self) -> bool:
        assert self.io.source is not None
        for subject in self.spec.inputs:
            last = self.ledger.epochs.finished_watched(subject)  # asked every epoch: kept by a watch, not read
            if last is None or self.io.source.consumed(subject) < last:
                return False
        return True

    def _run_unaligned(self, epoch: int, stop: threading.Event) -> None:
        """An epoch on the worker's own timer, unless an accepted Align makes it the last before J:
        then it ends exactly where subject epoch k starts, however long that takes. The Align may
        arrive while the epoch runs, so the rule is checked as the epoch goes, not only at its start."""
        ends = time.monotonic() + self.spec.interval
        source = self.io.source
        assert source is not None

        def done() -> bool:
            last_before_j = {s: a for s, a in self.sources.states.items()
                             if a.state is State.ALIGNING and a.job_epoch == epoch + 1}
            if last_before_j:
                return all(source.consumed(s) >= (a.subject_epoch or 0) - 1 for s, a in last_before_j.items())
            return time.monotonic() >= ends

        self._drain_until(done, stop, epoch, until=ends)

    def _run_aligned(self, epoch: int, stop: threading.Event) -> dict[str, Span | None]:
        covered = self.epochs.covered(epoch, self.sources.states, self.gate.old_decides, self._inputs_finished, stop)
        source = self.io.source
        assert source is not None
        for subject, span in covered.items():
            source.set_limit(subject, span.last if span is not None else source.consumed(subject))
        self._drain_until(lambda: all(span is None or source.consumed(s) >= span.last
                                      for s, span in covered.items()), stop, epoch)
        return covered

    def step(self, stop: threading.Event) -> bool:
        """Run one job epoch; returns False once every input finished and was consumed (or the old
        version of a hot-swap wrote its last epoch). Raises StoppedError when ``stop`` is set."""
        if self.io.sink is None and self.io.join_when_aligned(self.epochs.line):
            self._join()
        sink, source = self.io.sink, self.io.source
        assert sink is not None and source is not None, "open() first"
        epoch = sink.next_epoch
        self._apply_commands(epoch, boundary=True)
        decided = self.gate.before(epoch, stop)
        if decided.act is Act.FINISH:
            sink.finish()  # the old version wrote its last epoch, S; the new one writes S+1 on
            return False
        self._voiding = decided.act is Act.VOID
        shadow = self.spec.shadow_subject
        if decided.act is Act.WRITE and shadow is not None and shadow in sink.lanes:
            sink.finish_lane(shadow)  # the swap committed: the shadow ends at S, the target takes S+1 on
        if decided.act is Act.WRITE and not sink.holds_partitions:
            self.io.take_over(decided.await_target,
                              lambda last: self.gate.await_target(self.spec.output, last, stop))
        self.sources.started(epoch)
        sink.begin()
        covered = self._run_aligned(epoch, stop) if self.sources.aligned else None
        if covered is None:
            self._run_unaligned(epoch, stop)
        else:
            self.epochs.confirm(epoch)  # its coverage record, sent as the epoch began, stands
        node = WorkerEpochNode(epoch=epoch, mode="aligned" if covered is not None else self.spec.mode,
                               offsets=source.offsets(), load_from=source.load_from(), covered=covered,
                               alignment=self.sources.states, state_from=self.io.inherited)
        self._commit(node, decided.await_target, stop)
        # The Ready test reads each subject's frontier: only a consumer still catching up needs it.
        states = self.sources.states
        ahead = any(a.state is State.CATCHING_UP for a in states.values()) and source.second_last_ahead()
        for subject in self.spec.inputs:
            states[subject] = states[subject].caught_up(ahead)
            self._report(subject)
        if self._inputs_finished() and source.caught_up():
            sink.finish()
            return False
        return True

    def _commit(self, node: WorkerEpochNode, await_target: int | None, stop: threading.Event) -> None:
        """The epoch's output, changed keys and worker record in one transaction, after S at the target."""
        sink = self.io.sink
        assert sink is not None
        changelog = self.spec.changelog
        if changelog is not None:
            base = self.io.state_base_for(node.epoch)
            if base == node.epoch:
                self.io.state.mark_all_changed()  # this epoch's records hold the whole state: a new base
            node = node.model_copy(update={"state_base": base})
            for key, value in self.io.state.records():  # changed keys, in the epoch's transaction
                sink.send_to(changelog, value, key, self.worker)
        elif self.io.state.dirty:
            raise AlignerError(f"job {self.spec.job!r} declares no state (state='none') but its function put some")
        self.gate.await_target(self.spec.output, await_target, stop)
        done = sink.commit(extra=[self.jobs.worker_epoch_op(self.spec.job, self.worker, node)])
        if changelog is not None:
            written = done.also[changelog].get(self.worker)
            self.io.state.mark_committed(node.epoch, written.end if written is not None else None)
            self.io.inherited = None
            self.io.state_base = node.state_base
        if self.on_commit is not None:
            try:
                self.on_commit(node)
            except Exception:  # instrumentation must not stop a job whose epoch is committed
                log.exception("on_commit hook of %s worker %d failed at epoch %d", self.spec.job, self.worker,
                              node.epoch)
        self.fault("after_epoch")

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
                assert self.io.sink is not None
                on_epoch(self.io.sink.lease.node.committed_epoch or 0)
        return done


YOUNG_COLLECTION = 50_000
"""Container objects allocated between two young collections in a worker process (CPython's default: 700)."""


def settle_heap() -> None:
    """For a process that runs a worker from here on: what start-up made (modules, clients, the job's own
    set-up) lives as long as the process, so it is moved out of the collector's sight. Records are many
    short-lived objects; the full collections they trigger would otherwise walk all of it again and again
    (bench_pipeline: ~8 % of an aligned job's time, 0.26 s in 3 s, was spent in those collections).

    Young collections are made rarer too: a fetch's records (and the source's stash) stay alive through
    hundreds of default young collections, so each was scanned again and again and promoted to the old
    generation, whose full collections then walked them once more. bench_pipeline at 1M records (gc
    callbacks): collections took 1.0 s of a batch-path run's 7.8 s and 0.8 s of a record-path run's 8.2 s
    at the default thresholds, 0.17 s of either at this one; the raw loop in the same process 0.27 s."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION, 10, 10)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"
