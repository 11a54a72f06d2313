"""The Faust adapter: a ``@job`` decorator that runs a library JobWorker as a Faust service."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import faust
from faust.types.settings import Settings as FaustSettings
from kazoo.handlers.threading import KazooTimeoutError
from mode import Service
from mode import Worker as ModeWorker

from aligner.connectors.faust.credentials import broker_credentials
from aligner.connectors.runtime import JobFunction, JobSpec, JobWorker, KeyedState, batch, settle_heap
from aligner.connectors.runtime.job_spec import takes_batch
from aligner.connectors.sink import TRANSIENT, FaultHook
from aligner.ledger import Ledger
from aligner.models import Mode
from aligner.settings import Settings
from aligner.zk import StoppedError

log = logging.getLogger(__name__)

Emitted = Iterable[tuple[bytes | None, bytes]]
Report = Callable[[str], None]

GROUP_SETTINGS: dict[str, float] = {
    "broker_session_timeout": 3.0,
    "broker_heartbeat_interval": 0.5,
    "broker_rebalance_timeout": 3.0,
}
"""Consumer group timeouts an app running aligned jobs gets when it left Faust's defaults (60 s, 3 s, 60 s).

The aligned job does not use Faust's consumer group (the job runtime owns its partitions), but the
Faust worker still joins one for its internal leader topic. With Faust's defaults the broker holds
the first JoinGroup of a fresh group for ~30 s and, after a SIGKILL, waits out the dead member's 60 s
session before the new one is admitted: ~110 s until Faust says "Ready". Short timeouts make that ~3 s."""

STOP_GRACE = 3.5
"""Seconds after SIGTERM/SIGINT after which a Faust worker running aligned jobs exits (code 0) even if a
client call stuck on an unreachable service holds it; the open epoch is uncommitted and runs again."""

JOB_STOP_WAIT = 3.0
"""Seconds the Faust worker's shutdown waits for the job thread (which checks its stop flag every second)."""


def _tune(conf: Any) -> None:
    """Shorten the consumer group timeouts the user left at Faust's defaults (explicit values are kept),
    and secure Faust's own Kafka connection from ``ALIGNER_KAFKA_CONFIG`` unless the app set
    ``broker_credentials`` itself."""
    for name, value in GROUP_SETTINGS.items():
        if getattr(conf, name) == FaustSettings.SETTINGS[name].default:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # set before any consumer exists; Faust warns anyway
                setattr(conf, name, value)
    if conf.broker_credentials is None:
        credentials = broker_credentials()
        if credentials is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # set before Faust's producer and consumer exist
                conf.broker_credentials = credentials


def configure(app: faust.App) -> faust.App:
    """Set what aligned jobs need on a Faust app the user built (idempotent; :func:`job` calls it).

    Only consumer group timeouts still at Faust's defaults change (see :data:`GROUP_SETTINGS`): the
    app's own agents and tables rebalance faster too, which is what a restarted worker wants.
    """
    if getattr(app, "_aligned_configured", False):
        return app
    app._aligned_configured = True  # type: ignore[attr-defined]
    if app.configured:
        _tune(app.conf)
    else:
        app.on_configured.connect(_tune_when_configured)
    return app


