"""The ``aligner`` command line: one CLI for the stack, the ledger, reads and the coordinator."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from aligner.epochs import parse_epoch_span
from aligner.errors import AlignerError
from aligner.ledger import Ledger
from aligner.settings import Settings
from coordinator import stack as stack_mod

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


state = State()


@app.callback()
def main_options(
    zk: Annotated[str | None, typer.Option(help="ZooKeeper connect string [env ALIGNER_ZK]")] = None,
    kafka: Annotated[str | None, typer.Option(help="Kafka bootstrap servers [env ALIGNER_KAFKA]")] = None,
    root: Annotated[str | None, typer.Option(help="ZooKeeper root of aligner state [env ALIGNER_ROOT]")] = None,
) -> None:
    settings = Settings()
    overrides: dict[str, Any] = {k: v for k, v in {"zk": zk, "kafka": kafka, "root": root}.items() if v}
    if "zk" not in overrides and "zk" not in settings.model_fields_set:
        running = stack_mod.read_stack(settings.home)
        if running is not None:
            overrides.setdefault("zk", running.zk)
            overrides.setdefault("kafka", running.kafka)
    state.settings = settings.model_copy(update=overrides)


def emit(data: Any, as_json: bool) -> bool:
    """Print ``data`` as JSON when asked; returns whether it did."""
    if as_json:
        out.print_json(json.dumps(data, default=str))
    return as_json


@contextmanager
def ledger() -> Iterator[Ledger]:
    s = state.settings
    try:
        led = Ledger.connect(s.zk, s.root, timeout=10)
    except Exception as exc:
        raise AlignerError(f"cannot reach ZooKeeper at {s.zk}: {exc} (is the stack up? aligner stack up)") from exc
    try:
        yield led
    finally:
        led.close()


# ---- stack ---------------------------------------------------------------------------------------

@stack_app.command("up")
def stack_up(as_json: JsonFlag = False) -> None:
    """Start ZooKeeper and Tansu on free loopback ports; they keep running after this returns."""
    info = stack_mod.stack_up(state.settings.home)
    if not emit(asdict(info), as_json):
        out.print(f"[green]stack up[/] ZooKeeper {info.zk}  Kafka {info.kafka}")
        out.print("eval \"$(aligner stack env)\" to point other shells at it")


@stack_app.command("down")
def stack_down(as_json: JsonFlag = False) -> None:
    """Stop the embedded stack and remove its data."""
    stopped = stack_mod.stack_down(state.settings.home)
    if not emit({"stopped": stopped}, as_json):
        out.print("stack stopped" if stopped else "no stack was running")


@stack_app.command("env")
def stack_env(as_json: JsonFlag = False) -> None:
    """Print the connection settings of the running embedded stack as shell exports."""
    info = stack_mod.read_stack(state.settings.home)
    if info is None:
        raise AlignerError("no embedded stack is running: aligner stack up")
    if not emit(info.env(), as_json):
        for k, v in info.env().items():
            print(f"export {k}={v}")


# ---- subjects ------------------------------------------------------------------------------------

@subjects_app.command("create")
def subjects_create(
    name: str,
    partitions: Annotated[int, typer.Option(min=1, help="Partition count of the topic")] = 4,
    topic: Annotated[str | None, typer.Option(help="Kafka topic (default: the subject name)")] = None,
    value_format: Annotated[str, typer.Option("--format", help="json or bytes")] = "json",
    as_json: JsonFlag = False,
) -> None:
    """Create the topic and register the subject (idempotent for the same shape)."""
    from connectors.subjects import create_subject

    if value_format not in ("json", "bytes"):
        raise typer.BadParameter("--format must be json or bytes")
    with ledger() as led:
        node = create_subject(led, state.settings.kafka, name, partitions, topic=topic, value_format=value_format)
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
    with ledger() as led:
        rows = [_subject_status(led, n) for n in led.subject_names()]
        jobs = _job_rows(led)
    if emit({"subjects": rows, "jobs": jobs}, as_json):
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


@app.command()
def epochs(
    subject: str,
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
    subject: str,
    epoch: Annotated[int | None, typer.Option(min=0, help="One epoch")] = None,
    epochs_: Annotated[str | None, typer.Option("--epochs", help="Inclusive span A:B")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Exactly the committed records of the given epochs, in partition and offset order."""
    from connectors.reader import EpochReader

    if (epoch is None) == (epochs_ is None):
        raise typer.BadParameter("give exactly one of --epoch N or --epochs A:B")
    try:
        first, last = (epoch, epoch) if epoch is not None else parse_epoch_span(epochs_ or "")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with ledger() as led, EpochReader(led, state.settings.kafka) as reader:
        decode = led.subject(subject).value_format == "json"
        records = [r.as_json(decode) for r in reader.read(subject, first, last)]
    if emit({"subject": subject, "first": first, "last": last, "records": records}, as_json):
        return
    for r in records:
        out.print(f"epoch {r['epoch']} p{r['partition']}@{r['offset']} {r['key'] or ''} {r['value']}")
    err.print(f"{len(records)} records from epochs {first}..{last}")


