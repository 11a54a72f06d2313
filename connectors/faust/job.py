"""The Faust adapter: a ``@job`` decorator that runs a library JobWorker as a Faust service."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import faust
from mode import Service

from aligner.ledger import Ledger
from aligner.models import Mode
from aligner.settings import Settings
from connectors.runtime import JobSpec, JobWorker, KeyedState
from connectors.sink import FaultHook
from connectors.source import SourceRecord

log = logging.getLogger("aligner.faust")

Emitted = Iterable[tuple[bytes | None, bytes]]
Report = Callable[[str], None]


def faust_app(app_id: str, *, kafka: str | None = None, **overrides: Any) -> faust.App:
    """A ``faust.App`` configured for aligned jobs on the embedded broker (or any Kafka).

    Faust still starts its own (non-transactional) consumer for its internal leader topic; the
    short session timeout makes a restarted worker rejoin within a few seconds after a SIGKILL.
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
        "broker_session_timeout": 3.0,
        "broker_heartbeat_interval": 0.5,
        "broker_rebalance_timeout": 3.0,
    }
    settings.update(overrides)
    return faust.App(app_id, **settings)


def _sync_function(fn: Callable[..., Any],
                   loop: asyncio.AbstractEventLoop) -> Callable[[SourceRecord, KeyedState], Emitted]:
    """A job function the worker thread can call: async ones are awaited on the Faust loop."""
    if inspect.isasyncgenfunction(fn):
        async def collect(record: SourceRecord, state: KeyedState) -> list[tuple[bytes | None, bytes]]:
            return [kv async for kv in fn(record, state)]
    elif inspect.iscoroutinefunction(fn):
        async def collect(record: SourceRecord, state: KeyedState) -> list[tuple[bytes | None, bytes]]:
            return list(await fn(record, state) or ())
    else:
        return fn

    def call(record: SourceRecord, state: KeyedState) -> Emitted:
        return asyncio.run_coroutine_threadsafe(collect(record, state), loop).result()

    return call


class AlignedJob:
    """One worker of an epoch job inside a Faust app; created by :func:`job`."""

    def __init__(self, app: faust.App, fn: Callable[..., Any], spec: JobSpec, *, worker: int | None = None,
                 settings: Settings | None = None, fault: FaultHook | None = None, report: Report | None = None,
                 wait_timeout: float = 120.0) -> None:
        self.app = app
        self.fn = fn
        self.spec = spec
        self.index = worker
        self.settings = settings
        self.fault = fault
        self.report = report or (lambda line: log.info("%s", line))
        self.wait_timeout = wait_timeout
        self.worker: JobWorker | None = None
        """The running library worker (for status pages and fault hooks); None before start."""
        self.finished = threading.Event()
        self._service: _JobService | None = None

        @app.task
        async def _start_aligned_job() -> None:
            self._service = _JobService(self, loop=asyncio.get_running_loop(), beacon=app.beacon)
            await app.add_runtime_dependency(self._service)

        self._task = _start_aligned_job

        @app.page(f"/aligned/{spec.job}/", name=f"aligned-{spec.job}")
        async def _status(view: Any, request: Any) -> Any:
            """This worker's job status on Faust's web server (when the worker runs with web)."""
            return view.json(self.status())

    def status(self) -> dict[str, Any]:
        w = self.worker
        if w is None:
            return {"job": self.spec.job, "running": False}
        return {"job": self.spec.job, "worker": w.worker, "running": not self.finished.is_set(),
                "committed_epoch": w.sink.lease.node.committed_epoch, "aligned": w.aligned,
                "follows": self.spec.follows, "swap": w._swap.model_dump() if w._swap is not None else None,
                "modes": {s: w.mode_of(s) for s in self.spec.inputs}, "records_in": w.records_in,
                "records_out": w.records_out}

    def run(self, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        """The blocking step loop: one job epoch per step until finished or stopped."""
        settings = self.settings or Settings()
        index = self.index if self.index is not None else int(os.environ.get("ALIGNER_WORKER", "0"))
        ledger = Ledger.connect(settings.zk, settings.root)
        try:
            worker = JobWorker(ledger, settings.kafka, self.spec, index, _sync_function(self.fn, loop),
                               fault=self.fault, wait_timeout=self.wait_timeout).open()
            self.worker = worker
            try:
                self.report(f"open job={self.spec.job} worker={index} next={worker.sink.next_epoch} "
                            f"attempt={worker.sink.attempt}")
                while not stop.is_set():
                    if not worker.step(stop):
                        break
                    self.report(f"committed {worker.sink.lease.node.committed_epoch} aligned={worker.aligned} "
                                f"in={worker.records_in} out={worker.records_out}")
                if not stop.is_set():
                    self.finished.set()
                    self.report(f"finished job={self.spec.job} worker={index} "
                                f"last={worker.sink.lease.node.committed_epoch}")
            finally:
                worker.close()
        finally:
            ledger.close()


class _JobService(Service):
    """Runs an AlignedJob's step loop in a thread for as long as the Faust app runs."""

    stop_timeout = 60.0

    def __init__(self, job: AlignedJob, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self._stop_flag = threading.Event()
        self._done: asyncio.Future[None] | None = None
        self._crashing: asyncio.Future[None] | None = None

    @property
    def label(self) -> str:
        return f"AlignedJob[{self.job.spec.job}]"

    async def on_start(self) -> None:
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()

        def target() -> None:
            error: BaseException | None = None
            try:
                self.job.run(self._stop_flag, loop)
            except BaseException as exc:
                error = exc
            loop.call_soon_threadsafe(self._finished, error)

        threading.Thread(target=target, name=self.label, daemon=True).start()

    def _finished(self, error: BaseException | None) -> None:
        assert self._done is not None
        if not self._done.done():
            self._done.set_result(None)
        if error is not None and not self._stop_flag.is_set():
            # A failed job worker crashes the Faust worker: restart it to resume from the last epoch.
            self._crashing = asyncio.ensure_future(self.crash(error))

    async def on_stop(self) -> None:
        self._stop_flag.set()  # the open epoch is aborted; it is written again after restart
        if self._done is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._done), self.stop_timeout)
            except TimeoutError:
                log.warning("%s did not stop within %.0fs", self.label, self.stop_timeout)


