"""What an idle chain costs: the chaos chain with no input, its CPU per component (issue 23's acceptance).

    python -m experiments.idle --seconds 120

Goal: "An idle chain (no input) costs the embedded broker under 10 % of a core." The chain is the chaos run's
(:meth:`experiments.chaos.run.Run.start_chain`: the outside producer, the marker on ``in``, job A's two runtime
workers, the Spark job a -> b, the Faust job a -> f) on the embedded stack. The producer writes for a few
seconds, so that every job has created what it writes and run once with data, and is stopped: from then on
nothing comes in, and the chain only cuts empty epochs (the marker every 0.5 s). After ``--warmup`` seconds
(JVMs warmed, fetch waits settled) and a check that every subject's frontier still advances, the CPU of the
broker, ZooKeeper and each component is measured over ``--seconds`` from /proc (the soak's probes), with the
frontiers' advance in the window: a dead chain would also cost nothing.

Exit 0 when the run worked (a benchmark: the figure is printed and written, not judged), 1 with one line when
the chain did not come up or stood still, 130 when stopped by a signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from experiments.chaos.run import F_OUT, Interrupted, Run, run_stack
from experiments.common import RESULTS
from experiments.soak.probes import CpuMeter, process_table, tree
from experiments.soak.watch import UPSTREAM, frontiers

console = Console(highlight=False)
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

GOAL_PERCENT = 10.0
"""Issue 23: the embedded broker's share of one core under an idle chain."""
RATE = 50.0
"""Records per second of the producer while it runs: enough for every job to see data, little to drain."""
PRODUCE_SECONDS = 10.0
"""Seconds the producer writes once the whole chain committed an epoch."""
COME_UP_TIMEOUT = 420.0
"""Seconds the chain gets to commit a first epoch on every subject (Spark and Faust start slowly on a busy
machine)."""
ADVANCE_TIMEOUT = 60.0
"""Seconds every subject's frontier gets to move once more before the window (the chain is alive)."""
POLL = 2.0
"""Seconds between frontier polls."""
SLICE = 10.0
"""Seconds per slice of the broker's CPU series within the window (its steadiness, beside a busy machine)."""


class NotRunning(Exception):
    """The chain did not come up, a component exited, or a frontier stood still: no figure to give."""


def loadavg() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (the soak beside shares the 2 cores)."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def subjects_of(run: Run) -> list[str]:
    """The chain's subjects: ``f`` only with the Faust job."""
    return [s for s in UPSTREAM if run.faust or s != F_OUT]


def components(run: Run) -> dict[str, int]:
    """The chain's long-running components now: name -> pid (the producer is gone once stopped)."""
    return {name: p.pid for name, p in run.procs.items() if p.alive() and p.pid is not None and name != "producer"}


CRASH_LOOP = 3
"""Exits with an error after which a component counts as crash-looping (as the chaos drain counts them)."""


def supervise(run: Run) -> Callable[[], None]:
    """The chaos run's restarter (:meth:`Run.restarter`), restarting at once whatever exits unasked (a
    component started while the broker has no leader for a new topic yet can fail its first start): one step
    per call. Raises NotRunning when a component keeps exiting with errors."""
    restarter = run.restarter(lambda: True)

    def step() -> None:
        next(restarter)
        for name, proc in run.procs.items():
            if proc.long_running and sum(1 for rc in proc.exits if rc not in (0, -signal.SIGKILL)) >= CRASH_LOOP:
                tail = proc.stderr_tail(600).strip().splitlines()
                raise NotRunning(f"{name} keeps exiting (codes {proc.exits})"
                                 f"{': ' + tail[-1] if tail else ''} (logs in {proc.logdir})")

    return step


def pause(seconds: float, step: Callable[[], None]) -> None:
    """Sleep ``seconds`` while supervising the components."""
    deadline = time.monotonic() + seconds
    while (now := time.monotonic()) < deadline:
        step()
        time.sleep(min(0.5, deadline - now))