# ---- markers -------------------------------------------------------------------------------------

@app.command()
def markers(
    subject: str,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between epochs")] = 1.0,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after N epochs")] = None,
    from_end: Annotated[bool, typer.Option(help="Start at the current end instead of the log start")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Cut epochs of a subject written by outside producers, from stable end offsets."""
    from connectors.marker import EpochMarker

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def show(epoch: int, ranges: dict) -> None:
        data = {"epoch": epoch, "ranges": {str(p): [r.start, r.end] for p, r in ranges.items()}}
        if not emit(data, as_json):
            out.print(f"epoch {epoch}: " + " ".join(f"{p}:[{s},{e})" for p, (s, e) in data["ranges"].items()))

    with ledger() as led:
        marker = EpochMarker(led, state.settings.kafka, subject, from_beginning=not from_end).open()
        with suppress(KeyboardInterrupt):
            marker.run(interval, stop, count, show)


# ---- jobs and alignment --------------------------------------------------------------------------

def _job_rows(led: Ledger) -> list[dict[str, Any]]:
    from coordinator.alignment import Coordinator

    coord = Coordinator(led)
    return [coord.status(job) for job in coord.jobs.job_names()]


def _print_jobs(rows: list[dict[str, Any]]) -> None:
    table = Table(title="jobs")
    for col in ("job", "version", "source", "mode", "state", "aligned at (k, J)", "lag epochs", "lag s", "decision"):
        table.add_column(col)
    for j in rows:
        for s in j["sources"]:
            at = f"({s['subject_epoch']}, {s['job_epoch']})" if s["subject_epoch"] is not None else "-"
            table.add_row(j["job"], j["version"], s["subject"], s["mode"], s["state"], at, str(s["lag_epochs"]),
                          f"{s['lag_seconds']:.2f}", j["decision"] or "-")
    out.print(table)


@app.command()
def align(
    job: str,
    subject: Annotated[
        list[str] | None, typer.Option("--subject", help="Input subject(s) to align (default all)")
    ] = None,
    at_epoch: Annotated[int | None, typer.Option(min=0, help="Align from this subject epoch at the earliest")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each phase")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Align a job's sources on their subjects' epochs: CatchUp -> Ready -> Align(k) -> Aligned."""
    from rich.live import Live

    from coordinator.alignment import Coordinator, leadership

    with ledger() as led, leadership(led, timeout=timeout):
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
    job: str,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for every consumer")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Return a job's sources to unaligned mode from any alignment state."""
    from coordinator.alignment import Coordinator, leadership

    with ledger() as led, leadership(led, timeout=timeout):
        decision = Coordinator(led).abort(job, timeout=timeout)
    if not emit({"decision": decision.model_dump()}, as_json):
        out.print(f"[yellow]aborted[/] alignment of {job}: sources unaligned")


@app.command()
def lineage(
    job: Annotated[str | None, typer.Option(help="A job id")] = None,
    subject: Annotated[str | None, typer.Option(help="A subject")] = None,
    epoch: Annotated[int, typer.Option(min=0, help="The job or subject epoch")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Which upstream subject epochs an epoch of a job (or subject) contains, transitively."""
    from coordinator.lineage import flatten, job_epoch_lineage, subject_epoch_lineage

    if (job is None) == (subject is None):
        raise typer.BadParameter("give exactly one of --job or --subject")
    with ledger() as led:
        tree = job_epoch_lineage(led, job, epoch) if job else subject_epoch_lineage(led, subject or "", epoch)
    cut = flatten(tree)
    if not emit({"lineage": tree, "cut": cut}, as_json):
        for s, epochs_ in cut.items():
            out.print(f"{s}: epochs {epochs_}")


@app.command()
def hotswap(
    old: Annotated[str, typer.Option("--old", help="The running job")],
    new: Annotated[str, typer.Option("--new", help="Its new version, started with follows=OLD")],
    subject: Annotated[str, typer.Option("--subject", help="The target subject both write")],
    at_epoch: Annotated[int | None, typer.Option(min=0, help="Swap at this target epoch at the earliest")] = None,
    abort_swap: Annotated[bool, typer.Option("--abort", help="Abort a swap that is not committed yet")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each phase")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Swap OLD for NEW on SUBJECT at a future epoch S, exactly once: OLD writes <= S, NEW writes > S."""
    from coordinator.alignment import leadership
    from coordinator.hotswap import HotSwap

    with ledger() as led, leadership(led, timeout=timeout):
        swapper = HotSwap(led)
        if abort_swap:
            node = swapper.abort(old)
        else:
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
    job: Annotated[list[str] | None, typer.Option("--job", help="Two jobs whose outputs to compare")] = None,
    subject: Annotated[list[str] | None, typer.Option("--subject", help="Or two subjects")] = None,
    epochs_: Annotated[str, typer.Option("--epochs", help="Inclusive span A:B")] = "0:0",
    as_json: JsonFlag = False,
) -> None:
    """Diff two jobs' (or subjects') outputs epoch by epoch as multisets; report the first difference."""
    from coordinator.verify import verify_outputs

    names = list(job or []) + list(subject or [])
    if len(names) != 2 or (job and subject):
        raise typer.BadParameter("give exactly two --job or two --subject")
    try:
        first, last = parse_epoch_span(epochs_)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with ledger() as led:
        report = verify_outputs(led, state.settings.kafka, names, first, last, by_job=bool(job))
    if not emit(report, as_json):
        if report["first_difference"] is None:
            out.print(f"[green]identical[/] {names[0]} and {names[1]} over epochs {first}..{last}")
        else:
            d = report["first_difference"]
            out.print(f"[red]differ[/] first at epoch {d['epoch']}: {d['only_first']} only in {names[0]}, "
                      f"{d['only_second']} only in {names[1]}")
    if report["first_difference"] is not None:
        raise typer.Exit(3)


@app.command()
def gc(
    keep_epochs: Annotated[int, typer.Option(min=1, help="Keep the last N committed epochs per subject")] = 100,
    keep_seconds: Annotated[float | None, typer.Option(min=0, help="Also keep epochs younger than T s")] = None,
    subject: Annotated[list[str] | None, typer.Option("--subject", help="Only these subjects")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report, delete nothing")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove old epoch records and swapped-out jobs' state, keeping what readers and lineage need."""
    from coordinator.gc import collect

    with ledger() as led:
        report = collect(led, keep_epochs, keep_seconds, subject, dry_run)
    if not emit(report, as_json):
        for s, r in report["subjects"].items():
            out.print(f"{s}: first retained epoch {r['first_retained']}, {r['deleted_epochs']} epochs removed")
        for j, r in report["jobs"].items():
            out.print(f"job {j}: {r['deleted_nodes']} nodes removed" + (" (swapped out)" if r["swapped_out"] else ""))


def main() -> None:
    try:
        app()
    except AlignerError as exc:
        err.print(f"[red]error:[/] {exc}")
        sys.exit(1)
    except TimeoutError as exc:
        err.print(f"[red]timeout:[/] {exc}")
        sys.exit(1)
