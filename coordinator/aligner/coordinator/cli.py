"""The ``aligner`` command line: one CLI for the stack, the ledger, reads and the coordinator.

Every user mistake and every unreachable service ends in one line on stderr and exit code 1
(2 for usage errors), within bounded time: :func:`main` turns exceptions into messages by their
type, never by their text. ``ALIGNER_DEBUG=1`` shows the traceback of an unexpected error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from typer._click import exceptions as click_errors  # typer vendors click: its exceptions are these
from typer._click.globals import get_current_context

from aligner.coordinator import stack as stack_mod
from aligner.errors import AlignerError, StackError, StoppedError, UnreachableError
from aligner.settings import Settings

if TYPE_CHECKING:
    from aligner.ledger import Ledger

# The ledger, its models and the Kafka and ZooKeeper clients are imported where they are used, so
# that a usage error is reported without loading them (the CLI starts in about half the time).

ZK_CONNECT_TIMEOUT = 8.0
"""Seconds to wait for a ZooKeeper session before a command gives up (the address is named)."""
ZK_OUTAGE_LIMIT = 12.0
"""Seconds a one-shot command rides out a lost ZooKeeper connection before it gives up (commands that
wait, like align, ride out as long as their --timeout; the marker rides out any outage)."""
KAFKA_CONNECT_TIMEOUT = 8.0
"""Seconds to wait for the first Kafka metadata answer before a command gives up."""

app = typer.Typer(help="Epoch alignment for chained Kafka streaming jobs.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
stack_app = typer.Typer(help="The embedded ZooKeeper + Tansu stack.", no_args_is_help=True)
subjects_app = typer.Typer(help="Register and list subjects.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(subjects_app, name="subjects")

out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


class State:
    settings: Settings
    explicit: frozenset[str] = frozenset()
    """Connection settings given by flag or environment; the others may come from the embedded stack."""
    resolved = False
    embedded: stack_mod.StackInfo | None = None
    """The detached stack whose addresses this command uses, if any."""


state = State()


@app.callback()
def main_options(
    zk: Annotated[str | None, typer.Option(help="ZooKeeper connect string [env ALIGNER_ZK]")] = None,
    kafka: Annotated[str | None, typer.Option(help="Kafka bootstrap servers [env ALIGNER_KAFKA]")] = None,
    root: Annotated[str | None, typer.Option(help="ZooKeeper root of aligner state [env ALIGNER_ROOT]")] = None,
    zk_auth: Annotated[str | None, typer.Option(help="ZooKeeper identity digest:USER:PASSWORD [env ALIGNER_ZK_AUTH]",
                                                show_default=False)] = None,
    kafka_config: Annotated[str | None, typer.Option(help="Kafka client.properties file (SASL, TLS) "
                                                          "[env ALIGNER_KAFKA_CONFIG]")] = None,
) -> None:
    _security_options(zk_auth, kafka_config)
    overrides: dict[str, Any] = {k: v for k, v in {"zk": zk, "kafka": kafka, "root": root}.items() if v}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        usage(_validation_text(exc))
    state.settings = settings
    state.explicit = frozenset(settings.model_fields_set & {"zk", "kafka"})
    state.resolved = False
    state.embedded = None


def _security_options(zk_auth: str | None, kafka_config: str | None) -> None:
    """--zk-auth and --kafka-config are exported to the environment: every ZooKeeper session and Kafka
    client (here and in processes this command starts) reads them there, as it reads ALIGNER_*."""
    from aligner.settings import kafka_properties, parse_zk_auth

    if zk_auth is not None:
        try:
            parse_zk_auth(zk_auth)
        except ValueError as exc:
            usage(f"--zk-auth: {exc}")
        os.environ["ALIGNER_ZK_AUTH"] = zk_auth
    if kafka_config is not None:
        kafka_properties(kafka_config)  # a missing or unusable file is one clear error now
        os.environ["ALIGNER_KAFKA_CONFIG"] = os.path.abspath(kafka_config)


def emit(data: Any, as_json: bool) -> bool:
    """Print ``data`` as JSON when asked; returns whether it did."""
    if as_json:
        out.print_json(json.dumps(data, default=str))
    return as_json


def settings() -> Settings:
    """The effective settings: ZooKeeper and Kafka not given by flag or environment come from the
    embedded stack's state file when there is one, even when its components are down (a command
    then fails naming the address and how to restart it, instead of trying a default address)."""
    if not state.resolved:
        state.resolved = True
        if "zk" not in state.explicit:
            info = stack_mod.read_stack(state.settings.home)
            if info is not None:
                state.embedded = info
                update = {"zk": info.zk} if "kafka" in state.explicit else {"zk": info.zk, "kafka": info.kafka}
                state.settings = state.settings.model_copy(update=update)
                for name, path in info.env().items():  # a TLS stack's client files, unless set already
                    if name.startswith("ALIGNER_ZK_TLS_"):
                        os.environ.setdefault(name, path)
    return state.settings


def _stack_hint(name: str, address: str) -> str:
    """How to fix an unreachable service that is a component of the embedded stack ('' otherwise)."""
    info = state.embedded
    if info is None:
        with suppress(StackError):
            info = stack_mod.read_stack(state.settings.home)
    if info is None or info.address(name) != address:
        return ""
    comp = stack_mod.component(info, name)
    label = f"the embedded stack's {comp.label} (pid {comp.pid})"
    if comp.state == "down" and name == stack_mod.KAFKA:
        return f"{label} is down (it kept topics in memory: they are gone): `aligner stack up` restarts it " \
               f"on the same port"
    if comp.state == "down":
        return f"{label} is down: `aligner stack up` restarts it on the same port and data dir"
    if comp.state == "paused":
        return f"{label} is paused (SIGSTOP): `kill -CONT {comp.pid}` resumes it"
    return f"{label} is {comp.state}; see `aligner stack status` and {comp.log}"


def _unreachable(name: str, address: str, detail: str) -> UnreachableError:
    service = "ZooKeeper" if name == stack_mod.ZOOKEEPER else "Kafka"
    return UnreachableError(service, address, detail, _stack_hint(name, address))


def _probe_zookeeper(address: str) -> None:
    """Fail at once when every ZooKeeper server refuses the connection (kazoo would retry for its timeout)."""
    try:
        from kazoo.hosts import collect_hosts

        hosts, _chroot = collect_hosts(address)
    except ValueError as exc:
        raise AlignerError(f"invalid ZooKeeper address {address!r}: {exc}") from None
    failure: OSError | None = None
    for host, port in hosts:
        try:
            with socket.create_connection((host, port), timeout=3.0):
                return
        except OSError as exc:
            failure = exc
    if failure is not None:
        detail = ("unknown host" if isinstance(failure, socket.gaierror) else
                  "no answer to a TCP connect" if isinstance(failure, TimeoutError) else
                  (failure.strerror or type(failure).__name__).lower())
        raise _unreachable(stack_mod.ZOOKEEPER, address, detail)


@contextmanager
def ledger(outage_limit: float | None = ZK_OUTAGE_LIMIT, stop: threading.Event | None = None) -> Iterator[Ledger]:
    """A ledger session for one command; an unreachable ZooKeeper is one clear error naming its address.

    A connection lost for ``outage_limit`` seconds ends the command with that error (see
    :class:`aligner.session.OutageLimit`); None rides out outages of any length, the first
    connection included, until ``stop`` is set (long-running components: the marker)."""
    from kazoo.handlers.threading import KazooTimeoutError

    from aligner.ledger import Ledger
    from aligner.session import OutageLimit

    s = settings()
    if outage_limit is None:
        led = Ledger.connect(s.zk, s.root, timeout=None, stop=stop)  # waits for ZooKeeper as long as it takes
    else:
        _probe_zookeeper(s.zk)
        try:
            led = Ledger.connect(s.zk, s.root, timeout=ZK_CONNECT_TIMEOUT)
        except KazooTimeoutError:
            raise _unreachable(stack_mod.ZOOKEEPER, s.zk, f"no session within {ZK_CONNECT_TIMEOUT:.0f}s") from None
    bound = OutageLimit(led, outage_limit) if outage_limit is not None else None
    try:
        yield led
    except AlignerError:
        if bound is not None and bound.gave_up.is_set():
            raise _unreachable(stack_mod.ZOOKEEPER, s.zk,
                               f"the connection was lost for more than {outage_limit:.0f}s") from None
        raise
    finally:
        if bound is not None:
            bound.close()  # closing the session reports LOST; that is no outage
        with suppress(Exception):
            led.close()


def kafka() -> str:
    """The Kafka bootstrap servers, checked to answer: an unreachable broker fails fast and clearly."""
    from aligner.connectors.kafka import check_reachable

    bootstrap = settings().kafka
    try:
        check_reachable(bootstrap, KAFKA_CONNECT_TIMEOUT)
    except UnreachableError as exc:
        raise _unreachable(stack_mod.KAFKA, bootstrap, exc.detail) from None
    return bootstrap


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def usage(message: str) -> NoReturn:
    """A usage error of the running command: one line and exit 2 (see :func:`main`)."""
    raise click_errors.UsageError(message, ctx=get_current_context(silent=True))


def _name(value: str | None) -> str | None:
    """Subject and job names are checked before anything is sent: they become znode names."""
    from pydantic import TypeAdapter

    from aligner.models import Ident

    if value is None:
        return value
    try:
        TypeAdapter(Ident).validate_python(value)
    except ValidationError:
        raise typer.BadParameter(f"{value!r} is not a valid name: use 1-120 of A-Z a-z 0-9 . _ -") from None
    return value


def _names(values: list[str] | None) -> list[str] | None:
    return None if values is None else [v for v in values if _name(v)]


def _epochs(spec: str) -> tuple[int, int]:
    from aligner.epochs import parse_epoch_span

    try:
        return parse_epoch_span(spec)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--epochs'") from None


def _topic(value: str | None) -> str | None:
    if value is not None and not _TOPIC.match(value):
        raise typer.BadParameter(f"{value!r} is not a valid Kafka topic name: use 1-249 of A-Z a-z 0-9 . _ -")
    return value


Name = Annotated[str, typer.Argument(callback=_name, show_default=False)]


class ValueFormat(StrEnum):
    json = "json"
    bytes = "bytes"


# ---- stack ---------------------------------------------------------------------------------------

@stack_app.command("up")
def stack_up(
    as_json: JsonFlag = False,
    zk_tls: Annotated[bool, typer.Option("--zk-tls", help="ZooKeeper on a TLS client port only (a throwaway "
                                         "CA and certificates in the stack's data dir; `stack env` exports them)")
                      ] = False,
) -> None:
    """Start ZooKeeper and Tansu, or restart only the components that are down (same port and data)."""
    info, actions = stack_mod.stack_up(state.settings.home, zk_tls=zk_tls)
    if emit({**asdict(info), "actions": actions}, as_json):
        return
    for comp in stack_mod.components(info):
        tls = " over TLS" if comp.name == stack_mod.ZOOKEEPER and info.zk_tls else ""
        out.print(f"{comp.label} {comp.address}{tls}: {actions[comp.name]} (pid {comp.pid}, {comp.state})")
    if actions.get(stack_mod.KAFKA) == "restarted":
        err.print("note: the restarted broker starts empty (Tansu keeps topics in memory)", soft_wrap=True)
    out.print('eval "$(aligner stack env)" points other shells at it')


@stack_app.command("status")
def stack_status(as_json: JsonFlag = False) -> None:
    """Each component of the embedded stack: up or down, pid, port, data dir and log."""
    home = state.settings.home
    info = stack_mod.read_stack(home)
    if info is None:
        raise StackError(f"no embedded stack in {home}: `aligner stack up` starts one")
    comps = stack_mod.components(info)
    if emit({"home": str(home), "workdir": info.workdir, "components": [asdict(c) for c in comps]}, as_json):
        return
    width = max(len(c.label) for c in comps)
    for c in comps:
        colour = "green" if c.up else "red"
        out.print(f"{c.label:<{width}}  [{colour}]{c.state:<13}[/] pid {c.pid:<7} {c.address}  data {c.data}  "
                  f"log {c.log}", soft_wrap=True)
    if not all(c.up for c in comps):
        out.print("`aligner stack up` restarts what is down, on its own port and data")


@stack_app.command("down")
def stack_down(as_json: JsonFlag = False) -> None:
    """Stop the embedded stack and remove its data; the only command that removes stack state."""
    done = stack_mod.stack_down(state.settings.home)
    if emit({"stopped": bool(done), "removed": done}, as_json):
        return
    if not done:
        out.print("no stack was running; nothing removed")
        return
    out.print("stack stopped:")
    for line in done:
        out.print(f"  {line}", markup=False, soft_wrap=True)


@stack_app.command("env")
def stack_env(as_json: JsonFlag = False) -> None:
    """Print the connection settings of the embedded stack as shell exports."""
    info = stack_mod.read_stack(state.settings.home)
    if info is None:
        raise StackError("no embedded stack is running: `aligner stack up` starts one")
    down = [c for c in stack_mod.components(info) if c.state == "down"]
    if down:
        err.print(f"warning: {', '.join(c.label for c in down)} down: `aligner stack up` restarts it",
                  markup=False, soft_wrap=True)
    if not emit(info.env(), as_json):
        for k, v in info.env().items():
            print(f"export {k}={v}")


# ---- subjects ------------------------------------------------------------------------------------

@subjects_app.command("create")
def subjects_create(
    name: Name,
    partitions: Annotated[int, typer.Option(min=1, help="Partition count of the topic")] = 4,
    topic: Annotated[str | None, typer.Option(callback=_topic, help="Kafka topic (default: the subject name)")] = None,
    value_format: Annotated[ValueFormat, typer.Option("--format", help="Record values")] = ValueFormat.json,
    as_json: JsonFlag = False,
) -> None:
    """Create the topic and register the subject (idempotent for the same shape)."""
    from aligner.connectors.subjects import create_subject

    with ledger() as led:
        node = create_subject(led, kafka(), name, partitions, topic=topic, value_format=value_format.value)
    if not emit(node.model_dump(), as_json):
        out.print(f"subject [bold]{node.name}[/] on topic {node.topic} ({node.partitions} partitions)")


@subjects_app.command("list")
def subjects_list(as_json: JsonFlag = False) -> None:
    """List registered subjects."""
    with ledger() as led:
        names = led.subject_names()
    if not emit(names, as_json):
        for n in names:
            out.print(n)


# ---- status / epochs -----------------------------------------------------------------------------

def _subject_status(led: Ledger, name: str) -> dict[str, Any]:
    meta = led.subject(name)
    numbers = led.epoch_numbers(name)
    sinks = {}
    for sink in led.sinks(name):
        sinks[sink] = [
            {"producer": p.producer, "partitions": list(p.partitions), "incarnation": p.incarnation,
             "committed_epoch": p.committed_epoch}
            for p in led.producers(name, sink)
        ]
    return {"subject": name, "topic": meta.topic, "partitions": meta.partitions,
            "epochs": len(numbers), "last_committed": led.frontier(name), "sinks": sinks}


@app.command()
def status(as_json: JsonFlag = False) -> None:
    """Subjects with their epochs, sinks and producers."""
    from aligner.lineage import query_statuses

    with ledger() as led:
        rows = [_subject_status(led, n) for n in led.subject_names()]
        jobs = _job_rows(led)
        queries = query_statuses(led)
    if emit({"subjects": rows, "jobs": jobs, "spark_queries": queries}, as_json):
        return
    table = Table(title="subjects")
    for col in ("subject", "topic", "partitions", "epochs", "last committed", "sinks / producers"):
        table.add_column(col)
    for r in rows:
        prods = "; ".join(
            f"{sink}: " + ", ".join(f"{p['producer']}@{p['committed_epoch']} (inc {p['incarnation']})" for p in ps)
            for sink, ps in r["sinks"].items()
        )
        table.add_row(r["subject"], r["topic"], str(r["partitions"]), str(r["epochs"]),
                      str(r["last_committed"]), prods or "-")
    out.print(table)
    if jobs:
        _print_jobs(jobs)
    if queries:
        _print_queries(queries)


@app.command()
def epochs(
    subject: Name,
    last: Annotated[int, typer.Option(min=1, help="Show only the last N epochs")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Epochs of a subject: committed or waiting, and their per-partition offset ranges."""
    with ledger() as led:
        rows = []
        for n in led.epoch_numbers(subject)[-last:]:
            node = led.epoch_node(subject, n)
            if led.is_committed(subject, n):
                ce = led.committed(subject, n)
                ranges = {str(p): [s, e] for p, (s, e) in ce.offsets.items()}
                rows.append({"epoch": n, "committed": True, "writers": list(node.writers), "ranges": ranges})
            else:
                rows.append({"epoch": n, "committed": False, "writers": list(node.writers), "ranges": {}})
    if emit({"subject": subject, "epochs": rows}, as_json):
        return
    table = Table(title=f"epochs of {subject}")
    for col in ("epoch", "state", "writers", "ranges [start, end)"):
        table.add_column(col)
    for r in rows:
        ranges = " ".join(f"{p}:[{s},{e})" for p, (s, e) in r["ranges"].items())
        table.add_row(str(r["epoch"]), "committed" if r["committed"] else "open", ",".join(r["writers"]), ranges)
    out.print(table)


