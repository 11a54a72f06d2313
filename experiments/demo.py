"""`make demo`: the thesis's chained hotness pipeline, all on Spark, on the embedded stack, verified record by record.

    generator --> issues, issue-comments, pull-requests, pr-comments   (seeded, one epoch per 0.5 s)
    job 1, hot issues (Spark query, hot-swapped v1 -> v2)   issues + issue-comments --> hot-issues
    job 2, PR hotness (Spark query)                          hot-issues + pr-comments --> pr-hotness
    Faust job, hot comments per PR (Faust worker process)    hot-issues --> hot-prs

Jobs 1 and 2 are Structured Streaming queries of ONE local Spark application (one SparkSession,
local[2]), each an aligned job: every micro-batch ends on input epoch boundaries and writes one output
epoch. While data flows, version 2 of job 1, whose per-issue state has another layout (so it cannot
start from v1's checkpoint), starts on a new checkpoint beside v1, rebuilds its state from the start of
the input, and the coordinator hot-swaps v1 -> v2 (v1 writes hot-issues epochs <= S, v2 from S+1).
A Faust job, a real Faust worker process, reads hot-issues beside job 2 on its own checkpoint timer
until the coordinator aligns it. The demo ends with a verification (exit code 1 if anything was lost or
duplicated, or if job 2 and the Faust job did not consume identical whole epochs of hot-issues: the
check of ``aligner verify --consumed hot-issues --job pr-hotness --job hot-prs``) and the path of its plot.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from aligner.connectors.spark.lineage import sink_lineage, source_batch
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.coordinator.hotswap import HotSwap
from aligner.coordinator.verify import span_text, verify_consumed
from aligner.embedded.spark_cluster import SparkCluster
from aligner.embedded.stack import StackInfo, wait_for
from aligner.errors import UnknownJobError
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from experiments.chain import Generator, check_hot_issues, final_totals, open_stack, read_all
from experiments.common import RESULTS, write_results
from experiments.hotness import hot_issues_query, pr_hotness_query
from experiments.workload import (
    HOT_ISSUES,
    ISSUE_COMMENTS,
    ISSUES,
    PR_COMMENTS,
    PR_HOTNESS,
    STREAMS,
    Workload,
)

console = Console(soft_wrap=True)
ROOT = "/aligner-demo"
REPO = Path(__file__).resolve().parents[1]
WORKLOAD = Workload(comment_rate=150.0, item_rate=5.0)
JOB1, JOB1_V2, JOB2, FAUST = "hot-issues", "hot-issues-v2", "pr-hotness", "hot-prs"
HOT_PRS = "hot-prs"
"""The Faust job's output subject: each pull request's running count of hot comments."""
GENERATE_S, ALIGN_AT, SWAP_AT, INTERVAL = 40.0, 6.0, 14.0, 0.5
LIVE = 240.0
"""Liveness bound (seconds) on each wait of the demo: a stuck component fails the demo instead of hanging it."""


class FaustJob:
    """The Faust job: ``python -m experiments.demo_faust worker`` in its own process (its event lines are
    read on a thread, its log goes to a file); stopped with SIGTERM, killed if that takes over 10 s."""

    def __init__(self, info: StackInfo, root: str, home: str, log: Path) -> None:
        env = {**os.environ, "ALIGNER_ZK": info.zk, "ALIGNER_KAFKA": info.kafka, "ALIGNER_ROOT": root,
               "ALIGNER_HOME": home, "DEMO_FAUST_JOB": FAUST, "DEMO_FAUST_INPUT": HOT_ISSUES,
               "DEMO_FAUST_OUTPUT": HOT_PRS, "PYTHONPATH": str(REPO)}
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.demo_faust", "worker", "-l", "warn", "--without-web"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self._log_file, text=True,
            preexec_fn=_die_with_parent)
        self.lines: list[str] = []
        self.committed = -1
        self._reader = threading.Thread(target=self._read, name="faust-lines", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.strip()
            if line.startswith(("open ", "committed ", "finished ")):
                self.lines.append(line)
                if line.startswith("committed "):
                    self.committed = int(line.split()[1])

    def healthy(self) -> None:
        code = self.proc.poll()
        if code is not None:
            tail = self.log.read_text().strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"the Faust worker exited with code {code}: {tail[0][:300]} (log: {self.log})")

    def stop(self) -> int | None:
        """SIGTERM (the open epoch is aborted; committed ones stay); its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)
        self._log_file.close()
        return self.proc.returncode


