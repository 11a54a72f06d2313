"""The thesis's experiments (chapter 6) on the hotness chain, one command each.

    python -m experiments.suite modes          # (a) Figs 6.7/6.8: at-least-once vs exactly-once vs aligned
    python -m experiments.suite interval       # (b) Fig 6.9: effect of the checkpoint interval
    python -m experiments.suite transition     # (c) Fig 6.11: exactly-once -> aligned in a live run
    python -m experiments.suite repeat         # (d) Fig 6.12: repeated transitions, box plot
    python -m experiments.suite hotswap        # (e) hot-swap under load: exactly-once verdict, output gap
    python -m experiments.suite parallelism    # (f) parallelism 1, 2, 4: is latency stable?
    python -m experiments.suite all

Each writes ``experiments/results/<name>.json`` (settings, per-run summaries, per-epoch series),
``<name>-latency.jsonl`` (every operator's epoch records, thesis 6.1) and ``<name>.png``. Runs use an
embedded stack, or the stack named by ``ALIGNER_ZK``/``ALIGNER_KAFKA`` with ``--external``
(docker-compose). Latencies are of job 2, the last operator of the chain:

- ``avg``/``max``: processing time minus creation time (the thesis's Latency);
- ``checkpoint``: commit time minus the oldest creation time of the epoch (Checkpoint Latency);
- ``visible``: commit time minus the average creation time, what a read-committed reader waits for.
  At-least-once output is readable uncommitted, so its visible latency is its ``avg``.
"""

from __future__ import annotations

import math
import statistics
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from aligner.embedded.stack import StackInfo
from experiments import ForeignCpu, plots
from experiments.analysis import EpochPoint, before_after, epoch_series, points_json, since_start, steady, summary
from experiments.chain import ChainConfig, ChainResult, RunMode, exactly_once, open_stack, run_chain
from experiments.common import RESULTS, write_results
from experiments.workload import Workload

ROOT = "/experiments"
WARMUP = 4.0
MODES: tuple[RunMode, ...] = ("at_least_once", "exactly_once", "aligned")

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
console = Console(width=140)

Rate = Annotated[float, typer.Option(help="comments per second per comment stream")]
External = Annotated[bool, typer.Option(help="use the stack of ALIGNER_ZK / ALIGNER_KAFKA")]
Parallelism = Annotated[int, typer.Option(help="parallel workers per job (and partitions per subject)")]


class Experiment:
    """Runs chains on one stack; writes the results file, the latency log and the plot."""

    def __init__(self, name: str, info: StackInfo, settings: dict[str, Any]) -> None:
        self.name, self.info, self.settings = name, info, settings
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.log = RESULTS / f"{name}-latency.jsonl"
        self.log.unlink(missing_ok=True)
        self.cpu = ForeignCpu(*(p for p in (info.zk_pid, info.kafka_pid) if p))
        self.runs: list[ChainResult] = []
        self._n = 0
        self.session = uuid.uuid4().hex[:6]
        """Names of subjects and jobs are unique per session: an external stack keeps old runs."""

    def run(self, config: ChainConfig, label: str) -> ChainResult:
        self._n += 1
        tag = f"{self.name[:4]}{self._n}-{self.session}"
        console.print(f"[bold]{self.name}[/] run {self._n}: {label} (interval {config.interval}s, "
                      f"parallelism {config.parallelism}, {config.duration:.0f}s)")
        result = run_chain(self.info, ROOT, config, tag, progress=lambda m: console.print(f"  {m}"),
                           latency_file=self.log)
        verdict = "exactly once" if exactly_once(result.check) else f"[red]NOT exactly once[/] {result.check}"
        console.print(f"  {result.check['job2_out']:,} results of {sum(result.sent.values()):,} generated "
                      f"records: {verdict}")
        self.runs.append(result)
        return result

    def write(self, body: dict[str, Any], figure: Any) -> None:
        foreign = self.cpu.cores()
        out = {"experiment": self.name, "settings": self.settings, "foreign_cpu_cores": foreign,
               "exactly_once_all_runs": all(exactly_once(r.check) for r in self.runs),
               "checks": [r.check for r in self.runs], **body}
        path = write_results(self.name, finite(out))
        png = RESULTS / f"{self.name}.png"
        figure.savefig(png, dpi=110, bbox_inches="tight")
        plots.close(figure)
        console.print(f"wrote {path}, {png}, {self.log}")
        if foreign > 0.3:
            console.print(f"[yellow]other processes kept {foreign:.2f} cores busy: numbers are noisy[/]")