def wait_until(cond: Callable[[], bool], timeout: float, what: str, step: Callable[[], None]) -> float:
    """Poll ``cond`` every POLL s until it holds; seconds it took. NotRunning on a timeout or a crash loop."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise NotRunning(f"{what} not within {timeout:.0f}s")
        pause(POLL, step)
    return round(time.monotonic() - t0, 1)


def restarts(run: Run) -> dict[str, int]:
    """Starts beyond the first, per component."""
    return {name: p.starts - 1 for name, p in run.procs.items() if p.starts > 1}


def cpu_groups(run: Run, table: dict[int, Any]) -> dict[str, list[int]]:
    """Processes by component as the soak samples them (:meth:`experiments.soak.watch.Soak.measure`): the
    broker's and ZooKeeper's trees, each component's tree (Spark's JVM is its child), and this process."""
    assert run.info is not None
    groups = {"broker": tree(table, run.info.kafka_pid), "zookeeper": tree(table, run.zk_pid() or -1),
              "experiment": [os.getpid()]}
    for name, pid in components(run).items():
        groups[name] = tree(table, pid)
    return groups


def measure(run: Run, seconds: float, step: Callable[[], None]) -> dict[str, Any]:
    """CPU % of a core per group over ``seconds``, the broker's per SLICE, and every frontier's advance."""
    subjects = subjects_of(run)
    assert run.led is not None
    led = run.led
    load_before = loadavg()
    total, sliced = CpuMeter(), CpuMeter()
    t0 = slice_t0 = time.monotonic()
    series: list[tuple[float, dict[str, int]]] = [(0.0, frontiers(led, subjects))]
    slices: list[dict[str, Any]] = []
    restarted = restarts(run)
    while (now := time.monotonic()) < t0 + seconds:
        pause(min(POLL, t0 + seconds - now), step)
        series.append((round(time.monotonic() - t0, 1), frontiers(led, subjects)))
        if time.monotonic() - slice_t0 >= SLICE:
            table = process_table()
            cpu, busy = sliced.measure(cpu_groups(run, table), table, time.monotonic() - slice_t0)
            slices.append({"t": round(time.monotonic() - t0, 1), "broker": cpu["broker"],
                           "zookeeper": cpu["zookeeper"], "machine_busy_cores": busy})
            slice_t0 = time.monotonic()
    elapsed = time.monotonic() - t0
    table = process_table()
    cpu, busy = total.measure(cpu_groups(run, table), table, elapsed)
    first, last = series[0][1], series[-1][1]
    advanced = {s: last[s] - first[s] for s in subjects}
    chain = round(sum(v for k, v in cpu.items() if k != "experiment"), 1)
    return {"seconds": round(elapsed, 1), "cpu_percent": cpu, "chain_cpu_percent": chain,
            "machine_busy_cores": busy, "loadavg_before": load_before, "loadavg_after": loadavg(),
            "epochs_advanced": advanced, "epochs_per_s": {s: round(n / elapsed, 2) for s, n in advanced.items()},
            "frontiers_start": first, "frontiers_end": last, "frontier_series": series, "broker_slices": slices,
            "restarts_in_window": {k: v - restarted.get(k, 0) for k, v in restarts(run).items()
                                   if v > restarted.get(k, 0)}}


def stop_producer(run: Run) -> dict[str, Any]:
    """SIGTERM the producer as the chaos drain does (:func:`experiments.chaos.run._drain`) and wait for its
    flush; returns what it sent and had acknowledged."""
    producer = run.procs["producer"]
    producer.signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while producer.alive():
        if time.monotonic() > deadline:
            producer.kill()
            raise NotRunning("the producer did not stop within 60 s of SIGTERM")
        time.sleep(0.2)
    produced = json.loads((run.outdir / "producer.json").read_text())
    return {"sent": produced["sent"], "acked": len(produced["acked"]), "failed": len(produced["failed"])}


def play(run: Run, seconds: float, warmup: float) -> dict[str, Any]:
    """Bring the chain up with input, take the input away, warm up, check it is alive, measure."""
    assert run.led is not None
    led = run.led
    subjects = subjects_of(run)
    run.started = time.time()
    run.start_chain()
    step = supervise(run)
    console.print(f"{run.rel():7.1f}s  chain started: {', '.join(run.procs)}; waiting for every subject's first epoch")
    up = wait_until(lambda: min(frontiers(led, subjects).values()) >= 0, COME_UP_TIMEOUT,
                    "a first committed epoch on every subject", step)
    console.print(f"{run.rel():7.1f}s  every subject committed an epoch ({up:.0f}s); "
                  f"producing {PRODUCE_SECONDS:g}s more")
    pause(PRODUCE_SECONDS, step)
    produced = stop_producer(run)
    at_stop = frontiers(led, subjects)
    console.print(f"{run.rel():7.1f}s  producer stopped (sent {produced['sent']}, acked {produced['acked']}); "
                  f"no input from now; warming up {warmup:g}s")
    pause(warmup, step)
    mark = frontiers(led, subjects)
    still = [s for s in subjects if mark[s] <= at_stop[s]]
    if still:
        raise NotRunning(f"{', '.join(still)} did not advance during the warm-up (frontiers {at_stop} -> {mark})")
    took = wait_until(lambda: all(v > mark[s] for s, v in frontiers(led, subjects).items()), ADVANCE_TIMEOUT,
                      "every subject's frontier advancing after the warm-up", step)
    console.print(f"{run.rel():7.1f}s  alive: every frontier advanced during the warm-up {at_stop} -> {mark} and "
                  f"again within {took:.0f}s; measuring {seconds:g}s")
    before = restarts(run)
    window = measure(run, seconds, step)
    stood = [s for s, n in window["epochs_advanced"].items() if n <= 0]
    window["stood_still"] = stood
    return {"produced": produced, "came_up_s": up, "restarts_before_window": before,
            "frontiers_at_producer_stop": at_stop,
            "frontiers_after_warmup": mark, "window": window}


def execute(run: Run, seconds: float, warmup: float) -> dict[str, Any]:
    """The chaos run's stack around :func:`play`, torn down on every path."""
    shutil.rmtree(run.outdir, ignore_errors=True)  # a former run's ZooKeeper data and logs: start afresh
    with run_stack(run):
        return play(run, seconds, warmup)


