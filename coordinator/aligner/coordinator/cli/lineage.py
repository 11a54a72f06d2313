"""``aligner lineage`` and ``verify``: what an epoch derives from, and whether two jobs agree."""

from __future__ import annotations

from typing import Annotated

import typer

from aligner.coordinator.cli.common import JsonFlag, check_name, check_names, emit, epoch_span, err, out, usage
from aligner.coordinator.cli.connect import kafka, ledger
from aligner.errors import AlignerError

app = typer.Typer()


@app.command()
def lineage(
    job: Annotated[str | None, typer.Option(callback=check_name, help="A job or Spark sink id")] = None,
    subject: Annotated[str | None, typer.Option(callback=check_name, help="A subject")] = None,
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
def verify(
    job: Annotated[list[str] | None, typer.Option("--job", callback=check_names,
                                                  help="Two jobs whose outputs to compare")] = None,
    subject: Annotated[list[str] | None, typer.Option("--subject", callback=check_names, help="Or two subjects")
                       ] = None,
    epochs_: Annotated[str | None, typer.Option(
        "--epochs", help="Inclusive span A:B (default with two jobs, one shadowing the other: every epoch both "
                         "committed)")] = None,
    ignore_field: Annotated[list[str] | None, typer.Option(
        help="A JSON field of the values that is meant to differ (repeat)")] = None,
    consumed: Annotated[str | None, typer.Option(
        "--consumed", callback=check_name, metavar="SUBJECT",
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
            first, last = epoch_span(epochs_)
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