# ---- read ----------------------------------------------------------------------------------------

@app.command()
def read(
    subject: Name,
    epoch: Annotated[int | None, typer.Option(min=0, help="One epoch")] = None,
    epochs_: Annotated[str | None, typer.Option("--epochs", help="Inclusive span A:B")] = None,
    value_format: Annotated[ValueFormat | None, typer.Option(
        "--format",
        help="Show values as JSON or as text (bytes); default: the subject's format. Use bytes for a json "
             "subject that holds records outside producers wrote in another format.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Exactly the committed records of the given epochs, in partition and offset order."""
    from aligner.connectors.reader import EpochReader

    if (epoch is None) == (epochs_ is None):
        usage("give exactly one of --epoch N or --epochs A:B")
    first, last = (epoch, epoch) if epoch is not None else _epochs(epochs_ or "")
    with ledger() as led:
        decode = (value_format.value if value_format else led.subject(subject).value_format) == "json"
        led.committed_many(subject, first, last)  # a span that is not committed fails before Kafka is asked
        with EpochReader(led, kafka()) as reader:
            records = [r.as_json(decode, subject) for r in reader.read(subject, first, last)]
    if emit({"subject": subject, "first": first, "last": last, "records": records}, as_json):
        return
    for r in records:
        out.print(f"epoch {r['epoch']} p{r['partition']}@{r['offset']} {r['key'] or ''} {r['value']}", markup=False)
    err.print(f"{len(records)} records from epochs {first}..{last}")


# ---- markers -------------------------------------------------------------------------------------

@app.command()
def markers(
    subject: Name,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between epochs")] = 1.0,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after N epochs")] = None,
    from_end: Annotated[bool, typer.Option(help="Start at the current end instead of the log start")] = False,
    metrics_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Serve Prometheus metrics on this port")
                            ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Cut epochs of a subject written by outside producers, from stable end offsets.

    Long-running: it rides out ZooKeeper and broker outages, and SIGTERM or SIGINT stops it
    within seconds with exit code 0."""
    from aligner.connectors.marker import EpochMarker

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)  # a port in use is an OSError: one line, exit 1

    def show(epoch: int, ranges: dict) -> None:
        data = {"epoch": epoch, "ranges": {str(p): [r.start, r.end] for p, r in ranges.items()}}
        if not emit(data, as_json):
            out.print(f"epoch {epoch}: " + " ".join(f"{p}:[{s},{e})" for p, (s, e) in data["ranges"].items()))

    logging.getLogger("aligner").setLevel(logging.WARNING)  # a long-running component reports outages
    try:
        with ledger(outage_limit=None, stop=stop) as led:
            led.subject(subject)
            marker = EpochMarker(led, kafka(), subject, from_beginning=not from_end).open()
            try:
                marker.run(interval, stop, count, show)
            finally:
                marker.close()
    except StoppedError:
        if not stop.is_set():
            raise  # not ours: report it


@app.command()
def exporter(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Serve Prometheus metrics on this port")],
    interval: Annotated[float, typer.Option(min=0.5, help="Seconds between ledger reads")] = 5.0,
) -> None:
    """Export the whole deployment's state to Prometheus: subject frontiers, each job's lag and
    alignment state, hot-swap phases, Spark queries.

    Long-running: it waits for ZooKeeper and rides out outages (serving the last snapshot, marked
    stale), and SIGTERM or SIGINT stops it within seconds with exit code 0."""
    from prometheus_client import REGISTRY, start_http_server

    from aligner.coordinator.exporter import LedgerCollector

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logging.getLogger("aligner").setLevel(logging.WARNING)
    try:
        with ledger(outage_limit=None, stop=stop) as led:
            collector = LedgerCollector(led, interval)
            REGISTRY.register(collector)
            start_http_server(port)  # a port in use is an OSError: one line, exit 1
            err.print(f"exporting on :{port}/metrics every {interval:g}s")
            collector.run(stop)
    except StoppedError:
        if not stop.is_set():
            raise


# ---- jobs and alignment --------------------------------------------------------------------------

def _job_rows(led: Ledger) -> list[dict[str, Any]]:
    from aligner.coordinator.alignment import Coordinator

    coord = Coordinator(led)
    return [coord.status(job) for job in coord.jobs.job_names()]


def _print_queries(rows: list[dict[str, Any]]) -> None:
    table = Table(title="spark queries")
    for col in ("query", "last batch", "subject", "read epochs", "behind epochs", "behind s"):
        table.add_column(col)
    for q in rows:
        for subject, r in q["subjects"].items() or {"-": None}.items():
            if r is None:
                table.add_row(q["query"], str(q["batch"]), "-", "-", "-", "-")
                continue
            table.add_row(q["query"], str(q["batch"]), subject, f"{r['first']}..{r['last']}",
                          str(r["behind_epochs"]), f"{r['behind_seconds']:.2f}")
    out.print(table)


def _print_jobs(rows: list[dict[str, Any]]) -> None:
    table = Table(title="jobs")
    for col in ("job", "version", "source", "mode", "state", "aligned at (k, J)", "lag epochs", "lag s", "waiting s",
                "decision"):
        table.add_column(col)
    for j in rows:
        for s in j["sources"]:
            at = f"({s['subject_epoch']}, {s['job_epoch']})" if s["subject_epoch"] is not None else "-"
            table.add_row(j["job"], j["version"], s["subject"], s["mode"], s["state"], at, str(s["lag_epochs"]),
                          f"{s['lag_seconds']:.2f}",
                          "-" if s["waiting_seconds"] is None else f"{s['waiting_seconds']:.0f}", j["decision"] or "-")
    out.print(table)


@app.command()
def align(
    job: Name,
    subject: Annotated[
        list[str] | None, typer.Option("--subject", callback=_names, help="Input subject(s) to align (default all)")
    ] = None,
    at_epoch: Annotated[int | None, typer.Option(min=0, help="Align from this subject epoch at the earliest")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for each phase")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Align a job's sources on their subjects' epochs: CatchUp -> Ready -> Align(k) -> Aligned."""
    from rich.live import Live

    from aligner.coordinator.alignment import Coordinator, leadership

    with ledger(max(ZK_OUTAGE_LIMIT, timeout)) as led, leadership(led, timeout=timeout):
        coord = Coordinator(led)
        if as_json:
            decision = coord.align(job, subject, at_epoch, timeout=timeout)
        else:
            with Live(console=err, refresh_per_second=8, transient=True) as live:
                def progress(what: str, sources: dict[str, dict[str, Any]]) -> None:
                    lines = [f"[bold]{job}[/] {what}"] + [
                        f"  {s}: {st['state']} lag {st['lag_epochs']} epochs ({st['lag_seconds']:.2f}s)"
                        for s, st in sources.items()]
                    live.update("\n".join(lines))

                decision = coord.align(job, subject, at_epoch, timeout=timeout, progress=progress)
        status_row = coord.status(job)
    if not emit({"decision": decision.model_dump(), "status": status_row}, as_json):
        out.print(f"[green]aligned[/] {job}: job epoch {decision.job_epoch} starts at subject epochs "
                  f"{decision.subject_epochs}")


@app.command()
def abort(
    job: Name,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for every consumer")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Return a job's sources to unaligned mode from any alignment state."""
    from aligner.coordinator.alignment import Coordinator, leadership

    with ledger(max(ZK_OUTAGE_LIMIT, timeout)) as led, leadership(led, timeout=timeout):
        decision = Coordinator(led).abort(job, timeout=timeout)
    if not emit({"decision": decision.model_dump()}, as_json):
        out.print(f"[yellow]aborted[/] alignment of {job}: sources unaligned")


@app.command()
def lineage(
    job: Annotated[str | None, typer.Option(callback=_name, help="A job or Spark sink id")] = None,
    subject: Annotated[str | None, typer.Option(callback=_name, help="A subject")] = None,
    epoch: Annotated[int, typer.Option(min=0, help="The job or subject epoch")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Which upstream subject epochs an epoch of a job, a Spark sink or a subject contains, transitively."""
    from aligner.lineage import epoch_lineage, flatten, subject_epoch_lineage

    if (job is None) == (subject is None):
        usage("give exactly one of --job or --subject")
    with ledger() as led:
        tree = epoch_lineage(led, job, epoch)[1] if job else subject_epoch_lineage(led, subject or "", epoch)
    cut = flatten(tree)
    if not emit({"lineage": tree, "cut": cut}, as_json):
        for s, epochs_ in cut.items():
            out.print(f"{s}: epochs {epochs_}")


@app.command()
def hotswap(
    old: Annotated[str, typer.Option("--old", callback=_name, help="The running job")],
    new: Annotated[str, typer.Option("--new", callback=_name, help="Its new version, started with follows=OLD")],
    subject: Annotated[str, typer.Option("--subject", callback=_name, help="The target subject both write")],
    at_epoch: Annotated[int | None, typer.Option(min=0, help="Swap at this target epoch at the earliest")] = None,
    abort_swap: Annotated[bool, typer.Option("--abort", help="Abort a swap that is not committed yet")] = False,
    verify_epochs: Annotated[int | None, typer.Option(
        min=1, help="First compare NEW's shadow with OLD over this many epochs; refuse the swap if they differ")
    ] = None,
    ignore_field: Annotated[list[str] | None, typer.Option(
        help="With --verify-epochs: a JSON field of the values that is meant to differ (repeat)")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for each phase")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Swap OLD for NEW on SUBJECT at a future epoch S, exactly once: OLD writes <= S, NEW writes > S."""
    from aligner.coordinator.alignment import leadership
    from aligner.coordinator.hotswap import HotSwap
    from aligner.coordinator.verify import verify_before_swap

    if old == new:
        usage("--old and --new must name two different jobs")
    if abort_swap and (at_epoch is not None or verify_epochs is not None):
        usage("--abort takes no --at-epoch or --verify-epochs")
    if ignore_field and verify_epochs is None:
        usage("--ignore-field needs --verify-epochs")
    with ledger(max(ZK_OUTAGE_LIMIT, timeout)) as led, leadership(led, timeout=timeout):
        swapper = HotSwap(led)
        if abort_swap:
            node = swapper.abort(old)
        else:
            if verify_epochs is not None:
                swapper.check(old, new, subject)
                report = verify_before_swap(led, kafka(), old, new, verify_epochs, ignore_field or (), timeout)
                if report is not None and not as_json:
                    err.print(f"verified: {new} agrees with {old} over epochs {report['first']}..{report['last']} "
                              f"({report['records']} records)")
            def progress(what: str, info: dict[str, Any]) -> None:
                if not as_json:
                    err.print(f"[dim]{what}[/] {info.get('phase', '')} S={info.get('epoch', '?')}", end="\r")

            node = swapper.run(old, new, subject, at_epoch, timeout=timeout, progress=progress)
    if not emit(node.model_dump(), as_json):
        verb = "aborted" if node.phase == "aborted" else "swapped"
        out.print(f"[green]{verb}[/] {old} -> {new} on {subject}: {old} wrote epochs <= {node.epoch}, "
                  f"{new} writes from {node.epoch + 1}")


@app.command()
def verify(
    job: Annotated[list[str] | None, typer.Option("--job", callback=_names, help="Two jobs whose outputs to compare")
                   ] = None,
    subject: Annotated[list[str] | None, typer.Option("--subject", callback=_names, help="Or two subjects")] = None,
    epochs_: Annotated[str | None, typer.Option(
        "--epochs", help="Inclusive span A:B (default with two jobs, one shadowing the other: every epoch both "
                         "committed)")] = None,
    ignore_field: Annotated[list[str] | None, typer.Option(
        help="A JSON field of the values that is meant to differ (repeat)")] = None,
    consumed: Annotated[str | None, typer.Option(
        "--consumed", callback=_name, metavar="SUBJECT",
        help="Instead: did the --job's (two or more) consume identical whole epochs of SUBJECT, every checkpoint "
             "on an epoch boundary? Exit 1 if not")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Diff two jobs' (or subjects') outputs epoch by epoch as multisets; report the first difference.

    A new version running with --shadow is read from its shadow subject. With --consumed SUBJECT, compare
    instead which epochs of SUBJECT the jobs consumed (from their committed aligned job epochs)."""
    from aligner.coordinator.verify import shadow_span, verify_outputs

    if consumed is not None:
        _verify_consumed(consumed, list(job or []), bool(subject or epochs_ or ignore_field), as_json)
        return
    names = list(job or []) + list(subject or [])
    if len(names) != 2 or (job and subject):
        usage("give exactly two --job or two --subject")
    if epochs_ is None and not job:
        usage("--epochs is needed to compare two subjects")
    with ledger() as led:
        if epochs_ is not None:
            first, last = _epochs(epochs_)
        else:
            span = shadow_span(led, *names) or shadow_span(led, *reversed(names))
            if span is None:
                raise AlignerError(f"no epochs to compare: neither of {names} runs as a shadowing new version of the "
                                   f"other with committed shadow epochs; give --epochs")
            first, last = span
        report = verify_outputs(led, kafka(), names, first, last, by_job=bool(job), ignore=ignore_field or ())
    if not emit(report, as_json):
        if report["first_difference"] is None:
            out.print(f"[green]identical[/] {names[0]} and {names[1]} over epochs {first}..{last}")
        else:
            d = report["first_difference"]
            out.print(f"[red]differ[/] first at epoch {d['epoch']}: {d['only_first']} only in {names[0]}, "
                      f"{d['only_second']} only in {names[1]}")
    if report["first_difference"] is not None:
        raise typer.Exit(3)


def _verify_consumed(subject: str, jobs: list[str], other_options: bool, as_json: bool) -> None:
    """``verify --consumed``: the consumed epochs of ``subject`` per job, and whether they are identical."""
    from aligner.coordinator.verify import span_text, verify_consumed

    if other_options:
        usage("--consumed compares the --job's only: no --subject, --epochs or --ignore-field")
    if len(set(jobs)) < 2:
        usage("--consumed needs at least two different --job")
    with ledger() as led:
        report = verify_consumed(led, subject, jobs)
    differences = report["differences"]
    if not emit(report, as_json):
        for r in report["jobs"]:
            aligned = {True: "; its last checkpoint before its alignment ended on an epoch boundary",
                       False: "; its last checkpoint before its alignment is off the epoch boundaries",
                       None: ""}[r["aligned_from_boundary"]]
            out.print(f"{r['job']}: epochs {span_text(r['consumed'])} of {subject} in {r['checkpoints']} committed "
                      f"checkpoints (job epochs of {r['epoch_line']}){aligned}")
        if not differences:
            out.print(f"[green]identical[/] {', '.join(jobs)} consumed the same {report['identical']} whole epochs "
                      f"{report['first']}..{report['last']} of {subject}, every checkpoint on an epoch boundary")
    if differences:
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        err.print(f"differ: {differences[0]}{more}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def gc(
    keep_epochs: Annotated[int, typer.Option(min=1, help="Keep the last N committed epochs per subject")] = 100,
    keep_seconds: Annotated[float | None, typer.Option(min=0, help="Also keep epochs younger than T s")] = None,
    subject: Annotated[list[str] | None, typer.Option("--subject", callback=_names, help="Only these subjects")
                       ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report, delete nothing")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove old epoch records and swapped-out jobs' state, keeping what readers and lineage need."""
    from aligner.coordinator.gc import collect

    with ledger() as led:
        report = collect(led, keep_epochs, keep_seconds, subject, dry_run)
    if not emit(report, as_json):
        for s, r in report["subjects"].items():
            out.print(f"{s}: first retained epoch {r['first_retained']}, {r['deleted_epochs']} epochs removed")
        for j, r in report["jobs"].items():
            out.print(f"job {j}: {r['deleted_nodes']} nodes removed" + (" (swapped out)" if r["swapped_out"] else ""))


# ---- acl -----------------------------------------------------------------------------------------

acl_app = typer.Typer(help="ZooKeeper ACLs: who may write which subjects and jobs.", no_args_is_help=True)
app.add_typer(acl_app, name="acl")


@acl_app.command("grant")
def acl_grant(
    identity: Annotated[str | None, typer.Option(help="USER:PASSWORD, or USER once known (only a digest is stored)",
                                                 show_default=False)] = None,
    subject: Annotated[list[str] | None, typer.Option(callback=_names, help="Subject it may commit (repeat)")] = None,
    job: Annotated[list[str] | None, typer.Option(callback=_names, help="Job (or Spark query) it may run")] = None,
    reader: Annotated[bool, typer.Option("--reader", help="Make it a reader (then only readers read)")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Grant an identity subjects and jobs, and apply the ACLs to existing nodes. The first grant makes
    the --zk-auth identity the admin (coordinator) and secures the whole tree."""
    from aligner.acl import AclLedger, grants_json
    from aligner.settings import zk_security

    if identity is None and (subject or job or reader):
        usage("--subject, --job and --reader need --identity")
    with ledger() as led:
        grants = AclLedger(led).grant(zk_security().auth, identity, subject or (), job or (), reader)
    if not emit(grants_json(grants), as_json):
        out.print(f"admin {grants.admin}; " + (f"{identity.split(':', 1)[0]} granted" if identity else "ACLs applied"),
                  markup=False)


@acl_app.command("show")
def acl_show(
    path: Annotated[str | None, typer.Argument(help="A ZooKeeper path (default: the root)", show_default=False)] = None,
    depth: Annotated[int, typer.Option(min=0, help="Levels of children to show")] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Print the ACLs of a node and its children, and the grants."""
    from aligner.acl import AclLedger, grants_json

    with ledger() as led:
        acls = AclLedger(led)
        rows = acls.show(path or led.layout.root, depth)
        grants, _ = acls.grants()
    if emit({**grants_json(grants), "acls": {p: [{"id": w, "perms": perms} for w, perms in a] for p, a in rows}},
            as_json):
        return
    table = Table("path", "identity", "permissions")
    for p, entries in rows:
        for i, (who, perms) in enumerate(entries or [("-", "-")]):
            table.add_row(p if i == 0 else "", who, perms)
    out.print(table)
    if grants is None:
        out.print("no grants: nodes are created open (`aligner --zk-auth digest:ADMIN:PW acl grant` secures them)")


# ---- errors: one line on stderr, exit 1 (2 for usage) ------------------------------------------

def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _validation_text(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or exc.title
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    cause = first.get("ctx", {}).get("error")
    msg = str(cause) if first["type"] == "value_error" and cause is not None else first["msg"]
    return f"invalid {where} {first.get('input')!r}: {msg}{more}"


def _describe(exc: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an exception, chosen by its type."""
    s = getattr(state, "settings", None)
    zk, kafka_at = (s.zk, s.kafka) if s is not None else ("?", "?")
    if isinstance(exc, click_errors.UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else "aligner"
        return f"usage error: {exc.format_message()} (see `{where} --help`)", exc.exit_code
    if isinstance(exc, click_errors.ClickException):
        return f"error: {exc.format_message()}", exc.exit_code
    if isinstance(exc, AlignerError):
        return f"error: {exc}", 1
    if isinstance(exc, ImportError):  # an adapter without its extra says which one to install
        return f"error: {exc}", 1
    from confluent_kafka import KafkaError, KafkaException
    from kazoo import exceptions as zk_errors
    from kazoo.handlers.threading import KazooTimeoutError

    zk_lost = (zk_errors.ConnectionLoss, zk_errors.ConnectionClosedError, zk_errors.SessionExpiredError,
               zk_errors.OperationTimeoutError)
    if isinstance(exc, KazooTimeoutError):
        return f"error: {_unreachable(stack_mod.ZOOKEEPER, zk, 'no answer in time')}", 1
    if isinstance(exc, zk_lost):
        return f"error: {_unreachable(stack_mod.ZOOKEEPER, zk, f'connection lost ({type(exc).__name__})')}", 1
    if isinstance(exc, (zk_errors.NoAuthError, zk_errors.AuthFailedError)):
        return f"error: ZooKeeper at {zk} refused access ({type(exc).__name__}): check ALIGNER_ZK_AUTH", 1
    if isinstance(exc, zk_errors.NoNodeError):
        return "error: a ZooKeeper node vanished while it was read (removed by `aligner gc` or another command?)", 1
    if isinstance(exc, zk_errors.KazooException):
        return f"error: ZooKeeper at {zk} failed: {type(exc).__name__} {exc}", 1
    if isinstance(exc, KafkaException):
        kerr = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        text = kerr.str() if kerr is not None else str(exc)
        from aligner.connectors.kafka import UNREACHABLE

        if kerr is not None and kerr.code() in UNREACHABLE:
            return f"error: {_unreachable(stack_mod.KAFKA, kafka_at, text)}", 1
        return f"error: Kafka at {kafka_at} failed: {text}", 1
    if isinstance(exc, TimeoutError):
        return f"error: timed out: {exc or f'no answer from ZooKeeper at {zk} or Kafka at {kafka_at}'}", 1
    if isinstance(exc, ValidationError):
        return f"error: {_validation_text(exc)}", 1
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"error: {exc.strerror or exc}{where}", 1
    return f"internal error: {type(exc).__name__}: {exc} (ALIGNER_DEBUG=1 shows the traceback)", 1


def _setup_logging() -> None:
    """Library log lines (kazoo reconnects, ...) stay off stderr unless ALIGNER_LOG_LEVEL asks for them."""
    level = os.environ.get("ALIGNER_LOG_LEVEL", "ERROR").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level if level in logging.getLevelNamesMapping() else "ERROR", handlers=[handler])
    if "ALIGNER_LOG_LEVEL" not in os.environ:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # the command reports ZooKeeper failures itself


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the CLI; every failure becomes one line on stderr and exit 1 (2 for usage errors)."""
    _setup_logging()
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="aligner", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        if exc.format_message().strip():  # typer's rich help has printed itself already
            typer.echo(exc.format_message())
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("aligner: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("ALIGNER_DEBUG"):
            raise
        text, code = _describe(exc)
        print(f"aligner: {_one_line(text)}", file=sys.stderr)
        sys.exit(code)
    sys.exit(code if isinstance(code, int) else 0)