def _tune_when_configured(_sender: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
    """Faust's ``on_configured`` signal handler: the app's configuration comes as ``conf``."""
    _tune(kw.get("conf", args[0] if args else None))


def faust_app(app_id: str, *, kafka: str | None = None, **overrides: Any) -> faust.App:
    """A ``faust.App`` configured for aligned jobs on the embedded broker (or any Kafka).

    A plain ``faust.App`` works as well (:func:`job` sets the group timeouts it needs); this one also
    keeps Faust's data directory under ``ALIGNER_HOME`` and uses in-memory stores and single-partition
    internal topics, which suit the embedded single-node broker. Faust's own Kafka connection gets the
    SASL/TLS settings of ``ALIGNER_KAFKA_CONFIG`` (:func:`~aligner.connectors.faust.credentials.broker_credentials`;
    a :class:`KafkaConfigError` names a setting it cannot take) unless ``broker_credentials`` is given.
    """
    env = Settings()
    bootstrap = kafka or env.kafka
    (env.home / "faust").mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    settings: dict[str, Any] = {
        "datadir": str(env.home / "faust" / app_id),
        "broker": ",".join(f"kafka://{h}" for h in bootstrap.split(",")),
        "store": "memory://",
        "topic_replication_factor": 1,
        "topic_partitions": 1,
        **GROUP_SETTINGS,
    }
    settings.update(overrides)
    if settings.get("broker_credentials") is None:
        settings["broker_credentials"] = broker_credentials()
    return configure(faust.App(app_id, **settings))


def _sync_function(fn: Callable[..., Any], loop: asyncio.AbstractEventLoop) -> JobFunction:
    """A job function the worker thread can call: async ones are awaited on the Faust loop. ``item`` is a
    record, or one fetch's :class:`~aligner.connectors.source.Records` for a function marked with
    :func:`~aligner.connectors.runtime.batch`."""
    if inspect.isasyncgenfunction(fn):
        async def collect(item: Any, state: KeyedState) -> list[tuple[bytes | None, bytes]]:
            return [kv async for kv in fn(item, state)]
    elif inspect.iscoroutinefunction(fn):
        async def collect(item: Any, state: KeyedState) -> list[tuple[bytes | None, bytes]]:
            return list(await fn(item, state) or ())
    else:
        return fn

    def call(item: Any, state: KeyedState) -> Emitted:
        return asyncio.run_coroutine_threadsafe(collect(item, state), loop).result()

    return batch(call) if takes_batch(fn) else call


def _retrying(what: str, stop: threading.Event, attempt: Callable[[], Any],
              transient: tuple[type[BaseException], ...] = TRANSIENT) -> Any:
    """``attempt()`` until it works, retrying broker and ZooKeeper failures with backoff; None once stopped.

    A worker started while ZooKeeper or the broker is unreachable waits for them instead of crashing."""
    delay = 0.2
    while not stop.is_set():
        try:
            return attempt()
        except StoppedError:
            return None
        except transient as exc:
            if stop.is_set():
                return None
            log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__,
                        " ".join(str(exc).split())[:200], delay)
        stop.wait(delay)
        delay = min(delay * 2, 5.0)
    return None


