"""``aligner status``, ``epochs`` and ``read``: what the ledger holds, and exactly the committed records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from aligner.coordinator.cli.common import JsonFlag, Name, ValueFormat, emit, epoch_span, err, out, usage
from aligner.coordinator.cli.connect import kafka, ledger
from aligner.coordinator.cli.render import epochs_table, jobs_table, queries_table, subjects_table

if TYPE_CHECKING:
    from aligner.ledger import Ledger

app = typer.Typer()


def _subject_status(led: Ledger, name: str) -> dict[str, Any]:
    """The count from the buckets' child counts, the frontier from the newest bucket: no listing of every
    epoch (a day's ledger holds 10^5)."""
    meta = led.subjects.subject(name)
    sinks = {}
    for sink in led.subjects.sinks(name):
        sinks[sink] = [
            {"producer": p.producer, "partitions": list(p.partitions), "incarnation": p.incarnation,
             "committed_epoch": p.committed_epoch}
            for p in led.subjects.producers(name, sink)
        ]
    return {"subject": name, "topic": meta.topic, "partitions": meta.partitions,
            "epochs": led.subjects.epoch_count(name), "last_committed": led.epochs.frontier(name), "sinks": sinks,
            "owners": _owners(led, name)}


def _owners(led: Ledger, name: str) -> list[dict[str, Any]]:
    """Which sink (job version) writes which partitions over which epochs: a hot-swap hands a target's
    partitions from one version to the next."""
    from aligner.handover import ownership
    from aligner.layout import split_writer

    sinks: dict[str, dict[str, Any]] = {}
    for partition, writer, first, last in ownership(led.subjects.writers(name)[0]):
        row = sinks.setdefault(split_writer(writer)[0], {"partitions": set(), "from": [], "to": []})
        row["partitions"].add(partition)
        row["from"].append(first)
        row["to"].append(last)
    rows = [{"sink": sink, "partitions": sorted(r["partitions"]), "from_epoch": min(r["from"]),
             "to_epoch": None if None in r["to"] else max(r["to"])} for sink, r in sinks.items()]
    return sorted(rows, key=lambda r: (r["from_epoch"], r["sink"]))


def _job_rows(led: Ledger) -> list[dict[str, Any]]:
    from aligner.coordinator.alignment import Coordinator

    coord = Coordinator(led)
    return [coord.status(job) for job in coord.jobs.job_names()]


@app.command()
def status(as_json: JsonFlag = False) -> None:
    """Subjects with their epochs, sinks and producers."""
    from aligner.acl import AclLedger
    from aligner.lineage import query_statuses

    with ledger() as led:
        rows = [_subject_status(led, n) for n in led.subjects.subject_names()]
        jobs = _job_rows(led)
        queries = query_statuses(led)
        acls = AclLedger(led).state()
    if emit({"subjects": rows, "jobs": jobs, "spark_queries": queries, "acls": acls}, as_json):
        return
    subjects_table(rows)
    if jobs:
        jobs_table(jobs)
    if queries:
        queries_table(queries)
    out.print(f"ZooKeeper ACLs: {acls['line']}", markup=False)


@app.command()
def epochs(
    subject: Name,
    last: Annotated[int, typer.Option(min=1, help="Show only the last N epochs")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Epochs of a subject: committed or waiting, and their per-partition offset ranges."""
    with ledger() as led:
        rows = []
        for n in led.subjects.epoch_numbers(subject)[-last:]:
            node = led.epochs.epoch_node(subject, n)
            if led.epochs.is_committed(subject, n):
                ce = led.epochs.committed(subject, n)
                ranges = {str(p): [s, e] for p, (s, e) in ce.offsets.items()}
                rows.append({"epoch": n, "committed": True, "writers": list(node.writers), "ranges": ranges})
            else:
                rows.append({"epoch": n, "committed": False, "writers": list(node.writers), "ranges": {}})
    if not emit({"subject": subject, "epochs": rows}, as_json):
        epochs_table(subject, rows)


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
    first, last = (epoch, epoch) if epoch is not None else epoch_span(epochs_ or "")
    with ledger() as led:
        decode = (value_format.value if value_format else led.subjects.subject(subject).value_format) == "json"
        led.epochs.committed_many(subject, first, last)  # a span that is not committed fails before Kafka is asked
        with EpochReader(led, kafka()) as reader:
            records = [r.as_json(decode, subject) for r in reader.read(subject, first, last)]
    if emit({"subject": subject, "first": first, "last": last, "records": records}, as_json):
        return
    for r in records:
        out.print(f"epoch {r['epoch']} p{r['partition']}@{r['offset']} {r['key'] or ''} {r['value']}", markup=False,
                  soft_wrap=True)
    err.print(f"{len(records)} records from epochs {first}..{last}")
