"""A job worker as a process or a thread: the always-on shell around :class:`JobWorker`.

``python -m aligner.connectors.runtime.worker --job J --function mod:fn --input IN --output OUT`` (or
``python -m aligner.connectors.runtime.worker``) runs one worker until its inputs finish: SIGTERM or SIGINT
stops it within seconds with exit 0 and nothing lost (the open epoch is aborted and written again
by the next incarnation); a mistake is one line on stderr with exit 1 (2 for usage).
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer
from confluent_kafka import KafkaException
from typer._click import exceptions as click_errors  # typer vendors click: its exceptions are these

from aligner.connectors.runtime.job import JobFunction, JobSpec, JobWorker, one_line, settle_heap
from aligner.errors import AlignerError, StoppedError
from aligner.ledger import Ledger
from aligner.models import WorkerEpochNode
from aligner.settings import Settings

log = logging.getLogger(__name__)


class WorkerThread:
    """A job worker embedded in a process: its own thread and ZooKeeper session (tests, the demo,
    experiments). ``start()`` runs it; ``finish`` waits for it and releases its clients."""

    def __init__(self, zk: str, root: str, bootstrap: str, spec: JobSpec, index: int, fn: JobFunction,
                 on_commit: Callable[[WorkerEpochNode], None] | None = None) -> None:
        self.stop = threading.Event()
        self.ledger = Ledger.connect(zk, root, stop=self.stop)
        try:
            self.worker = JobWorker(self.ledger, bootstrap, spec, index, fn, on_commit=on_commit).open()
        except BaseException:
            self.ledger.close()
            raise
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"{spec.job}-{index}")

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run(self.stop)
        except BaseException as exc:  # recorded for finish()/the process, which report it; logged unless asked to stop
            if not (isinstance(exc, StoppedError) and self.stop.is_set()):
                log.error("%s worker %d ended: %s", self.worker.spec.job, self.worker.worker, one_line(exc),
                          exc_info=exc)
            self.error.append(exc)

    def finish(self, timeout: float) -> bool:
        """Wait for the job to end by itself (its inputs finished); if it does not within
        ``timeout``, stop it. Returns whether it ended by itself."""
        self.thread.join(timeout)
        by_itself = not self.thread.is_alive()
        if not by_itself:
            self.stop.set()
            self.thread.join(30)
        self.worker.close()
        self.ledger.close()
        return by_itself


def load_function(ref: str) -> JobFunction:
    module, _, name = ref.partition(":")
    if not name:
        raise AlignerError(f"job function {ref!r} must look like package.module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise AlignerError(f"job function {ref!r} cannot be loaded: {exc}") from None


def install_stop_signals(stop: threading.Event, grace: float = 4.5) -> None:
    """SIGTERM / SIGINT set ``stop``; a process still running ``grace`` seconds later exits anyway
    (code 0): every wait checks the flag within a second, so this only cuts off a client call stuck
    on an unreachable service, and a worker cut off there resumes from its last committed epoch.
    SIGUSR1 prints every thread's stack on stderr (the worker goes on): a worker that waits without
    saying why can be asked where it is, on any machine, without py-spy."""

    def stop_soon(_signum: int, _frame: Any) -> None:
        if stop.is_set():
            return
        stop.set()
        timer = threading.Timer(grace, lambda: os._exit(0))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, stop_soon)
    signal.signal(signal.SIGINT, stop_soon)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def run(
    job: Annotated[str, typer.Option(help="Job name")],
    function: Annotated[str, typer.Option(help="The job function, package.module:function")],
    input_: Annotated[list[str], typer.Option("--input", help="Input subject (repeat for several)")],
    output: Annotated[str, typer.Option(help="Output subject")],
    zk: Annotated[str | None, typer.Option(help="ZooKeeper (default: ALIGNER_ZK)")] = None,
    kafka: Annotated[str | None, typer.Option(help="Kafka bootstrap servers (default: ALIGNER_KAFKA)")] = None,
    root: Annotated[str | None, typer.Option(help="ZooKeeper root (default: ALIGNER_ROOT)")] = None,
    version: Annotated[str, typer.Option(help="Version of the job")] = "1",
    worker: Annotated[int, typer.Option(min=0, help="This worker's index")] = 0,
    parallelism: Annotated[int, typer.Option(min=1, help="Workers of the job")] = 1,
    interval: Annotated[float, typer.Option(min=0.001, help="Seconds per unaligned epoch")] = 1.0,
    mode: Annotated[str, typer.Option(help="exactly_once or at_least_once")] = "exactly_once",
    epochs_per_checkpoint: Annotated[int, typer.Option(min=1, help="Aligned: subject epochs per job epoch")] = 1,
    nondeterministic: Annotated[bool, typer.Option(help="The function is not deterministic")] = False,
    max_epochs: Annotated[int | None, typer.Option(min=0, help="Stop after this job epoch")] = None,
    follows: Annotated[str | None, typer.Option(help="Run as the new version of this job (hot-swap)")] = None,
    output_partitions: Annotated[str | None, typer.Option(help="Comma-separated output partitions to use")] = None,
    state: Annotated[str, typer.Option(help="Keyed state: memory, rocksdb (with --state-dir) or none")] = "memory",
    state_dir: Annotated[str | None, typer.Option(help="Directory of RocksDB state stores")] = None,
    inherit_state: Annotated[bool, typer.Option(help="With --follows: start from the old version's state")]
    = False,
    state_snapshot_every: Annotated[int, typer.Option(min=1, help="Write the whole state to the changelog every N "
                                                      "epochs (restores start there; retention collects below)")]
    = 1000,
    shadow: Annotated[bool, typer.Option(help="With --follows: write the voided output to JOB.shadow (verify)")]
    = False,
    metrics_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Serve Prometheus metrics here")]
    = None,
) -> None:
    """Run one worker of a job until its inputs finish (or SIGTERM)."""
    _check_options(worker, parallelism, mode, state, state_dir, shadow, follows)
    parts = _partitions(output_partitions)
    overrides: dict[str, Any] = {k: v for k, v in {"zk": zk, "kafka": kafka, "root": root}.items() if v is not None}
    settings = Settings(**overrides)
    spec = JobSpec(job=job, inputs=tuple(input_), output=output, parallelism=parallelism, version=version,
                   interval=interval, mode=mode,  # type: ignore[arg-type]
                   epochs_per_checkpoint=epochs_per_checkpoint, deterministic=not nondeterministic,
                   follows=follows, output_partitions=parts, state=state,  # type: ignore[arg-type]
                   state_dir=state_dir, inherit_state=inherit_state, shadow=shadow,
                   state_snapshot_every=state_snapshot_every)
    fn = load_function(function)
    if metrics_port is not None:
        _serve_metrics(metrics_port)
    _serve(settings, spec, worker, fn, max_epochs)


def _partitions(output_partitions: str | None) -> tuple[int, ...] | None:
    """``--output-partitions`` as partitions (None: the job's share of the output's partitions)."""
    try:
        return tuple(int(p) for p in output_partitions.split(",")) if output_partitions else None
    except ValueError:
        raise typer.BadParameter(f"{output_partitions!r} is not a list of partitions",
                                 param_hint="--output-partitions") from None


def _serve_metrics(port: int) -> None:
    from prometheus_client import start_http_server  # only a worker asked for metrics loads the exporter

    start_http_server(port)


def _check_options(worker: int, parallelism: int, mode: str, state: str, state_dir: str | None, shadow: bool,
                   follows: str | None) -> None:
    """Usage errors (exit 2) before anything connects."""
    if worker >= parallelism:
        raise typer.BadParameter(f"worker {worker} of a job with parallelism {parallelism}", param_hint="--worker")
    if mode not in ("exactly_once", "at_least_once"):
        raise typer.BadParameter(f"{mode!r} is not exactly_once or at_least_once", param_hint="--mode")
    if state not in ("memory", "rocksdb", "none"):
        raise typer.BadParameter(f"{state!r} is not memory, rocksdb or none", param_hint="--state")
    if shadow and follows is None:
        raise typer.BadParameter("--shadow needs --follows: only a new version writes a shadow", param_hint="--shadow")
    if state == "rocksdb" and state_dir is None:
        raise typer.BadParameter("--state rocksdb needs --state-dir", param_hint="--state-dir")


def _serve(settings: Settings, spec: JobSpec, worker: int, fn: JobFunction, max_epochs: int | None) -> None:
    """The worker's life: connect (waiting for ZooKeeper as long as it takes), open, run, close."""
    stop = threading.Event()
    install_stop_signals(stop)
    try:
        ledger = Ledger.connect(settings.zk, settings.root, timeout=None, stop=stop)
    except StoppedError:
        return
    except Exception as exc:  # kazoo's, TLS's or a timeout's: re-raised as the one-line error the process exits with
        raise AlignerError(f"cannot reach ZooKeeper at {settings.zk}: {one_line(exc)}") from None
    runner = JobWorker(ledger, settings.kafka, spec, worker, fn)
    try:
        runner.open()
        settle_heap()
        sink = runner.io.sink
        assert sink is not None
        print(f"open job={spec.job} worker={worker} next={sink.next_epoch} attempt={sink.attempt}", flush=True)
        left = None if max_epochs is None else max(0, max_epochs - sink.next_epoch)
        runner.run(stop, left, on_epoch=lambda e: print(f"committed {e} aligned={runner.sources.aligned}", flush=True))
    except StoppedError:
        pass
    finally:
        runner.close()
        ledger.close()
    print("done", flush=True)


def main(argv: list[str] | None = None) -> NoReturn:
    """One line on stderr for every failure: exit 2 for usage, 1 for the rest."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="aligner-worker", standalone_mode=False)
    except click_errors.UsageError as exc:
        print(f"aligner-worker: usage error: {' '.join(exc.format_message().split())} (see --help)",
              file=sys.stderr)
        sys.exit(2)
    except (AlignerError, ValueError) as exc:
        print(f"aligner-worker: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(1)
    except KafkaException as exc:  # a refusal, not an outage (those are waited out): one line, not a traceback
        print(f"aligner-worker: error: Kafka refused: {one_line(exc)}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