def show(report: dict[str, Any]) -> None:
    """The window's figures as a table, and the verdict's one line."""
    w = report["window"]
    table = Table(title=f"idle chain, {w['seconds']:g} s window (faust {'on' if report['faust'] else 'off'})")
    table.add_column("process group")
    table.add_column("CPU % of a core", justify="right")
    for name, pct in sorted(w["cpu_percent"].items(), key=lambda kv: -kv[1]):
        style = "bold" if name == "broker" else ""
        table.add_row(f"[{style}]{name}[/]" if style else name, f"{pct:.1f}")
    table.add_row("[dim]chain (all but this process)[/]", f"[dim]{w['chain_cpu_percent']:.1f}[/]")
    console.print(table)
    adv = ", ".join(f"{s} +{n} ({w['epochs_per_s'][s]:g}/s)" for s, n in w["epochs_advanced"].items())
    console.print(f"frontiers advanced in the window: {adv}")
    slices = [s["broker"] for s in w["broker_slices"]]
    if slices:
        console.print(f"broker per {SLICE:g} s slice: min {min(slices):.1f}, max {max(slices):.1f} %")
    console.print(f"machine: {w['machine_busy_cores']:.2f} busy cores of {os.cpu_count()}, load average "
                  f"{w['loadavg_before'][0]:.2f} -> {w['loadavg_after'][0]:.2f} (1 min)")


@app.command()
def main(
    seconds: Annotated[float, typer.Option(min=1, help="Seconds of the measuring window")] = 120.0,
    warmup: Annotated[float, typer.Option(min=0, help="Seconds without input before the window")] = 60.0,
    out: Annotated[Path, typer.Option(help="The JSON report (the run's logs go beside it)")]
    = RESULTS / "idle" / "idle.json",
    faust: Annotated[bool, typer.Option(help="Run job F on Faust")] = True,
) -> None:
    """Measure an idle chain's CPU per component; exit 1 with one line when the chain did not run."""
    out = out.resolve()  # the stack's zoo.cfg names its data dir under it, and ZooKeeper runs elsewhere
    run = Run(seed=0, faults=[], ops=[], outdir=out.parent / f"{out.stem}-run", rate=RATE, faust=faust,
              say=console.print)
    console.print(f"[bold]idle chain[/]: producer {RATE:g} rec/s for {PRODUCE_SECONDS:g}s, then no input; warm-up "
                  f"{warmup:g}s, window {seconds:g}s, faust {'on' if faust else 'off'}, nice {os.nice(0)}, "
                  f"load average {loadavg()}")
    report: dict[str, Any] = {"seconds": seconds, "warmup": warmup, "faust": faust, "rate": RATE,
                              "produce_seconds": PRODUCE_SECONDS, "interval": run.interval, "nice": os.nice(0),
                              "cpus": os.cpu_count(), "loadavg_at_start": loadavg(), "goal_percent": GOAL_PERCENT}
    failure = None
    try:
        report.update(execute(run, seconds, warmup))
    except (KeyboardInterrupt, Interrupted):
        console.print("[red]interrupted[/]: every process of the run was stopped")
        sys.exit(130)
    except NotRunning as exc:
        failure = str(exc)
    except Exception as exc:  # the stack did not start, a ZooKeeper read failed: reported in one line
        failure = f"{type(exc).__name__}: {exc}"
    report["processes"] = {name: {"starts": p.starts, "exits": p.exits, "returncode": p.returncode()}
                           for name, p in run.procs.items()}
    report["observations"] = [asdict(o) for o in run.observations]
    report["error"] = failure
    out.parent.mkdir(parents=True, exist_ok=True)
    if failure is None and report["window"]["stood_still"]:
        failure = f"{', '.join(report['window']['stood_still'])} stood still during the window"
    if failure is None:
        broker = report["window"]["cpu_percent"]["broker"]
        report["broker_percent"] = broker
        report["verdict_line"] = f"idle chain: broker {broker:.1f} % of a core (goal < {GOAL_PERCENT:g} %)"
    else:
        report["verdict_line"] = f"idle chain did not run: {failure}"
    out.write_text(json.dumps(report, indent=1))
    if "window" in report:
        show(report)
    console.print(f"report {out}, logs {run.outdir / 'logs'}")
    print(report["verdict_line"])
    if failure is not None:
        sys.exit(1)


if __name__ == "__main__":
    app()