class AlignedJob:
    """One worker of an epoch job inside a Faust app; created by :func:`job`."""

    def __init__(self, app: faust.App, fn: Callable[..., Any], spec: JobSpec, *, worker: int | None = None,
                 settings: Settings | None = None, fault: FaultHook | None = None,
                 report: Report | None = None, stop_grace: float | None = STOP_GRACE) -> None:
        self.app = configure(app)
        self.fn = fn
        self.spec = spec
        self.index = worker
        self.settings = settings
        self.fault = fault
        self.report = report or (lambda line: log.info("%s", line))
        self.stop_grace = stop_grace
        self.worker: JobWorker | None = None
        """The running library worker (for status pages and fault hooks); None before start."""
        self.finished = threading.Event()
        # Started with the app's own services, not as an @app.task: tasks wait until Faust's consumer
        # group settled, and the aligned job does not depend on that group at all.
        self._service = _JobService(self, beacon=app.beacon)
        app.add_dependency(self._service)

        @app.page(f"/aligned/{spec.job}/", name=f"aligned-{spec.job}")
        async def _status(view: Any, request: Any) -> Any:
            """This worker's job status on Faust's web server (when the worker runs with web)."""
            return view.json(self.status())

    def status(self) -> dict[str, Any]:
        w = self.worker
        if w is None or w.io.sink is None:
            return {"job": self.spec.job, "running": False}
        swap = w.gate.swap
        return {"job": self.spec.job, "worker": w.worker, "running": not self.finished.is_set(),
                "committed_epoch": w.io.sink.lease.node.committed_epoch, "aligned": w.sources.aligned,
                "follows": self.spec.follows, "swap": swap.model_dump(mode="json") if swap is not None else None,
                "modes": {s: w.sources.mode_of(s) for s in self.spec.inputs}, "records_in": w.records_in,
                "records_out": w.records_out, "waiting_since": w.idle.since}

    def run(self, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        """The blocking epoch loop: from the last committed epoch until the inputs finish or ``stop``.

        Broker and ZooKeeper failures are ridden out (the open epoch is aborted and written again); on
        ``stop`` the open epoch is aborted and the next start resumes from the last committed one."""
        settings = self.settings or Settings()
        index = self.index if self.index is not None else int(os.environ.get("ALIGNER_WORKER", "0"))
        ledger: Ledger | None = _retrying(f"connecting to ZooKeeper at {settings.zk}", stop,
                                          lambda: Ledger.connect(settings.zk, settings.root, timeout=5.0, stop=stop),
                                          (*TRANSIENT, KazooTimeoutError))
        if ledger is None:
            return
        try:
            worker = JobWorker(ledger, settings.kafka, self.spec, index, _sync_function(self.fn, loop),
                               fault=self.fault)

            def open_worker() -> JobWorker:
                try:
                    return worker.open()
                except BaseException:
                    worker.close()  # a partly opened sink or source; the next attempt opens anew
                    raise

            try:
                if _retrying(f"opening job {self.spec.job} worker {index}", stop, open_worker) is None:
                    return
                self.worker = worker
                settle_heap()
                assert worker.io.sink is not None
                self.report(f"open job={self.spec.job} worker={index} next={worker.io.sink.next_epoch} "
                            f"attempt={worker.io.sink.attempt}")
                worker.run(stop, on_epoch=lambda epoch: self.report(
                    f"committed {epoch} aligned={worker.sources.aligned} in={worker.records_in} "
                    f"out={worker.records_out}"))
                if not stop.is_set():
                    self.finished.set()
                    last = worker.io.sink.lease.node.committed_epoch if worker.io.sink is not None else None
                    self.report(f"finished job={self.spec.job} worker={index} last={last}")
            finally:
                worker.close()
        finally:
            ledger.close()


class _JobService(Service):
    """Runs an AlignedJob's epoch loop in a thread for as long as the Faust app runs."""

    def __init__(self, job: AlignedJob, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self._stop_flag = threading.Event()
        self._done: asyncio.Future[None] | None = None
        self._crashing: asyncio.Future[None] | None = None
        self._faust_worker: ModeWorker | None = None
        """The Faust worker whose SIGTERM/SIGINT handling this service chained into (None when not run by one)."""
        self._exit_code = 0

    @property
    def label(self) -> str:
        return f"AlignedJob[{self.job.spec.job}]"

    async def on_start(self) -> None:
        app = self.job.app
        if app.producer_only or app.client_only:
            return  # e.g. ``faust send``: only a worker runs the job
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._chain_stop_signals(loop)

        def target() -> None:
            error: BaseException | None = None
            try:
                self.job.run(self._stop_flag, loop)
            except BaseException as exc:  # handed to the loop's thread below, which reports it and stops the worker
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed: the process is exiting anyway
                loop.call_soon_threadsafe(self._finished, error)

        threading.Thread(target=target, name=self.label, daemon=True).start()

    def _chain_stop_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        """Under a Faust worker, SIGTERM/SIGINT first stop the job (its open epoch is aborted), then go
        on to Faust's own handler."""
        root = self.job.app.beacon.root
        worker = root.data if root is not None else None
        if not isinstance(worker, ModeWorker) or threading.current_thread() is not threading.main_thread():
            return
        handlers: dict[int, Callable[[], None]] = {
            signum: h for signum, name in ((signal.SIGTERM, "_on_sigterm"), (signal.SIGINT, "_on_sigint"))
            if callable(h := getattr(worker, name, None))}
        if len(handlers) < 2:
            return
        self._faust_worker = worker
        for signum, faust_handler in handlers.items():
            loop.add_signal_handler(signum, self._on_stop_signal, faust_handler)

    def _exit_if_clean(self, worker: ModeWorker) -> None:
        """At interpreter exit after a clean shutdown: skip the slow teardown of Faust's modules."""
        if worker.crash_reason is None:
            _exit_now(self._exit_code)

    def _on_stop_signal(self, faust_handler: Callable[[], None]) -> None:
        """Stop the job at once; a watchdog ends the process if Faust's shutdown outlasts the grace
        period, and a clean shutdown skips the interpreter's slow teardown of Faust's many modules
        (seconds on a busy machine). Every committed epoch is safe in ZooKeeper either way."""
        first = not self._stop_flag.is_set()
        self._stop_flag.set()
        worker = self._faust_worker
        if first and worker is not None and self.job.stop_grace is not None:
            grace = self.job.stop_grace
            timer = threading.Timer(grace, lambda: _exit_now(self._exit_code, f"stop took over {grace:.1f}s"))
            timer.daemon = True
            timer.start()
            atexit.register(self._exit_if_clean, worker)
        faust_handler()

    def _finished(self, error: BaseException | None) -> None:
        assert self._done is not None
        if not self._done.done():
            self._done.set_result(None)
        if error is None or self._stop_flag.is_set():
            return
        # A job that cannot go on (a mistake, or fenced by another incarnation) stops the Faust worker
        # with exit code 1 and one line saying why; a supervisor restarts it from the last committed epoch.
        log.error("%s failed: %s: %s", self.label, type(error).__name__, " ".join(str(error).split())[:500])
        if self._faust_worker is not None:
            self._exit_code = 1
            # The line above is the one the user reads: the teardown that follows may leave aiokafka connections
            # for the garbage collector, which asyncio would report as "Unclosed AIOKafkaConnection" lines.
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            os.kill(os.getpid(), signal.SIGTERM)  # Faust's orderly shutdown, as on SIGTERM
        else:
            self._crashing = asyncio.ensure_future(self.crash(error))

    async def on_stop(self) -> None:
        self._stop_flag.set()  # the open epoch is aborted; it is written again after restart
        if self._done is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._done), JOB_STOP_WAIT)
            except TimeoutError:
                log.warning("%s still in a client call after %.0fs; leaving it (its epoch stays uncommitted)",
                            self.label, JOB_STOP_WAIT)