def _die_with_parent() -> None:
    """The Faust worker gets SIGKILL should the demo itself die without stopping it (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Query:
    """A started Spark query run as aligned job ``job`` on its own thread (:class:`AlignedQuery`): the
    thread stops it once its sink finished (the old version after a committed hot-swap) or on ``close``."""

    def __init__(self, led: Ledger, query: Any, job: str) -> None:
        from aligner.connectors.spark.job import AlignedQuery

        self.query, self.job = query, job
        self.stop = threading.Event()
        self.swapped_out = False
        self.error: str | None = None
        self._aligned = AlignedQuery(led, query, job)
        self.thread = threading.Thread(target=self._run, name=f"query-{job}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.swapped_out = self._aligned.run(self.stop)
        except Exception as exc:  # the query failed: the cause, not the JVM's stack trace
            lines = [line for line in str(exc).splitlines() if "Error" in line or "aligner" in line]
            self.error = (lines or [str(exc)])[0][:500]

    def healthy(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"Spark query {self.job} failed: {self.error}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        with contextlib.suppress(Exception):
            if self.query.isActive:
                self.query.stop()
        with contextlib.suppress(Exception):
            self.progress = [p for p in self.query.recentProgress if p.get("numInputRows")]

    progress: list[dict[str, Any]] = []

    def batch_seconds(self) -> dict[str, float]:
        """Median seconds of its micro-batches that read rows: whole, and per phase Spark reports."""
        out: dict[str, float] = {}
        for phase in ("triggerExecution", "latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets"):
            values = sorted(p["durationMs"].get(phase, 0) / 1000 for p in self.progress)
            if values:
                out[phase] = values[len(values) // 2]
        return out


QUICK_JVM = {f"spark.{side}.extraJavaOptions": "-XX:TieredStopAtLevel=1" for side in ("driver", "executor")}
"""The demo's JVMs compile with C1 only. A one-minute run is all JIT warm-up: C2's compiler threads took 22 s
of CPU (per-thread /proc times), a fifth of two cores the queries share with the Faust worker and
the stack; with C1 only the median micro-batch fell from 1.2-1.4 s to 0.8-1.0 s (hot-issues) and from 1.1-1.5 s
to 0.5-0.7 s (the others, three runs). A query meant to
run for days keeps the default tiered compilation."""


def start_session() -> Any:
    """The one Spark application of the demo: local[2], or the cluster of ``ALIGNER_SPARK_MASTER``."""
    from aligner.connectors.spark.session import local_session

    master = os.environ.get("ALIGNER_SPARK_MASTER", "local[2]")
    # One state partition per query: three stateful queries share 2 cores with the Faust worker and the stack, and a
    # micro-batch of a few hundred records pays per task, not per record (median micro-batch 2.2-2.3 s with 2, 1.4-1.5
    # with 1, 2026-11-28).
    conf = {"spark.ui.showConsoleProgress": "false", "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            "spark.sql.shuffle.partitions": "1", **QUICK_JVM}
    if master.startswith("spark://"):  # executors in other containers must reach this driver
        conf |= {"spark.driver.host": socket.gethostname(), "spark.driver.bindAddress": "0.0.0.0",
                 # ... and import the jobs' code (experiments.hotness) where this checkout is mounted
                 "spark.executorEnv.PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return local_session(master, "aligner-demo", **conf)


def start_job1(spark: Any, led: Ledger, conn: dict[str, str], version: int, checkpoint: str) -> Any:
    """Job 1 version ``version`` as an aligned Spark query (v2 follows v1 and writes other partitions)."""
    from aligner.connectors.spark.job import register_query

    job = JOB1 if version == 1 else JOB1_V2
    register_query(led, job, (ISSUES, ISSUE_COMMENTS), HOT_ISSUES, follows=None if version == 1 else JOB1,
                   output_partitions=(0, 1) if version == 1 else (2, 3), version=str(version))
    return (hot_issues_query(spark, conn, job, ISSUES, ISSUE_COMMENTS, WORKLOAD, version)
            .writeStream.format("aligned").options(**conn, subject=HOT_ISSUES, job=job)
            .option("checkpointLocation", checkpoint).outputMode("append").start())


def start_job2(spark: Any, led: Ledger, conn: dict[str, str], checkpoint: str) -> Any:
    from aligner.connectors.spark.job import register_query

    register_query(led, JOB2, (HOT_ISSUES, PR_COMMENTS), PR_HOTNESS)
    return (pr_hotness_query(spark, conn, HOT_ISSUES, PR_COMMENTS, job=JOB2)
            .writeStream.format("aligned").options(**conn, subject=PR_HOTNESS, job=JOB2)
            .option("checkpointLocation", checkpoint).outputMode("append").start())


@dataclass
class Run:
    """What the pipeline did, for the verification."""

    sent: dict[str, int] = field(default_factory=dict)
    hot: list[dict[str, Any]] = field(default_factory=list)
    out: list[dict[str, Any]] = field(default_factory=list)
    faust: list[dict[str, Any]] = field(default_factory=list)
    consumed: dict[str, Any] = field(default_factory=dict)
    swap_epoch: int = -1
    faust_aligned_at: int | None = None
    batches: dict[str, tuple[int, dict[str, float]]] = field(default_factory=dict)
    """Per Spark query: micro-batches that read rows, and their median seconds (whole and per phase)."""
    aligned: tuple[int, int] = (0, 0)
    tiled: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    plot: Path | None = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--external", action="store_true", help="use the stack of ALIGNER_ZK / ALIGNER_KAFKA")
    ap.add_argument("--zk-servers", type=int, default=1, choices=(1, 3, 5),
                    help="ZooKeeper servers of the embedded stack (3 or 5: an ensemble on loopback)")
    ap.add_argument("--spark-master", default=None,
                    help="the Spark master (default ALIGNER_SPARK_MASTER, else local[2]), e.g. spark://host:7077")
    ap.add_argument("--spark-workers", type=int, default=0,
                    help="start a Spark standalone cluster of this many workers (one core each) on loopback "
                         "and run the Spark jobs there")
    ap.add_argument("--console-port", type=int, default=8080,
                    help="serve `aligner console` on this port while the demo runs (another free port when it is "
                         "taken; 0: no console)")
    args = ap.parse_args(argv)
    if args.spark_master:
        os.environ["ALIGNER_SPARK_MASTER"] = args.spark_master
    with contextlib.ExitStack() as cluster:
        if args.spark_workers:
            spark = SparkCluster(Path(tempfile.mkdtemp(prefix="aligner-spark-")), workers=args.spark_workers)
            cluster.callback(spark.stop)
            os.environ["ALIGNER_SPARK_MASTER"] = spark.start()
            console.print(f"[bold]Spark[/] standalone cluster {spark.url}, {args.spark_workers} workers")
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    # External stacks outlive a run: every run gets its own root there.
    root = f"{ROOT}-{int(time.time())}" if args.external else ROOT
    checkpoints = os.environ.get("ALIGNER_SPARK_CHECKPOINTS")  # shared with the executors of a cluster
    with open_stack(args.external, args.zk_servers) as info, tempfile.TemporaryDirectory(dir=checkpoints) as tmp:
        console.print(f"[bold]stack[/] ZooKeeper {info.zk}, Kafka {info.kafka}, root {root}")
        led = Ledger.connect(info.zk, root)
        web = _start_console(info, root, args.console_port)
        try:
            run = pipeline(info, led, root, tmp)
        except Exception as exc:  # one line, not a traceback: everything the demo started is stopped by now
            console.print(f"[bold red]demo failed: {type(exc).__name__}: {exc}")
            return 1
        finally:
            _stop_console(web)
            led.close()
    return verify(run, time.monotonic() - t0)


def _start_console(info: StackInfo, root: str, port: int) -> subprocess.Popen[bytes] | None:
    """``aligner console`` on the demo's chain, for watching it live (stopped with the demo); its address is
    printed once it answers, or why it did not start (the demo goes on without it)."""
    if port == 0:
        return None
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    said = tempfile.TemporaryFile()  # noqa: SIM115 (read if the console does not start, closed with the demo)
    proc = subprocess.Popen([sys.executable, "-m", "aligner.coordinator", "--zk", info.zk, "--kafka", info.kafka,
                             "--root", root, "console", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=said)
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=2):
            console.print(f"[bold]console[/] http://localhost:{port}/ (the chain live while the demo runs)")
            return proc
        time.sleep(0.2)
    said.seek(0)
    why = said.read().decode(errors="replace").strip().splitlines()
    console.print(f"[yellow]console did not start: {why[-1] if why else 'no answer in 30 s'}; the demo goes on")
    _stop_console(proc)
    return None


def _stop_console(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _consumer(jobs: JobLedger, job: str, subject: str, field_name: str = "subject_epoch") -> int:
    """A job's reported progress on an input (-1 before its first commit)."""
    try:
        nodes = jobs.consumers(job, subject)
    except UnknownJobError:
        return -1
    values = [getattr(n, field_name) for n in nodes.values()]
    return min((v if v is not None else -1) for v in values) if values else -1


