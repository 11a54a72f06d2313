"""``python -m experiments.chaos``: chaos runs of the chain, each with a JSON report and a PNG timeline."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from aligner.embedded.processes import DEBIAN_ZK_JAR, ZK_JAR_ENV
from experiments.chaos import nemesis, timeline
from experiments.chaos.run import Interrupted, Run, execute
from experiments.common import RESULTS

console = Console(highlight=False)
NEXT_ZK_JAR = Path(__file__).resolve().parents[2] / ".zk" / "usr" / "share" / "java" / "zookeeper.jar"
"""The current ZooKeeper ``make zookeeper-next`` unpacks: the runs use it when it is there, since Debian 12's
3.8.0 can forget acknowledged writes (docs: Operations, ZooKeeper), which is the server's fault to test, not the
product's."""
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def one_run(seed: int, faults: int, duration: float, out: Path, rate: float, faust: bool = True,
            zk_servers: int = 1, spark_workers: int = 0, rocksdb: bool = False,
            damage_zk: bool = False, rescale: bool = True, netns: bool = False) -> dict[str, Any]:
    """One run: print the schedule, play it, check, and write the JSON report and the PNG timeline."""
    plan, ops = nemesis.schedule(seed, faults, duration, faust=faust, cluster=spark_workers > 0, rocksdb=rocksdb,
                                 ensemble=zk_servers > 1 and damage_zk, netns=netns, quorum=zk_servers > 1)
    console.print(f"[bold]chaos run, seed {seed}[/]: {len(plan)} faults, {len(ops)} coordinator operations")
    for f in sorted(plan + ops, key=lambda f: f.at):
        console.print("  " + f.describe())
    outdir = out / f"seed-{seed}"
    run = Run(seed, plan, ops, outdir, rate=rate, faust=faust, say=console.print, zk_servers=zk_servers,
              spark_workers=spark_workers, rocksdb=rocksdb, rescale=rescale, netns=netns)
    try:
        result = execute(run, drain_timeout=600)
    except (KeyboardInterrupt, Interrupted):
        raise
    except Exception as exc:  # a broken run is reported (with what its components said), not hidden
        console.print(f"[red]seed {seed}: the run broke: {type(exc).__name__}: {exc}[/]")
        result = {"error": f"{type(exc).__name__}: {exc}", "check": None}
    done = [e for e in run.events if e["kind"] in nemesis.FAULT_WEIGHTS and "(none" not in e["target"]]
    report = {
        "seed": seed, "faust": faust, "zk_servers": zk_servers, "spark_workers": spark_workers, "rocksdb": rocksdb,
        "damage_zk": damage_zk, "rescale": rescale, "netns": netns,
        "faults_requested": faults, "duration": duration,
        "rate": rate, "zookeeper": Path(os.environ.get(ZK_JAR_ENV) or DEBIAN_ZK_JAR).resolve().name,
        "started": run.started, "schedule": nemesis.as_json(plan), "operations": nemesis.as_json(ops),
        "faults_total": len(done), "faults_by_kind": dict(Counter(e["kind"] for e in done)),
        "events": run.events, "observations": [asdict(o) for o in run.observations],
        "processes": {name: {"starts": p.starts, "kills": p.kills, "exits": p.exits} for name, p in run.procs.items()},
        "swap_committed": run.swap_committed, **result,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"seed-{seed}.json").write_text(json.dumps(report, indent=2))
    if result["check"] is None:
        return report
    png = timeline.plot(report, out / f"seed-{seed}.png")
    totals = result["check"]["anomalies"]["totals"]
    style = "green" if not sum(totals.values()) and not run.observations else "red"
    console.print(f"[bold {style}]seed {seed}: {len(done)} faults {dict(Counter(e['kind'] for e in done))}, "
                  f"{result['check']['records_checked']:,} records checked, anomalies {totals}, "
                  f"{len(run.observations)} components exited unasked[/]")
    for cls, examples in result["check"]["anomalies"]["examples"].items():
        for ex in examples:
            console.print(f"  [red]{cls}[/] {ex}")
    console.print(f"report {out / f'seed-{seed}.json'}, timeline {png}, logs {outdir / 'logs'}")
    return report