def job(app: faust.App, *, job_id: str, inputs: Sequence[str], output: str, parallelism: int = 1,
        version: str = "1", interval: float = 1.0, mode: Mode = "exactly_once", epochs_per_checkpoint: int = 1,
        deterministic: bool = True, follows: str | None = None, output_partitions: Sequence[int] | None = None,
        worker: int | None = None, settings: Settings | None = None, fault: FaultHook | None = None,
        report: Report | None = None, wait_timeout: float = 120.0) -> Callable[[Callable[..., Any]], AlignedJob]:
    """Declare an epoch job of ``app``: aligned-capable sources ``inputs``, stamped sink ``output``.

    The decorated function takes ``(record, state)`` (a :class:`SourceRecord` and the job's
    :class:`KeyedState`) and returns or yields ``(key, value)`` byte pairs; it may be a plain
    function or an ``async def`` generator. The job starts in ``mode`` (own epochs every
    ``interval`` seconds) and the coordinator aligns it on its inputs. Connection settings come from
    ``settings`` or the ``ALIGNER_*`` environment at worker start, the worker index from ``worker``
    or ``ALIGNER_WORKER``.

    Hot-swap: ``follows=OLD_JOB`` runs this app as the new version of ``OLD_JOB`` (it follows the old
    job's aligned epochs and voids its output until ``aligner hotswap`` commits the swap), and
    ``output_partitions`` restricts the job's producers to some partitions of ``output``, so the old
    and the new version write different partitions of the same target subject. The old version's
    step loop ends (``finished``) after the swap epoch S; the new one writes from S+1 on.
    """
    spec = JobSpec(job=job_id, inputs=tuple(inputs), output=output, parallelism=parallelism, version=version,
                   interval=interval, mode=mode, epochs_per_checkpoint=epochs_per_checkpoint,
                   deterministic=deterministic, follows=follows,
                   output_partitions=tuple(output_partitions) if output_partitions is not None else None)

    def decorate(fn: Callable[..., Any]) -> AlignedJob:
        return AlignedJob(app, fn, spec, worker=worker, settings=settings, fault=fault, report=report,
                          wait_timeout=wait_timeout)

    return decorate