def _through(led: Ledger, jobs: JobLedger, job: str, subject: str) -> int:
    """The last epoch of ``subject`` a job consumed in its last committed (aligned) job epoch, -1 before:
    read from the job epoch node its output committed last (output epoch E is job epoch E)."""
    try:
        node = jobs.job(job)
    except UnknownJobError:
        return -1
    last = led.epochs.frontier(node.output)
    epoch = jobs.job_epoch(jobs.epoch_line(job), last) if last is not None else None
    return epoch.next[subject] - 1 if epoch is not None and subject in epoch.next else -1


def pipeline(info: StackInfo, led: Ledger, root: str, tmp: str) -> Run:
    for s in STREAMS:
        create_subject(led, info.kafka, s, 2)  # one Spark read task per partition: 2 cores
    create_subject(led, info.kafka, HOT_ISSUES, 4)
    create_subject(led, info.kafka, PR_HOTNESS, 2)
    create_subject(led, info.kafka, HOT_PRS, 2)
    jobs, coord = led.jobs, Coordinator(led)
    # settleHeap: Spark's reused Python workers freeze their live heap (the demo owns its Spark application)
    conn = {"zk": info.zk, "kafka": info.kafka, "root": root, "settleHeap": "true"}
    run = Run()
    events: dict[str, float] = {}
    queries: dict[str, Query] = {}
    gen: Generator | None = None
    faust: FaustJob | None = None
    spark: Any = None
    started = time.time()
    try:
        console.print("starting the Faust job (a Faust worker process) and the Spark application "
                      f"({os.environ.get('ALIGNER_SPARK_MASTER', 'local[2]')}) ...")
        RESULTS.mkdir(parents=True, exist_ok=True)
        faust = FaustJob(info, root, f"{tmp}/home", RESULTS / "demo-faust.log")
        spark = start_session()
        queries[JOB1] = Query(led, start_job1(spark, led, conn, 1, f"{tmp}/job1-v1"), JOB1)
        queries[JOB2] = Query(led, start_job2(spark, led, conn, f"{tmp}/job2"), JOB2)

        def healthy() -> None:
            for q in queries.values():
                q.healthy()
            assert faust is not None
            faust.healthy()

        gen = Generator(info, root, {s: s for s in STREAMS}, WORKLOAD, INTERVAL)
        gen.start()
        started = time.time()
        console.print("generator (0.5 s epochs), job 1 v1 and job 2 (Spark queries, aligned jobs) running")

        def at(seconds: float, what: str) -> None:
            wait_for(lambda: time.time() - started >= seconds, LIVE, what, interval=0.2, on_wait=healthy)

        at(ALIGN_AT, "the time to align the Faust job")
        wait_for(lambda: faust.committed >= 0 and (led.epochs.frontier(HOT_ISSUES) or -1) >= 1, LIVE,
                 "the Faust job's first epoch and job 1's output", interval=0.2, on_wait=healthy)
        events["Faust job aligned"] = time.time() - started
        decision = coord.align(FAUST, timeout=LIVE)
        run.faust_aligned_at = decision.job_epoch
        console.print(f"  Faust job aligned by the coordinator: its job epoch {decision.job_epoch} starts at "
                      f"hot-issues epoch {decision.subject_epochs}")

        at(SWAP_AT, "the hot-swap time")
        events["job 1 v2 started"] = time.time() - started
        queries[JOB1_V2] = Query(led, start_job1(spark, led, conn, 2, f"{tmp}/job1-v2"), JOB1_V2)
        wait_for(lambda: _consumer(jobs, JOB1_V2, ISSUES, "job_epoch") >= 0, LIVE,
                 "job 1 v2 to rebuild its state and follow v1", interval=0.2, on_wait=healthy)
        console.print(f"  job 1 v2 (other state layout, new checkpoint) rebuilt its state from epoch 0 in "
                      f"{time.time() - started - events['job 1 v2 started']:.0f}s and follows v1")
        events["hot-swap requested"] = time.time() - started
        swap = HotSwap(led).run(JOB1, JOB1_V2, HOT_ISSUES, timeout=LIVE)
        events["hot-swap decided"] = time.time() - started
        run.swap_epoch = swap.epoch
        wait_for(lambda: not queries[JOB1].thread.is_alive(), LIVE, "job 1 v1 to end after the swap",
                 interval=0.2, on_wait=healthy)
        console.print(f"  hot-swapped: job 1 v1 wrote hot-issues epochs <= {swap.epoch} and its query ended "
                      f"({'stopped once its sink finished' if queries[JOB1].swapped_out else 'ended'}), "
                      f"v2 writes from {swap.epoch + 1}")

        at(GENERATE_S, "the end of the generated input")
        gen.stop.set()
        gen.join(60)
        if gen.error:
            raise gen.error[0]
        ends = {s: led.epochs.frontier(s) or -1 for s in (*STREAMS, HOT_ISSUES)}
        console.print(f"input finished ({dict(gen.sent)}); waiting for the jobs to read every epoch ...")
        # Progress from the job epoch nodes of each job's last committed output epoch (a Spark job's
        # consumer node forgets a subject its last batch did not read: as the Spark guide says).
        for job, subjects in ((JOB1_V2, (ISSUES, ISSUE_COMMENTS)), (JOB2, (HOT_ISSUES, PR_COMMENTS)),
                              (FAUST, (HOT_ISSUES,))):
            if job == JOB2:
                ends[HOT_ISSUES] = led.epochs.frontier(HOT_ISSUES) or -1  # job 1 wrote its last epoch
            def through(job: str = job, subjects: tuple[str, ...] = subjects) -> bool:
                return all(_through(led, jobs, job, s) >= ends[s] for s in subjects)

            wait_for(through, LIVE, f"{job} to read every epoch of {', '.join(subjects)}", interval=0.3,
                     on_wait=healthy)
        events["all read"] = time.time() - started
    finally:
        if gen is not None:
            gen.stop.set()
            gen.join(30)
        for q in queries.values():
            q.close()
            run.batches[q.job] = (len(q.progress), q.batch_seconds())
        if spark is not None:
            spark.stop()
        if faust is not None:
            code = faust.stop()
            run.stopped.append(f"Faust worker exit {code}")
    run.sent = dict(gen.sent) if gen is not None else {}
    run.hot = read_all(led, info.kafka, HOT_ISSUES)
    run.out = read_all(led, info.kafka, PR_HOTNESS)
    run.faust = read_all(led, info.kafka, HOT_PRS)
    run.consumed = verify_consumed(led, HOT_ISSUES, [JOB2, FAUST])
    run.aligned, run.tiled = lineage_check(led)
    run.plot = write_plot(led, run, events, started)
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
    # The Faust job counts hot comments per pull request: its last count must be job 2's hot total.
    faust_hot: dict[int, int] = {}
    for row in run.faust:
        faust_hot[row["pr"]] = max(faust_hot.get(row["pr"], 0), row["hot"])
    faust_off = sum(1 for pr in set(faust_hot) | {pr for pr, (_c, h) in final.items() if h}
                    if faust_hot.get(pr, 0) != final.get(pr, (0, 0))[1])
    versions = Counter(v["v"] for v in run.hot)
    v_wrong = sum(1 for v in run.hot if v["v"] != (1 if v["epoch"] <= run.swap_epoch else 2))
    aligned, checked = run.aligned
    consumed = run.consumed
    ok = (c1["lost"] == c1["duplicated"] == c1["wrong"] == lost2 == dup2 == stale_rows == v_wrong == faust_off == 0
          and not run.tiled and versions[1] > 0 and versions[2] > 0 and aligned == checked > 0
          and not consumed["differences"] and consumed["identical"] > 0)
    console.print(f"job 1 (Spark): {c1['out']:,} hot-issue records for {c1['expected']:,} hot comments "
                  f"(v1 {versions[1]:,} in epochs <= {run.swap_epoch} / v2 {versions[2]:,} after; {v_wrong} from the "
                  f"wrong version): lost {c1['lost']}, duplicated {c1['duplicated']}, wrong {c1['wrong']}")
    for job, (n, phases) in run.batches.items():
        console.print(f"  Spark query {job}: {n} micro-batches with input, median " + ", ".join(
            f"{k} {v:.1f}s" for k, v in phases.items() if v >= 0.05))
    inputs2 = sum(e[0] + e[1] for e in expected.values())
    console.print(f"job 2 (Spark): hotness of {len(final):,} pull requests from {inputs2:,} inputs: lost {lost2}, "
                  f"duplicated {dup2}; "
                  f"{len(run.out):,} rows, repeated {stale_rows}")
    console.print(f"Faust job: {len(run.faust):,} rows; its hot comments per pull request differ from job 2's for "
                  f"{faust_off} of {len(faust_hot):,} pull requests")
    tiled = "every input epoch read by exactly one micro-batch of job 2" if not run.tiled else "; ".join(run.tiled)
    console.print(f"Spark epoch lineage: {tiled}; {aligned} of {checked} batches read only job 1 job epochs")
    for r in consumed["jobs"]:
        console.print(f"  {r['job']}: consumed hot-issues epochs {span_text(r['consumed'])} in {r['checkpoints']} "
                      f"checkpoints" + (" (aligned from an epoch boundary)" if r["aligned_from_boundary"] else ""))
    if consumed["differences"]:
        console.print("[red]consumed epochs differ: " + "; ".join(consumed["differences"][:3]))
    console.print(f"plot: {run.plot}")
    style = "green" if ok else "red"
    console.print(
        f"[bold {style}]verification: records in {sum(sent.values()):,}, records out "
        f"{c1['out'] + len(run.out) + len(run.faust):,} (hot issues {c1['out']:,}, PR hotness rows {len(run.out):,}, "
        f"Faust rows {len(run.faust):,}), lost {c1['lost'] + lost2} (job 1 {c1['lost']}, job 2 {lost2}), duplicated "
        f"{c1['duplicated'] + dup2} (job 1 {c1['duplicated']}, job 2 {dup2}); Faust job and job 2 consumed "
        f"{consumed['identical']} identical epochs of hot-issues ({consumed['first']}..{consumed['last']})"
        + ("" if not consumed["differences"] else ", DIFFERENT") + f"[/] ({seconds:.0f}s)"
    )
    return 0 if ok else 1


