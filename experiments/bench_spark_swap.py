"""Spark hot-swap: S after acceptance and the largest output gap around the swap (issue 13.6).

One local[2] Spark application runs, per swap, two Structured Streaming queries as aligned jobs on a
fresh input subject X (an epoch every ``--interval`` seconds, default 0.5 s) and a fresh target T:
Q1 keeps a running count per key (k = n % 4, applyInPandasWithState), Q2 follows Q1 on a new
checkpoint with incompatible state (a running sum), rebuilding it from the start of X and voiding
its output until the swap. Once Q2 caught up and both ran side by side for ``--steady`` seconds, the
benchmark requests the swap (``HotSwap.run``) and measures:

- S minus the job epoch Q1 had committed when the swap was requested (epochs), and the seconds from
  the request to the commit of S at the target, to the swap's commit phase and to ``done``;
- the largest gap between consecutive target-epoch commits from S-``--window`` to S+``--window``,
  against the baseline: the median gap between target commits in the ``--steady`` seconds before the
  request (the queries' own commit cadence with no swap); their ratio is the benchmark's figure. S-w
  usually precedes the request, so the largest gap of the window's epochs committed after the
  request (the gaps the swap itself could cause) is reported too, and the baseline's own largest gap;
- the end-to-end delay (X epoch commit -> commit of the target epoch holding its results) of the X
  epochs the window's target epochs cover, against the median before the request;
- exactly-once at the target: every input's result exactly once, from Q1 (count) for epochs <= S and
  from Q2 (sum over the whole input: its state was rebuilt) after, and S+1 committed after S.

Every swap runs on fresh subjects and jobs in the same Spark application (the first pays the JVM's
warm-up, not measured). Results go to experiments/results/bench_spark_swap.json.

    timeout 1800 .venv/bin/python -m experiments.bench_spark_swap --swaps 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.spark.job import AlignedQuery, register_query
from aligner.connectors.subjects import create_subject
from aligner.coordinator.hotswap import HotSwap
from aligner.embedded.stack import EmbeddedStack, wait_for
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from experiments.common import json_value, write_results
from experiments.running_query import start_running_query

ROOT = "/bench-spark-swap"
LIVE = 600.0
"""Liveness bound (seconds) on every wait: generous for a shared 2-core machine, never a speed check."""


class Writer:
    """Commits one X epoch of ``per_epoch`` records {"n": N} every ``interval`` seconds on a thread."""

    def __init__(self, led: Ledger, kafka: str, subject: str, interval: float, per_epoch: int) -> None:
        self.led, self.kafka, self.subject = led, kafka, subject
        self.interval, self.per_epoch = interval, per_epoch
        self.sent = 0
        self.last = -1
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"writer-{subject}")

    def start(self) -> Writer:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with SinkProducer(self.led, self.kafka, self.subject, "gen", 0, [0, 1]) as p:
                due = time.monotonic()
                while not self._stop.is_set():
                    p.begin()
                    for _ in range(self.per_epoch):
                        n = self.sent
                        p.send(json.dumps({"n": n}).encode(), key=str(n).encode(), partition=n % 2)
                        self.sent += 1
                    self.last = p.commit().epoch
                    due += self.interval
                    self._stop.wait(max(0.0, due - time.monotonic()))
        except BaseException as exc:  # surfaced by healthy()
            self.error = exc

    def healthy(self) -> None:
        if self.error is not None:
            raise SystemExit(f"the input writer failed: {self.error}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


class Query:
    """One version of the stateful query, started in the shared session and run by AlignedQuery on a thread."""

    def __init__(self, spark: Any, led: Ledger, conn: dict[str, str], source: str, target: str, job: str,
                 version: int, partitions: list[int], checkpoint: str, follows: str | None = None) -> None:
        register_query(led, job, [source], target, follows=follows, output_partitions=partitions,
                       version=str(version))
        self.job = job
        self.query = start_running_query(spark, conn, source, target, job, version, checkpoint)
        self.stop_flag = threading.Event()
        self.swapped: bool | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(led,), daemon=True, name=f"query-{job}")
        self._thread.start()

    def _run(self, led: Ledger) -> None:
        try:
            self.swapped = AlignedQuery(led, self.query, self.job).run(self.stop_flag)
        except BaseException as exc:  # surfaced by healthy()
            self.error = exc

    def ended(self) -> bool:
        return not self._thread.is_alive()

    def healthy(self) -> None:
        if self.error is not None:
            text = str(self.error)
            causes = [line for line in text.splitlines() if "Error" in line or "aligner" in line][:20]
            raise SystemExit(f"query {self.job} failed: " + "\n".join(causes or [text[:1500]]))
        if self.ended() and self.swapped is False and not self.stop_flag.is_set():
            raise SystemExit(f"query {self.job} ended by itself before it was swapped out")

    def stop(self) -> None:
        self.stop_flag.set()
        self._thread.join(30)
        with contextlib.suppress(Exception):  # AlignedQuery.run stopped it already, or the session is gone
            self.query.stop()


class PhaseClock:
    """Polls the swap node every 20 ms and keeps when each phase was first seen (monotonic seconds)."""

    def __init__(self, jobs: JobLedger, old: str) -> None:
        self.jobs, self.old = jobs, old
        self.seen: dict[str, float] = {}
        self.epochs: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"phases-{old}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                swap, _ = self.jobs.swap(self.old)
                if swap is not None and swap.phase not in self.seen:
                    self.seen[swap.phase] = time.monotonic()
                    self.epochs[swap.phase] = swap.epoch
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _job_epoch(jobs: JobLedger, job: str, subject: str) -> int:
    """The last job epoch the query committed (its consumer node), -1 before its first."""
    return max((c.job_epoch for c in jobs.consumers(job, subject).values() if c.job_epoch is not None), default=-1)


def _subject_epoch(jobs: JobLedger, job: str, subject: str) -> int:
    return max((c.subject_epoch for c in jobs.consumers(job, subject).values() if c.subject_epoch is not None),
               default=-1)


def _commits(led: Ledger, subject: str, first: int, last: int) -> dict[int, float]:
    """Commit time (epoch seconds) of every epoch of [first, last]."""
    return {e: c.committed_at / 1000 for e, c in zip(range(first, last + 1), led.epochs.committed_many(subject, first,
                                                                                                       last),
                                                        strict=True)}


def _gaps(commits: dict[int, float], first: int, last: int) -> dict[int, float]:
    """Seconds between the commits of epoch e-1 and e, for e in [first, last]."""
    return {e: commits[e] - commits[e - 1] for e in range(first, last + 1) if e in commits and e - 1 in commits}


def _verify(led: Ledger, kafka: str, target: str, sent: int, swap_epoch: int) -> dict[str, Any]:
    """Exactly once at the target: v1 (a running count) for epochs <= S, v2 (a running sum over the whole
    input, its state rebuilt) after, every input once; S+1 committed no earlier than S."""
    first, last = led.subjects.epoch_numbers(target)[0], led.epochs.frontier(target)
    with EpochReader(led, kafka) as reader:
        outputs = [(r.epoch, json_value(r.value)) for r in reader.read(target, first, last)]
    seen = Counter(v["in"]["n"] for _, v in outputs)
    lost = sum(1 for n in range(sent) if seen[n] == 0)
    duplicated = sum(c - 1 for c in seen.values() if c > 1)
    unexpected = sum(1 for n in seen if not 0 <= n < sent)
    wrong_version = sum(1 for e, v in outputs if v["v"] != (1 if e <= swap_epoch else 2))
    by_key: dict[int, list[dict]] = defaultdict(list)
    for _, v in outputs:
        by_key[v["in"]["n"] % 4].append(v)
    wrong_value = 0
    for rows in by_key.values():
        rows.sort(key=lambda v: v["in"]["n"])
        total = 0
        for rank, v in enumerate(rows, 1):
            total += v["in"]["n"]
            wrong_value += ("count" in v and v["count"] != rank) or ("sum" in v and v["sum"] != total)
    times = _commits(led, target, swap_epoch, swap_epoch + 1)
    order_ok = times[swap_epoch] <= times[swap_epoch + 1]
    ok = not (lost or duplicated or unexpected or wrong_version or wrong_value) and order_ok
    return {"records": len(outputs), "inputs": sent, "lost": lost, "duplicated": duplicated,
            "unexpected": unexpected, "wrong_version": wrong_version, "wrong_value": wrong_value,
            "v1_records": sum(1 for _, v in outputs if v["v"] == 1),
            "v2_records": sum(1 for _, v in outputs if v["v"] == 2),
            "s_before_s_plus_1": order_ok, "exactly_once": ok}


def one_swap(i: int, spark: Any, led: Ledger, kafka: str, conn: dict[str, str], workdir: Path,
             args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """Q1 alone, then Q2 beside it until caught up and steady, then the swap; returns its measurements."""
    x, t, q1_job, q2_job = f"s{i}-x", f"s{i}-t", f"s{i}-q1", f"s{i}-q2"
    create_subject(led, kafka, x, 2)
    create_subject(led, kafka, t, 4)
    jobs = led.jobs
    started = time.monotonic()
    writer: Writer | None = None
    queries: list[Query] = []
    clock: PhaseClock | None = None

    def healthy() -> None:
        if writer is not None:
            writer.healthy()
        for q in queries:
            q.healthy()

    def mark(what: str) -> None:
        say(f"swap {i}: {time.monotonic() - started:6.1f}s {what}")

    try:
        writer = Writer(led, kafka, x, args.interval, args.records).start()
        q1 = Query(spark, led, conn, x, t, q1_job, 1, [0, 1], str(workdir / f"{q1_job}"))
        queries.append(q1)
        wait_for(lambda: _job_epoch(jobs, q1_job, x) >= 3, LIVE, "Q1 writing", on_wait=healthy)
        mark("Q1 writing")
        alone_from = _job_epoch(jobs, q1_job, x)
        time.sleep(args.steady)  # Q1 alone: its own commit cadence
        alone_until = _job_epoch(jobs, q1_job, x)
        q2 = Query(spark, led, conn, x, t, q2_job, 2, [2, 3], str(workdir / f"{q2_job}"), follows=q1_job)
        queries.append(q2)
        wait_for(lambda: _job_epoch(jobs, q2_job, x) >= 0, LIVE, "Q2 following", on_wait=healthy)
        mark(f"Q2 following from job epoch {_job_epoch(jobs, q2_job, x)} (Q1 at {_job_epoch(jobs, q1_job, x)})")
        wait_for(lambda: _subject_epoch(jobs, q2_job, x) >= _subject_epoch(jobs, q1_job, x) - 2, LIVE,
                 "Q2 to catch up with Q1", on_wait=healthy)
        caught = _job_epoch(jobs, q1_job, x)
        mark(f"Q2 caught up: Q2 at job epoch {_job_epoch(jobs, q2_job, x)}, Q1 at {caught}")
        time.sleep(args.steady)  # both side by side: the baseline cadence
        healthy()

        clock = PhaseClock(jobs, q1_job)
        requested_wall, requested = time.time(), time.monotonic()
        q1_epoch, frontier_at_request = _job_epoch(jobs, q1_job, x), led.epochs.frontier(t)
        swap = HotSwap(led).run(q1_job, q2_job, t, timeout=LIVE)
        done = time.monotonic()
        s = swap.epoch
        mark(f"swap done: S = {s} (Q1 had committed job epoch {q1_epoch} at the request)")
        wait_for(lambda: q1.ended(), LIVE, "Q1 to stop after its sink finished", on_wait=healthy)
        if not q1.swapped:
            raise SystemExit(f"query {q1_job} ended without being swapped out")
        wait_for(lambda: (led.epochs.frontier(t) or -1) >= s + args.window, LIVE, f"Q2 writing S+{args.window}",
                 on_wait=healthy)
        mark(f"Q1 swapped out and stopped; Q2 wrote S+{args.window}")
        writer.stop()
        writer.healthy()
        wait_for(lambda: _subject_epoch(jobs, q2_job, x) >= writer.last, LIVE, "Q2 to read the whole input",
                 on_wait=healthy)
        q2.stop()
        mark("input stopped; Q2 read all of it and stopped")
        check = _verify(led, kafka, t, writer.sent, s)
    finally:
        if clock is not None:
            clock.stop()
        if writer is not None:
            writer.stop()
        for q in reversed(queries):
            q.stop()

    last = led.epochs.frontier(t)
    assert last is not None
    commits = _commits(led, t, led.subjects.epoch_numbers(t)[0], last)
    base_first = next(e for e in sorted(commits) if e > caught)
    base_epochs = [e for e in range(base_first + 1, last + 1) if commits[e] <= requested_wall]
    if len(base_epochs) < 2:  # Q2 caught up just before the request (a short --steady on a busy machine):
        # the baseline is the target's last commits before the request, Q1 alone and both together
        base_epochs = [e for e in sorted(commits) if e - 1 in commits and commits[e] <= requested_wall][-3:]
    baseline = _gaps(commits, base_epochs[0], base_epochs[-1])
    alone = _gaps(commits, alone_from + 1, alone_until)
    lo, hi = max(1, s - args.window), min(last, s + args.window)
    window = _gaps(commits, lo, hi)
    worst = max(window, key=lambda e: window[e])
    # The same window from the request on only: the gaps the swap itself could have caused.
    after = {e: g for e, g in window.items() if commits[e] > requested_wall}
    worst_after = max(after, key=lambda e: after[e])
    base_median = statistics.median(baseline.values())

    # End-to-end delay of the input: X epoch commit -> commit of the target epoch holding its results.
    def delays(first: int, last_: int) -> dict[int, float]:
        out = {}
        for e in range(first, last_ + 1):
            node = jobs.job_epoch(q1_job, e)
            span = node.covered.get(x) if node is not None else None
            if span is None:
                continue
            xs = _commits(led, x, span.first, span.last)
            out.update({xe: commits[e] - c for xe, c in xs.items()})
        return out

    before = delays(base_epochs[0], base_epochs[-1])
    around = delays(lo, hi)
    payload = {
        "swap": i, "S": s, "q1_job_epoch_at_request": q1_epoch, "target_frontier_at_request": frontier_at_request,
        "s_minus_q1_epochs": s - q1_epoch,
        "request_to_s_committed_s": round(commits[s] - requested_wall, 3),
        "request_to_precommit_s": round(clock.seen["precommit"] - requested, 3) if "precommit" in clock.seen else None,
        "request_to_commit_s": round(clock.seen["commit"] - requested, 3) if "commit" in clock.seen else None,
        "request_to_done_s": round(done - requested, 3),
        "s_to_s_plus_1_s": round(commits[s + 1] - commits[s], 3),
        "baseline_gap_median_s": round(base_median, 3), "baseline_gaps": len(baseline),
        "baseline_gap_max_s": round(max(baseline.values()), 3),
        "q1_alone_gap_median_s": round(statistics.median(alone.values()), 3) if alone else None,
        "window": [lo, hi], "window_max_gap_s": round(window[worst], 3), "window_max_gap_at": worst,
        "window_gaps_s": {str(e): round(g, 3) for e, g in window.items()},
        "gap_ratio": round(window[worst] / base_median, 2),
        "after_request_max_gap_s": round(after[worst_after], 3), "after_request_max_gap_at": worst_after,
        "after_request_gap_ratio": round(after[worst_after] / base_median, 2),
        "delay_median_before_s": round(statistics.median(before.values()), 3) if before else None,
        "delay_max_around_s_s": round(max(around.values()), 3) if around else None,
        "x_epochs_around_s": len(around),
        **check,
    }
    return payload


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--swaps", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between X epochs")
    ap.add_argument("--records", type=int, default=20, help="records per X epoch")
    ap.add_argument("--steady", type=float, default=30.0,
                    help="seconds Q1 runs alone, and both run side by side before the request")
    ap.add_argument("--window", type=int, default=5, help="target epochs either side of S for the largest gap")
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.ERROR)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the queries, Spark and the stack.
    signal.signal(signal.SIGTERM, _interrupt)
    from rich.console import Console
    from rich.table import Table

    from aligner.connectors.spark.session import local_session

    console = Console(width=max(Console().width, 200))
    say = lambda line: console.print(line, highlight=False)  # noqa: E731
    runs: list[dict[str, Any]] = []
    with EmbeddedStack() as info, tempfile.TemporaryDirectory() as workdir:
        led = Ledger.connect(info.zk, ROOT)
        spark = None
        try:
            spark = local_session("local[2]", "bench-spark-swap", **{
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            })
            conn = {"zk": info.zk, "kafka": info.kafka, "root": ROOT, "settleHeap": "true"}
            for i in range(1, args.swaps + 1):
                runs.append(one_swap(i, spark, led, info.kafka, conn, Path(workdir), args, say))
                r = runs[-1]
                say(f"swap {i}: S-Q1 {r['s_minus_q1_epochs']} epochs, request->S committed "
                    f"{r['request_to_s_committed_s']} s, max gap {r['window_max_gap_s']} s vs baseline "
                    f"{r['baseline_gap_median_s']} s, exactly once: {r['exactly_once']}")
        finally:
            if spark is not None:
                spark.stop()
            led.close()

    table = Table(title=f"Spark hot-swap, local[2], X epochs every {args.interval:g} s, {args.records} records each")
    for col in ("swap", "S", "Q1 at req", "S-Q1", "req->S commit s", "req->swap commit s", "req->done s",
                "base gap s (max)", "max gap S±w s", "ratio", "after req s", "delay before s", "max delay S±w s",
                "exactly once"):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(str(r["swap"]), str(r["S"]), str(r["q1_job_epoch_at_request"]), str(r["s_minus_q1_epochs"]),
                      f"{r['request_to_s_committed_s']:.2f}", f"{r['request_to_commit_s']:.2f}",
                      f"{r['request_to_done_s']:.2f}",
                      f"{r['baseline_gap_median_s']:.2f} ({r['baseline_gap_max_s']:.2f})",
                      f"{r['window_max_gap_s']:.2f} (at {r['window_max_gap_at']})", f"{r['gap_ratio']:.2f}",
                      f"{r['after_request_max_gap_s']:.2f} (at {r['after_request_max_gap_at']})",
                      f"{r['delay_median_before_s']:.2f}", f"{r['delay_max_around_s_s']:.2f}",
                      f"{r['exactly_once']} ({r['lost']} lost, {r['duplicated']} dup)")
    console.print(table)

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 3)

    summary = {key: med(key) for key in ("s_minus_q1_epochs", "request_to_s_committed_s", "request_to_commit_s",
                                         "request_to_done_s", "baseline_gap_median_s", "window_max_gap_s",
                                         "gap_ratio", "after_request_max_gap_s", "after_request_gap_ratio",
                                         "baseline_gap_max_s", "delay_median_before_s", "delay_max_around_s_s")}
    summary["worst_gap_ratio"] = max(r["gap_ratio"] for r in runs)
    summary["all_exactly_once"] = all(r["exactly_once"] for r in runs)
    payload = {"master": "local[2]", "interval_s": args.interval, "records_per_epoch": args.records,
               "steady_s": args.steady, "window": args.window, "swaps": runs, "median": summary}
    say(f"median over {len(runs)} swaps: S {summary['s_minus_q1_epochs']} epochs after Q1's, S committed "
        f"{summary['request_to_s_committed_s']} s after the request, done after {summary['request_to_done_s']} s; "
        f"largest gap {summary['window_max_gap_s']} s vs {summary['baseline_gap_median_s']} s baseline "
        f"(ratio {summary['gap_ratio']}, worst {summary['worst_gap_ratio']}); "
        f"exactly once: {summary['all_exactly_once']}")
    say(f"results: {write_results('bench_spark_swap', payload)}")
    if not summary["all_exactly_once"]:
        raise SystemExit("a swap was not exactly once: see the table")


if __name__ == "__main__":
    main()