@app.command()
def main(
    seed: Annotated[int, typer.Option(help="Seed of the first run (run i uses seed + i)")] = 1,
    runs: Annotated[int, typer.Option(min=1, help="Number of runs")] = 1,
    faults: Annotated[int, typer.Option(min=1, help="Faults per run")] = 50,
    duration: Annotated[float, typer.Option(min=10, help="Seconds of nemesis per run (longer if the faults need it)")]
    = 150.0,
    rate: Annotated[float, typer.Option(min=1, help="Input records per second")] = 150.0,
    faust: Annotated[bool, typer.Option(help="Run job F on Faust (and its kills)")] = True,
    out: Annotated[Path, typer.Option(help="Directory of reports, timelines and logs")] = RESULTS / "chaos",
    zk_servers: Annotated[int, typer.Option(
        min=1, help="ZooKeeper servers: 3 or 5 run an ensemble on loopback, whose leader the ZooKeeper faults hit")]
    = 1,
    spark_workers: Annotated[int, typer.Option(
        min=0, help="Run the Spark job on a standalone cluster of this many workers (and kill its executors)")]
    = 0,
    rocksdb: Annotated[bool, typer.Option(
        help="Job A keeps its state in RocksDB, and the nemesis damages it (damage-state)")] = False,
    damage_zk: Annotated[bool, typer.Option(
        help="On an ensemble, also damage a stopped follower's disk (damage-zk), then rebuild it from the quorum "
             "as an operator does for any damaged member (ZooKeeper 3.8.0 served an old tree from a garbage "
             "snapshot once; docs: Reliability)")] = False,
    rescale: Annotated[bool, typer.Option(
        help="Each hot-swap of job A changes its parallelism (2 -> 1 -> 2 -> 4 ...), the new version taking a's "
             "partitions over")] = True,
    netns: Annotated[bool, typer.Option(
        help="Every component in a network namespace of its own (root; ip, nft, tc), and the nemesis also cuts "
             "the network (one component from ZooKeeper, Kafka or both; the ensemble split or bridged; the Spark "
             "driver from an executor), slows a link and skews a component's clock")] = False,
    zookeeper_jar: Annotated[Path | None, typer.Option(
        help="ZooKeeper server jar of the stack (default: the one `make zookeeper-next` unpacks into .zk/ when it "
             "is there, else Debian's)")] = None,
) -> None:
    """Run the chain under a seeded nemesis and check every subject; exit 1 on any anomaly."""
    jar = zookeeper_jar or (NEXT_ZK_JAR if NEXT_ZK_JAR.exists() else None)
    if jar is not None:
        if not jar.exists():
            raise typer.BadParameter(f"{jar} does not exist", param_hint="--zookeeper-jar")
        os.environ[ZK_JAR_ENV] = str(jar.resolve())
    console.print(f"ZooKeeper: {Path(os.environ.get(ZK_JAR_ENV) or DEBIAN_ZK_JAR).resolve().name}")
    reports = []
    try:
        for i in range(runs):
            reports.append(one_run(seed + i, faults, duration, out, rate, faust, zk_servers,
                                   spark_workers, rocksdb, damage_zk, rescale, netns))
    except (KeyboardInterrupt, Interrupted):
        console.print("[red]interrupted[/]: every process of the run was stopped")
        sys.exit(130)
    summary = summarize(reports)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(table(reports))
    console.print(table(reports))
    console.print(f"summary: {out / 'summary.json'}, {out / 'summary.md'}")
    bad = sum(summary["anomalies"].values()) + summary["observations"] + len(summary["broken_runs"])
    sys.exit(1 if bad else 0)


SHORT = {"kill-worker": "kill worker", "kill-coordinator": "kill coord", "kill-marker": "kill marker",
         "kill-spark": "kill Spark", "kill-faust": "kill Faust", "pause-zk": "pause ZK", "pause-broker": "pause broker",
         "restart-zk": "restart ZK", "expire-session": "expire session", "kill-executor": "kill executor",
         "restart-spark-worker": "restart Spark worker", "damage-state": "damage state",
         "damage-zk": "damage ZK disk", "cut-zk": "cut from ZK", "cut-kafka": "cut from Kafka",
         "cut-both": "cut from both", "split-zk": "split ZK", "bridge-zk": "bridge ZK", "slow-link": "slow link",
         "cut-driver": "cut driver/executor", "skew-clock": "skew clock"}


def table(reports: list[dict[str, Any]]) -> str:
    """A markdown table of the runs: faults by kind, records checked, anomalies by class."""
    from experiments.chaos.checker import CLASSES

    lines = ["| seed | faults | faults by kind | records checked | anomalies by class | components exited unasked |",
             "|---|---|---|---|---|---|"]
    for r in reports:
        kinds = ", ".join(f"{SHORT.get(k, k)} {n}" for k, n in sorted(r["faults_by_kind"].items()))
        if r["check"] is None:
            lines.append(f"| {r['seed']} | {r['faults_total']} | {kinds} | - | run broke: {r['error']} | "
                         f"{len(r['observations'])} |")
            continue
        totals = r["check"]["anomalies"]["totals"]
        classes = ", ".join(f"{c.replace('_', ' ')} {totals.get(c, 0)}" for c in CLASSES)
        lines.append(f"| {r['seed']} | {r['faults_total']} | {kinds} | {r['check']['records_checked']:,} | "
                     f"{classes} | {len(r['observations'])} |")
    return "\n".join(lines) + "\n"


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    anomalies: Counter[str] = Counter()
    for r in reports:
        kinds.update(r["faults_by_kind"])
        if r["check"] is not None:
            anomalies.update(r["check"]["anomalies"]["totals"])
    return {"runs": len(reports), "seeds": [r["seed"] for r in reports],
            "faults": [r["faults_total"] for r in reports], "faults_by_kind": dict(kinds),
            "records_checked": sum(r["check"]["records_checked"] for r in reports if r["check"]),
            "broken_runs": [r["seed"] for r in reports if r["check"] is None],
            "anomalies": dict(anomalies), "observations": sum(len(r["observations"]) for r in reports)}


if __name__ == "__main__":
    app()