def lineage_check(led: Ledger) -> tuple[tuple[int, int], list[str]]:
    """Job 2's lineage: do its micro-batches tile each input's committed epochs (each read by exactly one
    batch), and how many of its batches read only job epochs of job 1 (whose output epochs each end
    exactly on input epoch boundaries), of how many."""
    job1_epochs = set(led.jobs.job_epoch_numbers(JOB1))  # v2 uses v1's job epochs
    spans: dict[str, list[tuple[int, int]]] = {HOT_ISSUES: [], PR_COMMENTS: []}
    ok = total = 0
    for written in sink_lineage(led, PR_HOTNESS, JOB2).values():
        read = source_batch(led, written.query, written.batch) if written.query else {}
        for subject, node in read.items():
            if node.last >= node.first:
                spans[subject].append((node.first, node.last))
        hot = read.get(HOT_ISSUES)
        if hot is not None and hot.last >= hot.first:
            total += 1
            ok += all(e in job1_epochs for e in range(hot.first, hot.last + 1))
    problems = []
    for subject, got in spans.items():
        read_epochs = [e for first, last in sorted(got) for e in range(first, last + 1)]
        committed = [e for e in led.subjects.epoch_numbers(subject) if led.epochs.is_committed(subject, e)]
        if read_epochs != committed:
            problems.append(f"{subject}: batches read epochs {span_text(_runs(read_epochs))}, committed "
                            f"{span_text(_runs(committed))}")
    return (ok, total), problems


