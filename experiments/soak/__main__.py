"""``python -m experiments.soak``: the chaos chain for ``--minutes`` (``SOAK_MINUTES``), sampled, with a verdict.

Exit 0 when it passed, 1 with one line saying why it failed (stall, anomaly, growth), 130 when stopped by a
signal (the first SIGTERM or SIGINT stops it and everything it started within 10 s).
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from experiments.chaos import nemesis
from experiments.chaos.nemesis import Fault
from experiments.chaos.run import F_OUT, Interrupted, Run, execute, job_a_name
from experiments.common import RESULTS
from experiments.soak.plot import plot
from experiments.soak.verdict import figures, floored, retention_window, verdict
from experiments.soak.watch import Settings, Soak, Stalled

console = Console(highlight=False)
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def soak_ops(seed: int, duration: float, swap_every: float, faust: bool) -> list[Fault]:
    """The coordinator's lane: align A early, hot-swap job A every ``swap_every`` s (A -> A2 -> A3 ...; the
    hook for parallelism changes is :meth:`Run.start_generation`), align F early and abort/re-align it once
    per swap period at random. No swap in the last minute: the drain's own swap covers a run without any."""
    rng = random.Random(f"{seed}/soak-ops")
    ops = [Fault(15.0, "align", "A")]
    swaps = [k * swap_every for k in range(1, int(duration // swap_every) + 1) if k * swap_every <= duration - 60]
    ops += [Fault(round(at, 1), "hotswap", f"{job_a_name(k + 1)} -> {job_a_name(k + 2)}") for k, at in enumerate(swaps)]
    if faust:
        ops.append(Fault(25.0, "align", "F"))
        for start in [0.0, *swaps]:
            end = min(start + swap_every, duration - 30)
            if end - start > 60:
                at = rng.uniform(start + 30, end - 30)
                ops += [Fault(round(at, 1), "abort", "F"), Fault(round(at + rng.uniform(5, 20), 1), "align", "F")]
    return sorted(ops, key=lambda f: f.at)


def plan_run(seed: int, minutes: float, fault_every: float, swap_every: float, faust: bool, outdir: Path) -> Run:
    """The chaos run of a soak: the nemesis's faults over the whole duration and the soak's operations; room
    for a version of job A per hot-swap, and one more for the drain's swap when none was planned."""
    duration = minutes * 60
    plan, _ = nemesis.schedule(seed, max(1, int(duration // fault_every)), duration, faust=faust)
    plan = [f for f in plan if f.at + f.duration < duration - 5]
    ops = soak_ops(seed, duration, swap_every, faust)
    generations = 2 + sum(1 for op in ops if op.kind == "hotswap")
    return Run(seed, plan, ops, outdir, faust=faust, say=console.print, generations=generations,
               lasts_at_least=duration)


def report_of(run: Run, soak: Soak, result: dict[str, Any] | None, minutes: float, window: float,
              check_growth: bool) -> dict[str, Any]:
    """Everything the soak measured, its figures and its verdict (one dict, written as JSON)."""
    done = [e for e in run.events if e["kind"] in nemesis.FAULT_WEIGHTS and "(none" not in e["target"]]
    fig, reasons = judge(soak.samples, soak.gcs, soak.stalls, result, len(run.observations), soak.settings,
                         run.faust, window, check_growth)
    check = (result or {}).get("check")
    swaps = [e["at"] + e["duration"] for e in run.events
             if e["kind"] == "op" and e["target"].startswith("hotswap") and e.get("ok")]
    return {
        "seed": run.seed, "minutes": minutes, "settings": asdict(soak.settings), "interval": run.interval,
        "rate": run.rate, "linger_ms": run.linger_ms, "inherit_state": run.inherit_state, "faust": run.faust,
        "check_growth": check_growth,
        "started": run.started,
        "faults_total": len(done), "faults_by_kind": dict(Counter(e["kind"] for e in done)),
        "swaps": swaps, "generation": run.generation, "samples": soak.samples, "frontiers": soak.frontiers,
        "stalls": soak.stalls, "gc": soak.gcs, "figures": fig,
        "check": None if check is None else {k: v for k, v in check.items() if k != "series"},
        "error": (result or {}).get("error"), "observations": [asdict(o) for o in run.observations],
        "events": run.events, "verdict": reasons, "passed": not reasons,
        "verdict_line": "; ".join(reasons) if reasons else "passed",
    }


def judge(samples: list[dict[str, Any]], gcs: list[dict[str, Any]], stalls: list[Any], result: dict[str, Any] | None,
          observations: int, settings: Settings, faust: bool, window: float,
          check_growth: bool) -> tuple[dict[str, Any], list[str]]:
    """The figures and the verdict's reasons (none: passed) from what the soak measured."""
    retained = settings.retention_every or settings.gc_every
    subjects = [x for x in settings.gc_subjects if faust or x != F_OUT] if retained else []
    start = retention_window(window, gcs, subjects)
    fig = figures(samples, window, start, never_held=sorted(set(subjects) - floored(gcs)) if start is None else None)
    return fig, verdict(stalls, result, observations, fig, check_growth, gcs)


def rejudge(path: Path) -> dict[str, Any]:
    """A written ``soak.json`` judged again by this verdict (a soak outlives the code it started with)."""
    report = json.loads(path.read_text())
    result = None if report["error"] is None and report["check"] is None else {
        "check": report["check"], "error": report["error"]}
    fig, reasons = judge(report["samples"], report["gc"], report["stalls"], result, len(report["observations"]),
                         Settings(**report["settings"]), report["faust"], report["figures"]["window_s"],
                         report["check_growth"])
    report.update(figures=fig, verdict=reasons, passed=not reasons,
                  verdict_line="; ".join(reasons) if reasons else "passed")
    path.write_text(json.dumps(report, indent=1))
    return report


def play(run: Run, soak: Soak, drain_timeout: float) -> dict[str, Any] | None:
    """The run's result; None when the soak stopped at a stall."""
    try:
        return execute(run, drain_timeout=drain_timeout)
    except Stalled:
        return None
    except (KeyboardInterrupt, Interrupted):
        raise
    except Exception as exc:  # a broken run is reported (with what its components said), not hidden
        console.print(f"[red]the run broke: {type(exc).__name__}: {exc}[/]")
        return {"error": f"{type(exc).__name__}: {exc}", "check": None}


@app.command()
def main(
    minutes: Annotated[float, typer.Option(envvar="SOAK_MINUTES", min=0.5, help="Length of the soak")] = 120.0,
    seed: Annotated[int, typer.Option(help="Seed of the faults and operations")] = 2026,
    fault_every: Annotated[float, typer.Option(min=1, help="Seconds between faults, on average")] = 30.0,
    swap_every: Annotated[float, typer.Option(min=30, help="Seconds between hot-swaps of job A")] = 600.0,
    sample: Annotated[float, typer.Option(min=1, help="Seconds between samples")] = 60.0,
    poll: Annotated[float, typer.Option(min=0.5, help="Seconds between frontier polls")] = 5.0,
    stall_after: Annotated[float, typer.Option(min=1, help="Fault-free seconds a frontier may stand still")] = 120.0,
    stop_on_stall: Annotated[bool, typer.Option(help="End the soak at the first stall")] = True,
    gc_every: Annotated[float | None, typer.Option(min=1, help="Seconds between `aligner gc` runs (retention)")]
    = None,
    retention_every: Annotated[float | None, typer.Option(min=1, help="Seconds between passes of the coordinator's "
                                                          "retention loop (`aligner retention run`, every subject "
                                                          "but changelogs), a process of the run")] = None,
    keep_epochs: Annotated[int, typer.Option(min=1, help="gc: keep the last N epochs per subject")] = 100,
    keep_seconds: Annotated[float | None, typer.Option(min=0, help="gc: also keep epochs younger than T s")] = None,
    gc_subject: Annotated[list[str] | None, typer.Option(help="gc only these subjects (default: in, a, b, f; a job's "
                                                              "state changelog must keep its epochs for restores)")]
    = None,
    window: Annotated[float, typer.Option(min=0, help="Seconds of the first retention window (growth after it)")]
    = 600.0,
    check_growth: Annotated[bool, typer.Option(help="Fail on growth after the window (off: retention is off)")]
    = True,
    inherit_state: Annotated[bool, typer.Option(help="New versions of A take the old one's state (rebuilding it "
                                                     "from the input fails once gc collected its start)")] = True,
    interval: Annotated[float, typer.Option(min=0.01, help="Seconds per epoch of the marker and the jobs")] = 0.5,
    rate: Annotated[float, typer.Option(min=1, help="Input records per second")] = 150.0,
    linger_ms: Annotated[float, typer.Option(
        min=0, help="The input producer's linger.ms: 200 gathers ~5 batches a second per partition, as a producer "
                    "feeding the embedded broker for hours should (Tansu's memory storage has no offset index: "
                    "its fetches slow with the batches a partition holds; at librdkafka's 5 ms default, ~25 a "
                    "second, a 2-hour soak stalled at minutes 43-63)")] = 200.0,
    faust: Annotated[bool, typer.Option(help="Run job F on Faust")] = True,
    drain_timeout: Annotated[float, typer.Option(min=10, help="Seconds the final drain may take")] = 900.0,
    out: Annotated[Path, typer.Option(help="Directory of soak.json, soak.png and the run's logs")] = RESULTS / "soak",
    judge_only: Annotated[Path | None, typer.Option(
        "--judge", exists=True, dir_okay=False,
        help="Run no soak: judge this soak.json again with this verdict, redraw its curves")] = None,
) -> None:
    """Soak the chaos chain; exit 1 with one line on a stall, an anomaly or growth after the window."""
    if judge_only is not None:
        conclude(rejudge(judge_only), judge_only.parent)
        return
    out = out.resolve()  # the stack's zoo.cfg names its data dir under it, and ZooKeeper runs elsewhere
    run = plan_run(seed, minutes, fault_every, swap_every, faust, out / "run")
    run.rate, run.interval, run.inherit_state, run.linger_ms = rate, interval, inherit_state, linger_ms
    console.print(f"[bold]soak, seed {seed}[/]: {minutes:g} min, {len(run.faults)} faults, "
                  f"{run.generations - 2} hot-swaps planned, samples every {sample:g}s, "
                  f"gc {f'every {gc_every:g}s' if gc_every else 'off'}, "
                  f"retention loop {f'every {retention_every:g}s' if retention_every else 'off'}")
    if check_growth and (gc_every or retention_every):
        console.print(reach_line(minutes, keep_epochs, keep_seconds))
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if autogroup.exists() and autogroup.read_text().strip() == "1":
        console.print("[yellow]leave the machine to the soak: this kernel schedules by autogroup, so `nice` does not "
                      "hold back what runs beside it (a test's stacks and Spark start sessions of their own at full "
                      "weight); `sysctl kernel.sched_autogroup_enabled=0` makes nice work[/]")
    settings = Settings(sample, poll, stall_after, stop_on_stall, gc_every, keep_epochs, keep_seconds,
                        retention_every=retention_every)
    soak = Soak(settings if not gc_subject else replace(settings, gc_subjects=gc_subject))
    run.watchers = soak.loops(run)
    reporter = Reporter(run, soak, out, minutes, window, check_growth)
    soak.on_sample = reporter.running
    try:
        result = play(run, soak, drain_timeout)
    except (KeyboardInterrupt, Interrupted):
        reporter.write({"error": "interrupted", "check": None})
        console.print(f"[red]interrupted[/]: every process of the soak was stopped; partial report {out / 'soak.json'}")
        sys.exit(130)
    conclude(reporter.write(result), out)


def reach_line(minutes: float, keep_epochs: int, keep_seconds: float | None) -> str:
    """What a subject must do for its growth to be judged: retention raises its floor only past what it keeps,
    and a subject it never floored makes the verdict "growth not measured" (said at the start, not after)."""
    seconds = minutes * 60 - (keep_seconds or 0)
    kept = f"{keep_epochs:,} epoch{'s' if keep_epochs != 1 else ''}"
    kept += f" and {keep_seconds:g} s" if keep_seconds else ""
    if seconds <= 0:
        return (f"[yellow]growth cannot be judged: retention keeps {kept}, longer than the {minutes:g} min asked[/]")
    return (f"growth is judged once retention has raised every subject's floor: retention keeps {kept}, so each "
            f"subject must commit an epoch every {seconds / keep_epochs:.2f} s or faster (a Spark job's epochs "
            f"are its micro-batches)")


@dataclass
class Reporter:
    """Writes ``soak.json``: after each sample (a soak killed outright still leaves its curves) and at the end."""

    run: Run
    soak: Soak
    out: Path
    minutes: float
    window: float
    check_growth: bool

    def write(self, result: dict[str, Any] | None) -> dict[str, Any]:
        report = report_of(self.run, self.soak, result, self.minutes, self.window, self.check_growth)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "soak.json").write_text(json.dumps(report, indent=1))
        return report

    def running(self) -> None:
        self.write({"error": "running", "check": None})


def conclude(report: dict[str, Any], out: Path) -> None:
    """Draw the curves, print their numbers and the verdict's one line; exit 1 when the soak failed."""
    png = plot(report, out / "soak.png")
    summarize(report)
    console.print(f"report {out / 'soak.json'}, curves {png}, logs {out / 'run' / 'logs'}")
    if not report["passed"]:
        print(f"soak failed: {report['verdict_line']}")
        sys.exit(1)
    print(f"soak passed: {report['minutes']:g} min, {report['faults_total']} faults, {len(report['swaps'])} "
          f"hot-swaps, {report['check']['records_checked']:,} records checked, 0 anomalies, no stall")


def summarize(report: dict[str, Any]) -> None:
    """The curves' numbers on the console (the JSON has them all)."""
    fig = report["figures"]
    per_min = fig["slope_per_min"]
    after = fig["slope_per_min_after_window"]

    def num(v: float | None, scale: float = 1.0, fmt: str = ",.0f") -> str:
        return "-" if v is None else format(v / scale, fmt)

    console.print(f"znodes/min {num(per_min['znodes'])} (after the window {num(after['znodes'])}), "
                  f"ZooKeeper data size KB/min {num(per_min['zk_data_bytes'], 1024)} "
                  f"(after {num(after['zk_data_bytes'], 1024)}), data dir KB/min {num(per_min['zk_dir_bytes'], 1024)}")
    console.print(f"RSS MB per 10 min after the window: {fig['rss_mb_per_10min_after_window']}")
    console.print(f"CPU % mean: {fig['cpu_percent_mean']}; max: {fig['cpu_percent_max']}")
    held = (f"from {fig['growth_from_s']:.0f}s (retention held every subject)" if fig.get("growth_from_s") is not None
            else f"not judged (retention never floored {', '.join(fig.get('retention_never_held') or [])})")
    console.print(f"aligner status: {fig['status_s']}; stalls: {len(report['stalls'])}; growth {held}: "
                  f"{ {k: None if g is None else round(g['change'], 3) for k, g in fig['growth'].items()} }")


if __name__ == "__main__":
    app()
