"""`make demo`: the thesis's chained hotness pipeline on the embedded stack, verified record by record.

    generator --> issues, issue-comments, pull-requests, pr-comments   (seeded, one epoch per 0.5 s)
    job 1, hot issues (job runtime, 2 workers)        issues + issue-comments --> hot-issues
    job 2, PR hotness (Spark Structured Streaming)    hot-issues + pr-comments --> pr-hotness

Job 1 starts unaligned on its own timer. While data flows, the coordinator aligns it with the
generator's epochs, and hot-swaps it for version 2 (which ran beside it, following its epochs).
Job 2 reads through the aligned source, so every Spark micro-batch covers whole committed epochs of
both inputs, and writes one pr-hotness epoch per batch; its lineage is checked down to the generator.
The demo ends with a verification line (exit code 1 if anything was lost or duplicated) and the
path of its plot.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from aligner.connectors.latency import LatencyLog
from aligner.connectors.runtime import JobSpec
from aligner.connectors.spark.lineage import sink_lineage, source_batch
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.coordinator.hotswap import HotSwap
from aligner.coordinator.stack import StackInfo, wait_for
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from experiments.chain import Generator, Worker, check_hot_issues, final_totals, open_stack, read_all
from experiments.common import RESULTS, write_results
from experiments.hotness import hot_issues, pr_hotness_query
from experiments.workload import (
    HOT_ISSUES,
    ISSUE_COMMENTS,
    ISSUES,
    PR_COMMENTS,
    PR_HOTNESS,
    STREAMS,
    Workload,
)

console = Console()
ROOT = "/aligner-demo"
WORKLOAD = Workload(comment_rate=150.0, item_rate=5.0)
SINK = "pr-hotness-spark"
GENERATE_S, ALIGN_AT, SWAP_AT, INTERVAL = 40.0, 8.0, 18.0, 0.5


def start_spark(info: StackInfo, root: str, checkpoint: str) -> tuple[Any, Any]:
    """Job 2 on local[2], or on the cluster of ``ALIGNER_SPARK_MASTER`` (docker-compose)."""
    from aligner.connectors.spark.session import local_session

    master = os.environ.get("ALIGNER_SPARK_MASTER", "local[2]")
    conf = {"spark.ui.showConsoleProgress": "false"}
    if master.startswith("spark://"):  # executors in other containers must reach this driver
        conf |= {"spark.driver.host": socket.gethostname(), "spark.driver.bindAddress": "0.0.0.0"}
    spark = local_session(master, "aligner-demo", **conf)
    conn = {"zk": info.zk, "kafka": info.kafka, "root": root}
    query = (pr_hotness_query(spark, conn, HOT_ISSUES, PR_COMMENTS, epochs_per_batch=8)
             .writeStream.format("aligned").options(**conn, subject=PR_HOTNESS, sinkId=SINK)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime="1 second").start())
    return spark, query


@dataclass
class Run:
    """What the pipeline did, for the verification."""

    sent: dict[str, int] = field(default_factory=dict)
    hot: list[dict[str, Any]] = field(default_factory=list)
    out: list[dict[str, Any]] = field(default_factory=list)
    batches: int = 0
    batch_seconds: float = float("nan")
    aligned: tuple[int, int] = (0, 0)
    tiled: list[str] = field(default_factory=list)
    plot: Path | None = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--external", action="store_true", help="use the stack of ALIGNER_ZK / ALIGNER_KAFKA")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    # External stacks outlive a run: every run gets its own root there.
    root = f"{ROOT}-{int(time.time())}" if args.external else ROOT
    checkpoints = os.environ.get("ALIGNER_SPARK_CHECKPOINTS")  # shared with the executors of a cluster
    with open_stack(args.external) as info, tempfile.TemporaryDirectory(dir=checkpoints) as tmp:
        console.print(f"[bold]stack[/] ZooKeeper {info.zk}, Kafka {info.kafka}, root {root}")
        led = Ledger.connect(info.zk, root)
        try:
            run = pipeline(info, led, root, f"{tmp}/checkpoint")
        finally:
            led.close()
    return verify(run, time.monotonic() - t0)


def pipeline(info: StackInfo, led: Ledger, root: str, checkpoint: str) -> Run:
    for s in STREAMS:
        create_subject(led, info.kafka, s, 4)
    create_subject(led, info.kafka, HOT_ISSUES, 4)
    create_subject(led, info.kafka, PR_HOTNESS, 2)
    jobs, coord = JobLedger(led), Coordinator(led)
    (RESULTS / "demo-latency.jsonl").unlink(missing_ok=True)
    latency = LatencyLog(RESULTS / "demo-latency.jsonl")
    console.print("starting job 2 (PR hotness) on Spark Structured Streaming ...")
    spark, query = start_spark(info, root, checkpoint)
    gen = Generator(info, root, {s: s for s in STREAMS}, WORKLOAD, INTERVAL)
    workers: list[Worker] = []
    events: dict[str, float] = {}
    run = Run()
    try:
        gen.start()
        started = time.time()
        spec1 = JobSpec(job="hot-issues", inputs=(ISSUES, ISSUE_COMMENTS), output=HOT_ISSUES, parallelism=2,
                        interval=0.7, output_partitions=(0, 1))
        for i in range(2):
            workers.append(Worker(info, root, spec1, i, hot_issues(WORKLOAD), latency, "job 1 v1"))
        console.print("generator (0.5 s epochs) and job 1 (hot issues, 2 workers, unaligned 0.7 s epochs) running")

        wait_for(lambda: time.time() - started >= ALIGN_AT, 120, "the alignment time")
        events["align job 1"] = time.time() - started
        decision = coord.align("hot-issues", timeout=120)
        console.print(f"  job 1 aligned: its job epoch {decision.job_epoch} starts at generator epochs "
                      f"{decision.subject_epochs}")

        wait_for(lambda: time.time() - started >= SWAP_AT, 120, "the hot-swap time")
        spec2 = JobSpec(job="hot-issues-v2", version="2", inputs=spec1.inputs, output=HOT_ISSUES, parallelism=2,
                        interval=0.7, output_partitions=(2, 3), follows="hot-issues")
        for i in range(2):
            workers.append(Worker(info, root, spec2, i, hot_issues(WORKLOAD, version=2), latency, "job 1 v2"))
        wait_for(lambda: len(c := jobs.consumers("hot-issues-v2", ISSUES)) == 2
                 and all(n.job_epoch is not None for n in c.values()), 120, "job 1 v2 to follow v1")
        events["hot-swap requested"] = time.time() - started
        swap = HotSwap(led).run("hot-issues", "hot-issues-v2", HOT_ISSUES, timeout=120)
        events["hot-swap decided"] = time.time() - started
        console.print(f"  hot-swapped: job 1 v1 wrote hot-issues epochs <= {swap.epoch}, v2 from {swap.epoch + 1}")

        wait_for(lambda: time.time() - started >= GENERATE_S, 120, "the end of the generated input")
        gen.stop.set()
        gen.join(60)
        for w in workers:
            w.finish(120)  # the generator finished its subjects: job 1 drains them and finishes hot-issues
        errors = gen.error + [e for w in workers for e in w.error]
        workers = []
        if errors:
            raise errors[0]
        ends = {s: led.frontier(s) for s in (HOT_ISSUES, PR_COMMENTS)}
        console.print(f"input finished ({dict(gen.sent)}); waiting for Spark to reach epochs {ends} ...")

        def spark_done() -> bool:
            if query.exception() is not None:
                raise RuntimeError(f"Spark query failed: {query.exception()}")
            progress = query.lastProgress
            end = progress and progress["sources"][0].get("endOffset")
            got = json.loads(end)["epochs"] if isinstance(end, str) else (end or {}).get("epochs", {})
            return all(int(got.get(s, 0)) > (-1 if e is None else e) for s, e in ends.items())

        wait_for(spark_done, 300, "Spark to read every committed epoch", interval=0.5)
        run.batches = query.lastProgress["batchId"] + 1
        durations = sorted(p["durationMs"].get("triggerExecution", 0) / 1000 for p in query.recentProgress
                           if p["numInputRows"])
        run.batch_seconds = durations[len(durations) // 2] if durations else float("nan")
    finally:
        gen.stop.set()
        for w in workers:  # only on a failure: stop what still runs before the stack goes
            w.stop.set()
            w.finish(30)
        query.stop()
        spark.stop()
        latency.close()
    run.sent = dict(gen.sent)
    run.hot = read_all(led, info.kafka, HOT_ISSUES)
    run.out = read_all(led, info.kafka, PR_HOTNESS)
    run.aligned, run.tiled = lineage_check(led)
    run.plot = write_plot(led, latency, run.out, events, started)
    return run


def verify(run: Run, seconds: float) -> int:
    sent = run.sent
    c1 = check_hot_issues(run.hot, WORKLOAD.hot_comments(sent[ISSUE_COMMENTS]))
    expected = WORKLOAD.pr_totals(sent[ISSUE_COMMENTS], sent[PR_COMMENTS])
    final = final_totals(run.out)
    # Job 2 counts inputs: a lost input leaves a final total short, a duplicated one makes it long.
    lost2 = sum(max(0, e[i] - final.get(pr, (0, 0))[i]) for pr, e in expected.items() for i in (0, 1))
    dup2 = sum(max(0, f[i] - expected.get(pr, (0, 0))[i]) for pr, f in final.items() for i in (0, 1))
    # A micro-batch written twice would repeat a pull request's row: each must move its totals on.
    seen: dict[int, tuple[int, int]] = {}
    stale_rows = 0
    for row in sorted(run.out, key=lambda r: r["epoch"]):
        now = (row["comments"], row["hot"])
        stale_rows += now <= seen.get(row["pr"], (-1, -1))
        seen[row["pr"]] = max(now, seen.get(row["pr"], now))
    versions = Counter(v["v"] for v in run.hot)
    aligned, checked = run.aligned
    ok = (c1["lost"] == c1["duplicated"] == c1["wrong"] == lost2 == dup2 == stale_rows == 0 and not run.tiled
          and versions[1] > 0 and versions[2] > 0 and aligned == checked > 0)
    console.print(f"job 1: {c1['out']:,} hot-issue records for {c1['expected']:,} hot comments "
                  f"(v1 {versions[1]:,} / v2 {versions[2]:,}): lost {c1['lost']}, duplicated {c1['duplicated']}, "
                  f"wrong {c1['wrong']}")
    console.print(f"job 2 (Spark, {run.batches} micro-batches, median {run.batch_seconds:.1f}s each): hotness of "
                  f"{len(final):,} pull requests from {sum(e[0] + e[1] for e in expected.values()):,} inputs: lost "
                  f"{lost2}, duplicated {dup2}; {len(run.out):,} rows, repeated {stale_rows}")
    console.print("Spark epoch lineage: " + ("every input epoch read by exactly one micro-batch" if not run.tiled
                                             else "; ".join(run.tiled))
                  + f"; {checked} micro-batches after job 1's alignment read only aligned job 1 epochs: {aligned}")
    console.print(f"plot: {run.plot}")
    style = "green" if ok else "red"
    console.print(
        f"[bold {style}]verification: records in {sum(sent.values()):,}, records out "
        f"{c1['out'] + len(run.out):,} (hot issues {c1['out']:,}, PR hotness rows {len(run.out):,}), lost "
        f"{c1['lost'] + lost2}, duplicated {c1['duplicated'] + dup2}, epochs aligned {aligned} of {checked}[/] "
        f"({seconds:.0f}s)"
    )
    return 0 if ok else 1


def lineage_check(led: Ledger) -> tuple[tuple[int, int], list[str]]:
    """The Spark sink's lineage: do its micro-batches tile each input's committed epochs (each read by
    exactly one batch), and how many of the batches after job 1's alignment read only aligned job 1
    epochs (those that end exactly on generator epochs), of how many."""
    aligned_job_epochs = set(JobLedger(led).job_epoch_numbers("hot-issues"))  # v2 follows v1's epochs
    first_aligned = min(aligned_job_epochs, default=0)
    spans: dict[str, list[tuple[int, int]]] = {HOT_ISSUES: [], PR_COMMENTS: []}
    ok = total = 0
    for written in sink_lineage(led, PR_HOTNESS, SINK).values():
        read = source_batch(led, written.query, written.batch) if written.query else {}
        for subject, node in read.items():
            if node.last >= node.first:
                spans[subject].append((node.first, node.last))
        hot = read.get(HOT_ISSUES)
        if hot is not None and hot.last >= hot.first >= first_aligned:
            total += 1
            ok += all(e in aligned_job_epochs for e in range(hot.first, hot.last + 1))
    problems = []
    for subject, got in spans.items():
        read_epochs = [e for first, last in sorted(got) for e in range(first, last + 1)]
        committed = [e for e in led.epoch_numbers(subject) if led.is_committed(subject, e)]
        if read_epochs != committed:
            problems.append(f"{subject}: batches read epochs {read_epochs}, committed {committed}")
    return (ok, total), problems


def write_plot(led: Ledger, latency: LatencyLog, out: list[dict[str, Any]], events: dict[str, float],
               started: float) -> Path:
    from experiments import plots

    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for row in out:
        by_epoch.setdefault(row["epoch"], []).append(row)
    spark_points = []
    for epoch, rows in sorted(by_epoch.items()):
        committed = led.committed(PR_HOTNESS, epoch).committed_at / 1000
        oldest = min(r["oldest_ts"] for r in rows)
        newest = sum(r["ts"] for r in rows) / len(rows)
        spark_points.append((committed - started, 1000 * (committed - oldest), 1000 * (committed - newest)))
    path = RESULTS / "demo.png"
    fig = plots.demo(latency.records, spark_points, events, started)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plots.close(fig)
    write_results("demo", {"events": events, "spark_epochs": spark_points,
                           "job1_epochs": [r.model_dump() for r in latency.records]})
    return path


if __name__ == "__main__":
    threading.excepthook = lambda args: console.print(f"[red]thread {args.thread}: {args.exc_value}")
    sys.exit(main())