def _exit_now(code: int, why: str | None = None) -> None:
    """Exit at once with output flushed (a stopping worker: every committed epoch is safe in ZooKeeper)."""
    if why is not None:
        log.warning("%s; exiting now", why)
    with contextlib.suppress(Exception):  # exiting now: a handler failing to close must not keep the process
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing left to flush into
            stream.flush()  # type: ignore[union-attr]
    os._exit(code)


def job(app: faust.App, *, job_id: str, inputs: Sequence[str], output: str, parallelism: int = 1,
        version: str = "1", interval: float = 1.0, mode: Mode = "exactly_once", epochs_per_checkpoint: int = 1,
        deterministic: bool = True, follows: str | None = None, output_partitions: Sequence[int] | None = None,
        inherit_state: bool = False, worker: int | None = None, settings: Settings | None = None,
        fault: FaultHook | None = None, report: Report | None = None, stop_grace: float | None = STOP_GRACE,
        ) -> Callable[[Callable[..., Any]], AlignedJob]:
    """Declare an epoch job of ``app``: aligned-capable sources ``inputs``, stamped sink ``output``.

    ``app`` may be any ``faust.App``: the job sets what it needs on it (:func:`configure`) and starts
    with the app's services, without waiting for Faust's consumer group. The decorated function takes
    ``(record, state)`` (a :class:`SourceRecord` and the job's :class:`KeyedState`) and returns or
    yields ``(key, value)`` byte pairs; it may be a plain function or an ``async def`` generator. Marked
    with :func:`~aligner.connectors.runtime.batch` (below ``@job``), it takes ``(records, state)``
    instead: the records of one fetch, within one job epoch, once per fetch. The
    job starts in ``mode`` (own epochs every ``interval`` seconds) and the coordinator aligns it on
    its inputs. It waits for input as long as it takes. Connection settings come from ``settings``
    or the ``ALIGNER_*`` environment at worker start, the worker index from ``worker`` or
    ``ALIGNER_WORKER``. SIGTERM or SIGINT stops the worker within ``stop_grace`` seconds, exit code 0.

    Hot-swap: ``follows=OLD_JOB`` runs this app as the new version of ``OLD_JOB`` (it follows the old
    job's aligned epochs and voids its output until ``aligner hotswap`` commits the swap, then takes the
    old version's partitions of ``output`` over from S+1), with ``inherit_state`` starting from the old
    version's keyed state (of any parallelism: see :mod:`aligner.keys`). ``output_partitions`` gives
    the job partitions of its own instead. The old version's step loop ends (``finished``) after the
    swap epoch S; the new one writes from S+1 on.
    """
    spec = JobSpec(job=job_id, inputs=tuple(inputs), output=output, parallelism=parallelism, version=version,
                   interval=interval, mode=mode, epochs_per_checkpoint=epochs_per_checkpoint,
                   deterministic=deterministic, follows=follows, inherit_state=inherit_state,
                   output_partitions=tuple(output_partitions) if output_partitions is not None else None,
                   engine="faust")

    def decorate(fn: Callable[..., Any]) -> AlignedJob:
        return AlignedJob(app, fn, spec, worker=worker, settings=settings, fault=fault, report=report,
                          stop_grace=stop_grace)

    return decorate