def _runs(epochs: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for e in epochs:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return runs


def _latency(led: Ledger, subject: str, rows: list[dict[str, Any]], started: float
             ) -> list[tuple[float, float, float, int]]:
    """Per committed epoch of ``subject``: (commit time into the demo, commit - oldest input creation ms,
    commit - average input creation ms, the version that wrote it)."""
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_epoch.setdefault(row["epoch"], []).append(row)
    points = []
    for epoch, group in sorted(by_epoch.items()):
        committed = led.epochs.committed(subject, epoch).committed_at / 1000
        oldest = min(r.get("oldest_ts", r["ts"]) for r in group)
        avg = sum(r["ts"] for r in group) / len(group)
        points.append((committed - started, 1000 * (committed - oldest), 1000 * (committed - avg),
                       int(group[0].get("v", 1))))
    return points


def write_plot(led: Ledger, run: Run, events: dict[str, float], started: float) -> Path:
    """Latency per output epoch of each job (commit time - input creation time), with the demo's events."""
    from experiments import plots

    series = {"job 1 v1 (Spark)": [p for p in _latency(led, HOT_ISSUES, run.hot, started) if p[3] == 1],
              "job 1 v2 (Spark)": [p for p in _latency(led, HOT_ISSUES, run.hot, started) if p[3] == 2],
              "job 2 (Spark)": _latency(led, PR_HOTNESS, run.out, started),
              "Faust job": _latency(led, HOT_PRS, run.faust, started)}
    fig, ax = plots.plt.subplots(figsize=(11, 4.8))
    for (name, points), (color, marker) in zip(series.items(), (("tab:blue", "."), ("tab:purple", "."),
                                                                 ("tab:red", "s"), ("tab:green", "^")), strict=True):
        if points:
            t, _worst, avg, _v = zip(*points, strict=True)
            ax.plot(t, avg, marker=marker, ms=4, lw=0.6, color=color, label=f"{name}: commit - average input creation")
    for (name, at), style in zip(events.items(), (":", "--", "-.", "-", ":"), strict=False):
        ax.axvline(at, color="black", ls=style, lw=0.8, label=name)
    ax.set_xlabel("seconds into the demo")
    ax.set_ylabel("ms per output epoch (log scale)")
    ax.set_yscale("log")
    ax.set_title("hotness chain on Spark (one application, local[2]): job 1 hot-swapped v1 -> v2 (new state layout);"
                 " a Faust job aligned beside job 2", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = RESULTS / "demo.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plots.close(fig)
    write_results("demo", {"events": events, "swap_epoch": run.swap_epoch, "consumed": run.consumed,
                           **{name.replace(" ", "_"): points for name, points in series.items()}})
    return path


if __name__ == "__main__":
    threading.excepthook = lambda args: console.print(f"[red]thread {args.thread}: {args.exc_value}")
    sys.exit(main())