def finite(value: Any) -> Any:
    """NaN (a summary of no epochs) as null: the results files stay valid JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def table(title: str, rows: Sequence[tuple[str, dict[str, float]]]) -> None:
    t = Table(title=title)
    for col in ("run", "epochs", "avg ms", "max ms", "checkpoint ms", "visible ms", "stdev(avg) ms"):
        t.add_column(col, justify="right")
    for label, s in rows:
        t.add_row(label, str(s["epochs"]), *(f"{s[k]:.0f}" for k in (
            "median_avg_ms", "median_max_ms", "median_checkpoint_ms", "median_visible_avg_ms", "stdev_avg_ms")))
    console.print(t)


def numbers(text: str, kind: type[int] | type[float], option: str) -> list[Any]:
    """A comma-separated list of positive numbers, or a usage error naming the option."""
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of numbers", param_hint=option) from None
    if not values or any(v <= 0 for v in values):
        raise typer.BadParameter(f"{text!r}: every value must be positive", param_hint=option)
    return values


def chain(mode: RunMode, interval: float, parallelism: int, duration: float, rate: float, **kw: Any) -> ChainConfig:
    return ChainConfig(mode=mode, interval=interval, parallelism=parallelism, duration=duration,
                       align_at=kw.pop("align_at", WARMUP), workload=Workload(comment_rate=rate), **kw)


def visible(mode: str, s: dict[str, float]) -> float:
    """What a reader of the final output waits for on average, per mode."""
    return s["median_avg_ms"] if mode == "at_least_once" else s["median_visible_avg_ms"]


# ---- (a) processing modes ------------------------------------------------------------------------


@app.command()
def modes(interval: float = 1.0, parallelism: Parallelism = 1, duration: float = 40.0, rate: Rate = 300.0,
          external: External = False) -> None:
    """(a) Latency by processing mode (thesis Figs 6.7, 6.8)."""
    with open_stack(external) as info:
        ex = Experiment("modes", info, locals() | {"info": None})
        series: dict[RunMode, list[EpochPoint]] = {}
        summaries: dict[RunMode, dict[str, float]] = {}
        for mode in MODES:
            run = ex.run(chain(mode, interval, parallelism, duration, rate), mode)
            pts = steady(run, WARMUP)
            series[mode], summaries[mode] = pts, summary(pts)
        table(f"job 2 latency per epoch by mode, interval {interval}s", list(summaries.items()))
        ex.write({"summary": summaries, "visible_ms": {m: visible(m, s) for m, s in summaries.items()},
                  "series": {m: points_json(p) for m, p in series.items()}},
                 plots.modes(series, interval))


# ---- (b) checkpoint interval ---------------------------------------------------------------------


@app.command()
def interval(intervals: str = "0.25,0.5,1,2", parallelism: Parallelism = 1, rate: Rate = 300.0,
             external: External = False) -> None:
    """(b) Effect of the checkpoint interval (thesis Fig 6.9)."""
    values = numbers(intervals, float, "--intervals")
    with open_stack(external) as info:
        ex = Experiment("interval", info, locals() | {"info": None})
        results: dict[str, dict[float, dict[str, float]]] = {m: {} for m in MODES}
        for iv in values:
            for mode in MODES:
                duration = WARMUP + 6 + 12 * iv
                run = ex.run(chain(mode, iv, parallelism, duration, rate), f"{mode} at {iv}s")
                results[mode][iv] = summary(steady(run, WARMUP))
        rows = [(f"{m} {iv}s", s) for m, by in results.items() for iv, s in by.items()]
        table("job 2 latency by checkpoint interval", rows)
        ex.write({"summary": {m: {str(iv): s for iv, s in by.items()} for m, by in results.items()},
                  "visible_ms": {m: {str(iv): visible(m, s) for iv, s in by.items()} for m, by in results.items()}},
                 plots.interval(results))


# ---- (c) live transition -------------------------------------------------------------------------


def transition_summary(run: ChainResult) -> dict[str, Any]:
    before, after = before_after(run, WARMUP)
    sb, sa = summary(before), summary(after)
    iv_ms = 1000 * run.config.interval
    return {"before": sb, "after": sa,
            "increase_avg_ms": sa["median_avg_ms"] - sb["median_avg_ms"],
            "increase_visible_ms": sa["median_visible_avg_ms"] - sb["median_visible_avg_ms"],
            "increase_visible_intervals": (sa["median_visible_avg_ms"] - sb["median_visible_avg_ms"]) / iv_ms,
            "max_minus_avg_before_ms": sb["median_max_ms"] - sb["median_avg_ms"],
            "max_minus_avg_after_ms": sa["median_max_ms"] - sa["median_avg_ms"],
            "alignment_seconds": since_start(run, "align job2 decided") - since_start(run, "align job1 requested")}


@app.command()
def transition(interval: float = 1.0, parallelism: str = "1,2", duration: float = 50.0, rate: Rate = 300.0,
               external: External = False) -> None:
    """(c) The transition exactly-once -> aligned in a live run (thesis Fig 6.11)."""
    ps = numbers(parallelism, int, "--parallelism")
    with open_stack(external) as info:
        ex = Experiment("transition", info, locals() | {"info": None})
        runs, out = {}, {}
        for p in ps:
            run = ex.run(chain("aligned", interval, p, duration, rate, align_at=duration / 2), f"parallelism {p}")
            runs[p], out[p] = run, transition_summary(run)
            table(f"parallelism {p}: before / after alignment", [("exactly-once", out[p]["before"]),
                                                                 ("aligned", out[p]["after"])])
        ex.write({"summary": {str(p): s for p, s in out.items()},
                  "series": {str(p): points_json(epoch_series(r)) for p, r in runs.items()},
                  "events": {str(p): {k: v - r.started for k, v in r.events.items()} for p, r in runs.items()}},
                 plots.transition(runs))


# ---- (d) repeated transitions --------------------------------------------------------------------


@app.command()
def repeat(runs: Annotated[int, typer.Option(min=1, help="transitions per interval")] = 5, intervals: str = "1,2",
           parallelism: Parallelism = 1, rate: Rate = 300.0, external: External = False) -> None:
    """(d) Repeated runs of the aligned transition: box plot (thesis Fig 6.12; 80 runs there)."""
    values = numbers(intervals, float, "--intervals")
    with open_stack(external) as info:
        ex = Experiment("repeat", info, locals() | {"info": None})
        out: dict[float, list[dict[str, Any]]] = {iv: [] for iv in values}
        for i in range(runs):
            for iv in values:
                duration = WARMUP + 2 * (4 + 8 * iv)
                run = ex.run(chain("aligned", iv, parallelism, duration, rate, align_at=duration / 2),
                             f"{i + 1}/{runs} at {iv}s")
                out[iv].append(transition_summary(run))
        t = Table(title="increase of visible latency after alignment, in checkpoint intervals")
        t.add_column("interval")
        t.add_column("per run", justify="left")
        t.add_column("median", justify="right")
        t.add_column("max", justify="right")
        for iv, ss in out.items():
            inc = [s["increase_visible_intervals"] for s in ss]
            t.add_row(f"{iv}s", ", ".join(f"{v:+.2f}" for v in inc), f"{statistics.median(inc):+.2f}",
                      f"{max(inc):+.2f}")
        console.print(t)
        ex.write({"summary": {str(iv): ss for iv, ss in out.items()},
                  "increase_intervals": {str(iv): [s["increase_visible_intervals"] for s in ss]
                                         for iv, ss in out.items()}},
                 plots.repeat(out))


# ---- (e) hot-swap under load ---------------------------------------------------------------------


@app.command()
def hotswap(interval: float = 1.0, parallelism: Parallelism = 1, duration: float = 40.0, rate: Rate = 300.0,
            external: External = False) -> None:
    """(e) Hot-swap job 1 v1 -> v2 under load: exactly-once verdict, output gap, latency around it."""
    with open_stack(external) as info:
        ex = Experiment("hotswap", info, locals() | {"info": None})
        run = ex.run(chain("aligned", interval, parallelism, duration, rate, swap_at=duration / 2), "v1 -> v2")
        commits = run.job_epochs["hot-issues"]
        s = run.swap_epoch
        assert s is not None
        times = {c["epoch"]: c["committed_at"] - run.started for c in commits}
        gaps = [times[e] - times[e - 1] for e in sorted(times) if e - 1 in times]
        typical = statistics.median(gaps) if gaps else float("nan")
        gap = times[s + 1] - times[s] if s + 1 in times and s in times else float("nan")
        pts = epoch_series(run)
        swap_t = since_start(run, "swap decided")
        near = [p for p in pts if abs(p.t - swap_t) <= 3 * interval]
        far = [p for p in pts if p.t > since_start(run, "align job2 decided") + 2 * interval
               and abs(p.t - swap_t) > 3 * interval and p.t <= duration]
        near_s, far_s = summary(near), summary(far)
        body = {"swap_epoch": s, "exactly_once": exactly_once(run.check), "check": run.check,
                "hot_issues_gap_s": gap, "hot_issues_typical_gap_s": typical,
                "max_gap_s": max(gaps, default=float("nan")),
                "swap_decision_seconds": since_start(run, "swap decided") - since_start(run, "swap requested"),
                "latency_near_swap": near_s, "latency_elsewhere": far_s,
                "series": points_json(pts), "hot_issues_commits": commits,
                "events": {k: v - run.started for k, v in run.events.items()}}
        console.print(f"swap at hot-issues epoch {s}: S -> S+1 commits {gap:.2f}s apart (typical {typical:.2f}s); "
                      f"exactly once: {body['exactly_once']}")
        table("job 2 latency around the swap (+-3 intervals) and elsewhere (aligned)",
              [("near swap", near_s), ("elsewhere", far_s)])
        ex.write(body, plots.hotswap(run, pts, times, s))


# ---- (f) parallelism -----------------------------------------------------------------------------


@app.command()
def parallelism(values: str = "1,2,4", interval: float = 1.0, duration: float = 35.0, rate: Rate = 300.0,
                external: External = False) -> None:
    """(f) Parallelism 1, 2, 4 in exactly-once and aligned mode: does latency become unstable?"""
    ps = numbers(values, int, "--values")
    with open_stack(external) as info:
        ex = Experiment("parallelism", info, locals() | {"info": None})
        series: dict[RunMode, dict[int, Any]] = {"exactly_once": {}, "aligned": {}}
        for p in ps:
            for mode in series:
                run = ex.run(chain(mode, interval, p, duration, rate), f"{mode}, parallelism {p}")
                series[mode][p] = steady(run, WARMUP)
        summaries = {m: {p: summary(pts) for p, pts in by.items()} for m, by in series.items()}
        table("job 2 latency by parallelism", [(f"{m} P={p}", s) for m, by in summaries.items() for p, s in by.items()])
        ex.write({"summary": {m: {str(p): s for p, s in by.items()} for m, by in summaries.items()},
                  "series": {m: {str(p): points_json(pts) for p, pts in by.items()} for m, by in series.items()}},
                 plots.parallelism(series))


@app.command("all")
def run_all(external: External = False) -> None:
    """Every experiment with its defaults (about 25 minutes on 2 cores)."""
    modes(external=external)
    interval(external=external)
    transition(external=external)
    repeat(external=external)
    hotswap(external=external)
    parallelism(external=external)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
