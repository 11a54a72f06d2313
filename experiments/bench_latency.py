"""End-to-end latency of a two-job chain, aligned vs exactly-once, same checkpoint interval everywhere.

    raw --(job A)--> X --(job B)--> Y

A generator writes records at a steady rate into ``raw``, each carrying its creation time, and
commits one subject epoch per interval on a fixed schedule. Jobs A and B (one worker each, on
threads of this process, identity transform that appends the input subject epoch) run with the same
own interval. Each round runs the chain twice on fresh subjects: both jobs unaligned
(exactly-once mode: epochs end on the job's own timer), and aligned (``Coordinator.align`` on A,
then on B; only Y epochs of aligned B epochs whose X epochs are aligned A epochs count).

The latency of a record is the time its result becomes readable at Y, i.e. the ``committed_at`` of
the Y epoch holding it (ZooKeeper contribution timestamp, taken just before the ZooKeeper commit
multi-op, ms resolution), minus its creation time. Every record of every counted epoch is read back
with the exact reader. Per record, the latency is split into its hops: creation -> raw commit (the
generator's epoch, identical in both modes), raw commit -> X commit (job A), X commit -> Y commit
(job B). For aligned epochs each hop is further split by wrapping the worker's methods (step,
``_covered``, ``_drain_until``, Kafka flush/commit, ZooKeeper commit).

    .venv/bin/python -m experiments.bench_latency [--interval 0.5] [--epochs 25] [--rounds 2] [--rate 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aligner.connectors.reader import EpochReader
from aligner.connectors.runtime import JobSpec, JobWorker, KeyedState
from aligner.connectors.runtime.worker import WorkerThread
from aligner.connectors.sink import SinkProducer
from aligner.connectors.source import SourceRecord
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.embedded.stack import EmbeddedStack, StackInfo
from aligner.ledger import Ledger
from experiments import ForeignCpu
from experiments.common import json_value, write_results

PARTITIONS = 2
TARGET = 0.05
"""Issue 3: aligned may add at most 5% of the checkpoint interval over exactly-once."""
STEPS = ("busy", "watch", "fix epoch", "consume", "load+process", "flush", "kafka commit", "zk commit", "hop")


def hop(record: SourceRecord, _state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    """Identity, plus the input subject epoch the record came from (for the per-hop split)."""
    v = json.loads(record.value or b"{}")
    v.setdefault("hops", []).append(record.epoch)
    yield record.key, json.dumps(v).encode()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    i = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[i]


# ---- the chain ---------------------------------------------------------------------------------


class PacedGenerator(threading.Thread):
    """Writes ``rate`` records/s, each ``{"t": creation time}``, one subject epoch per ``interval``."""

    def __init__(self, info: StackInfo, root: str, subject: str, interval: float, rate: float) -> None:
        super().__init__(daemon=True)
        self.info, self.root, self.subject, self.interval, self.rate = info, root, subject, interval, rate
        self.stop = threading.Event()
        self.sent = 0
        self.error: list[BaseException] = []

    def run(self) -> None:
        try:
            led = Ledger.connect(self.info.zk, self.root)
            parts = list(range(led.subjects.subject(self.subject).partitions))
            with SinkProducer(led, self.info.kafka, self.subject, "gen", 0, parts) as p:
                t0 = time.time()
                boundary = t0
                while not self.stop.is_set():
                    boundary += self.interval
                    p.begin()
                    while True:
                        now = time.time()
                        if now >= boundary:
                            break
                        due = int((now - t0) * self.rate)
                        while self.sent < due:
                            p.send(json.dumps({"t": time.time(), "n": self.sent}).encode())
                            self.sent += 1
                        time.sleep(min(0.002, boundary - now))
                    p.commit()
                p.finish()
            led.close()
        except BaseException as exc:
            self.error.append(exc)


class TimedConsumer:
    """Wraps the source's Kafka consumer to add up the time spent in ``consume`` per job epoch.

    ``cap`` (seconds, optional) caps the consume timeout: a what-if for the fix in the report, off
    by default so the library is measured as it is.
    """

    def __init__(self, consumer: Any, profile: Profile, cap: float | None) -> None:
        self._c, self._profile, self._cap = consumer, profile, cap

    def consume(self, num: int = 1, timeout: float = -1) -> Any:
        if self._cap is not None and (timeout < 0 or timeout > self._cap):
            timeout = self._cap
        t0 = time.time()
        try:
            return self._c.consume(num, timeout)
        finally:
            cur = self._profile._cur
            cur["consume_s"] = cur.get("consume_s", 0.0) + time.time() - t0
            cur["consume_calls"] = cur.get("consume_calls", 0) + 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


class Profile:
    """Per job epoch, wall-clock timestamps (time.time) of the steps of ``JobWorker.step``."""

    def __init__(self, worker: JobWorker, consume_cap: float | None = None) -> None:
        self.epochs: dict[int, dict[str, float]] = {}
        self._cur: dict[str, float] = {}
        w, source, sink = worker, worker.io.source, worker.io.sink
        assert source is not None and sink is not None, "the worker is started"
        source._consumer = TimedConsumer(source._consumer, self, consume_cap)  # type: ignore[assignment]  # a timing proxy
        arm = w.ledger.watches.arm_watch

        def arm_watch(subject: str, epoch: int, fired: threading.Event | Callable[[Any], None]) -> None:
            # record when the ZooKeeper watch wakes the worker (the last wake before the epoch is fixed);
            # the runtime passes a callback, older callers an event
            cur = self._cur

            def noted(event: Any = None) -> None:
                if "covered" not in cur:
                    cur["fired"] = time.time()
                if isinstance(fired, threading.Event):
                    fired.set()
                else:
                    fired(event)

            arm(subject, epoch, noted)

        w.ledger.watches.arm_watch = arm_watch  # type: ignore[method-assign]
        self._wrap(w, "step", before="start", after="end", epoch=lambda: sink.next_epoch)
        # where the covered subject epochs are decided: JobEpochs.covered (older runtimes: JobWorker._covered)
        decider = getattr(w, "epochs", None)
        self._wrap(decider if decider is not None and hasattr(decider, "covered") else w,
                   "covered" if decider is not None and hasattr(decider, "covered") else "_covered", after="covered")
        self._wrap(w, "_drain_until", after="drained")
        self._wrap(sink.producer.kp, "flush", before="flush_start", after="flushed")
        self._wrap(sink.producer.kp, "commit_transaction", before="kafka_start", after="kafka_done")
        self._wrap(sink.ledger.commits, "commit_epoch", before="zk_start", after="zk_done")

    def _wrap(self, obj: Any, name: str, before: str | None = None, after: str | None = None,
              epoch: Callable[[], int] | None = None) -> None:
        orig = getattr(obj, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            if epoch is not None:
                self._cur = self.epochs.setdefault(epoch(), {})
            if before:
                self._cur.setdefault(before, time.time())
            try:
                return orig(*a, **kw)
            finally:
                if after:
                    self._cur[after] = time.time()

        setattr(obj, name, wrapper)


class Job(WorkerThread):
    """One job worker on a thread with its own ZooKeeper session, profiled."""

    def __init__(self, info: StackInfo, root: str, spec: JobSpec, consume_cap: float | None = None) -> None:
        super().__init__(info.zk, root, info.kafka, spec, 0, hop)
        self.profile = Profile(self.worker, consume_cap)
        self.start()

    def join(self, timeout: float) -> None:
        self.finish(timeout)
        if self.error:
            raise self.error[0]


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.1)


def run_chain(info: StackInfo, root: str, led: Ledger, mode: str, tag: str, args: argparse.Namespace,
              console: Console, rng: random.Random) -> dict[str, Any]:
    raw, x, y = f"raw-{tag}", f"x-{tag}", f"y-{tag}"
    for s in (raw, x, y):
        create_subject(led, info.kafka, s, PARTITIONS)
    jobs = led.jobs
    ja, jb = f"A-{tag}", f"B-{tag}"
    gen = PacedGenerator(info, root, raw, args.interval, args.rate)
    gen.start()
    # Random start phases: with equal intervals the unaligned jobs' timers stay phase-locked to each
    # other and (nearly) to the generator, so a fixed start would fix the exactly-once latency too.
    cap = None if args.consume_timeout_ms is None else args.consume_timeout_ms / 1000
    time.sleep(rng.uniform(0, args.interval))
    a = Job(info, root, JobSpec(job=ja, inputs=(raw,), output=x, interval=args.interval), cap)
    time.sleep(rng.uniform(0, args.interval))
    b = Job(info, root, JobSpec(job=jb, inputs=(x,), output=y, interval=args.interval), cap)
    t_start = time.monotonic()

    def frontier(s: str) -> int:
        f = led.epochs.frontier(s)
        return -1 if f is None else f

    def fully_aligned() -> list[int]:
        """Committed Y epochs of aligned B epochs whose X epochs all come from aligned A epochs."""
        a_aligned = set(jobs.job_epoch_numbers(ja))
        last = frontier(y)
        out = []
        for e in jobs.job_epoch_numbers(jb):
            node = jobs.job_epoch(jb, e)
            span = node.covered.get(x) if node else None
            if e <= last and span is not None and all(k in a_aligned for k in range(span.first, span.last + 1)):
                out.append(e)
        return out[args.skip:]

    align_s: dict[str, float] = {}
    try:
        wait_until(lambda: frontier(y) >= args.warmup, 60, f"{args.warmup} warm-up epochs at {y}")
        if mode == "aligned":
            coord = Coordinator(led)
            for job in (ja, jb):
                t0 = time.monotonic()
                coord.align(job, timeout=60)
                align_s[job[0]] = time.monotonic() - t0
            wait_until(lambda: len(fully_aligned()) >= args.epochs, 30 + 3 * args.epochs * args.interval,
                       f"{args.epochs} aligned epochs at {y}")
            measured = fully_aligned()[: args.epochs]
        else:
            wait_until(lambda: frontier(y) >= args.warmup + args.epochs, 30 + 3 * args.epochs * args.interval,
                       f"{args.epochs} epochs at {y}")
            measured = list(range(args.warmup + 1, args.warmup + 1 + args.epochs))
    finally:
        gen.stop.set()
        gen.join(30)
        a.join(60)  # the generator finished raw: the jobs drain and stop
        b.join(60)
    if gen.error:
        raise gen.error[0]
    run_s = time.monotonic() - t_start

    # ---- per record ------------------------------------------------------------------------------
    commit_ms: dict[str, dict[int, int]] = {raw: {}, x: {}, y: {}}

    def committed_at(subject: str, epoch: int) -> int:
        if epoch not in commit_ms[subject]:
            commit_ms[subject][epoch] = led.epochs.committed(subject, epoch).committed_at
        return commit_ms[subject][epoch]

    latency, gen_hop, a_hop, b_hop = [], [], [], []
    per_epoch: list[dict[str, Any]] = []
    with EpochReader(led, info.kafka) as reader:
        for e in measured:
            y_ms = committed_at(y, e)
            lat = []
            for r in reader.read(y, e):
                v = json_value(r.value)
                t_ms = 1000 * v["t"]
                e_raw, e_x = v["hops"]
                raw_ms, x_ms = committed_at(raw, e_raw), committed_at(x, e_x)
                lat.append(y_ms - t_ms)
                gen_hop.append(raw_ms - t_ms)
                a_hop.append(x_ms - raw_ms)
                b_hop.append(y_ms - x_ms)
            latency.extend(lat)
            per_epoch.append({"y_epoch": e, "records": len(lat),
                              "median_ms": statistics.median(lat) if lat else None})

    # ---- per aligned job epoch: where a hop's time goes -------------------------------------------
    def breakdown(job: Job, name: str, upstream: str, epochs: Iterable[int]) -> dict[str, list[float]]:
        parts: dict[str, list[float]] = {k: [] for k in STEPS}
        for e in epochs:
            p = job.profile.epochs.get(e)
            node = jobs.job_epoch(name, e)
            span = node.covered.get(upstream) if node else None
            if not p or span is None or "covered" not in p or "zk_done" not in p:
                continue
            up = committed_at(upstream, span.last) / 1000
            begin = max(p["start"], up)
            parts["busy"].append(max(0.0, p["start"] - up))
            woke = p["fired"] if p.get("fired", 0.0) >= begin else begin
            parts["watch"].append(woke - begin)
            parts["fix epoch"].append(p["covered"] - woke)
            parts["consume"].append(p.get("consume_s", 0.0))
            parts["load+process"].append(p["drained"] - p["covered"] - p.get("consume_s", 0.0))
            parts["flush"].append(p["kafka_start"] - p["drained"])
            parts["kafka commit"].append(p["kafka_done"] - p["kafka_start"])
            parts["zk commit"].append(p["zk_done"] - p["kafka_done"])
            parts["hop"].append(p["zk_done"] - up)
        return {k: [1000 * s for s in v] for k, v in parts.items()}

    profile: dict[str, dict[str, list[float]]] = {}
    if mode == "aligned":
        b_epochs = measured
        x_epochs = sorted({k for e in b_epochs for n in [jobs.job_epoch(jb, e)] if n
                           for sp in [n.covered.get(x)] if sp for k in range(sp.first, sp.last + 1)})
        profile = {"A": breakdown(a, ja, raw, x_epochs), "B": breakdown(b, jb, x, b_epochs)}
    else:  # unaligned: kafka and ZooKeeper commit times per epoch still say what a commit costs
        for name, run, epochs in (("A", a, None), ("B", b, measured)):
            ks = [k for k in (epochs or run.profile.epochs) if k in run.profile.epochs]
            ps = [run.profile.epochs[k] for k in ks if "zk_done" in run.profile.epochs[k]]
            profile[name] = {
                "consume": [1000 * p.get("consume_s", 0.0) for p in ps],
                "consume calls": [p.get("consume_calls", 0) for p in ps],
                "flush": [1000 * (p["kafka_start"] - p["drained"]) for p in ps],
                "kafka commit": [1000 * (p["kafka_done"] - p["kafka_start"]) for p in ps],
                "zk commit": [1000 * (p["zk_done"] - p["kafka_done"]) for p in ps],
            }

    aligning = (", align " + ", ".join(f"{k} {v:.1f}s" for k, v in align_s.items())) if align_s else ""
    console.print(f"  {mode}: {len(measured)} Y epochs, {len(latency):,} records, median "
                  f"{statistics.median(latency):.0f} ms, p95 {pct(latency, 0.95):.0f} ms (run {run_s:.1f}s{aligning})")
    return {"mode": mode, "tag": tag, "y_epochs": measured, "records": len(latency), "latency_ms": latency,
            "hops_ms": {"gen": gen_hop, "A": a_hop, "B": b_hop}, "per_epoch": per_epoch,
            "profile_ms": profile, "align_seconds": align_s, "run_seconds": run_s, "sent": gen.sent}


# ---- main --------------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], list[float]]) -> list[float]:
    return [v for r in runs for v in key(r)]


def field(*path: str) -> Callable[[dict[str, Any]], list[float]]:
    """The values a run's result holds at ``path`` (``summarize``'s key)."""
    def get(run: dict[str, Any]) -> list[float]:
        value: Any = run
        for name in path:
            value = value[name]
        return list(value)
    return get


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.5, help="checkpoint interval of every job and the generator")
    ap.add_argument("--epochs", type=int, default=25, help="measured Y epochs per run (>= 20)")
    ap.add_argument("--rounds", type=int, default=2, help="runs per mode, interleaved")
    ap.add_argument("--rate", type=float, default=1000, help="generator records/s")
    ap.add_argument("--warmup", type=int, default=3, help="Y epochs before measuring (or aligning)")
    ap.add_argument("--skip", type=int, default=1, help="first fully aligned Y epochs not counted")
    ap.add_argument("--seed", type=int, default=3, help="start phases of the jobs")
    ap.add_argument("--consume-timeout-ms", type=float, default=None,
                    help="what-if: cap the source's Consumer.consume timeout (default: the library's own)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    console = Console(width=130)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    iv_ms = 1000 * args.interval

    runs: dict[str, list[dict[str, Any]]] = {"exactly_once": [], "aligned": []}
    with EmbeddedStack() as info:
        cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
        led = Ledger.connect(info.zk, "/bench-latency")
        for r in range(args.rounds):
            order = ["exactly_once", "aligned"] if r % 2 == 0 else ["aligned", "exactly_once"]
            console.print(f"round {r + 1}/{args.rounds}")
            for mode in order:
                runs[mode].append(run_chain(info, "/bench-latency", led, mode, f"{mode[:2]}{r}", args, console, rng))
        foreign = cpu.cores()
        led.close()
        gc.collect()  # librdkafka clients (admin clients of offset look-ups) go before the broker does

    lat = {m: summarize(rs, lambda r: r["latency_ms"]) for m, rs in runs.items()}
    med = {m: statistics.median(v) for m, v in lat.items()}
    p95 = {m: pct(v, 0.95) for m, v in lat.items()}
    added = med["aligned"] - med["exactly_once"]
    added_frac = added / iv_ms
    per_round_added = [statistics.median(a["latency_ms"]) - statistics.median(e["latency_ms"])
                       for a, e in zip(runs["aligned"], runs["exactly_once"], strict=True)]
    hops = {m: {h: statistics.median(summarize(rs, field("hops_ms", h))) for h in ("gen", "A", "B")}
            for m, rs in runs.items()}

    table = Table(title=f"End-to-end latency raw -> A -> X -> B -> Y, interval {iv_ms:.0f} ms for every job and "
                        f"the generator, {args.rate:.0f} records/s, {args.rounds} run(s) x {args.epochs} Y epochs "
                        f"per mode")
    table.add_column("mode")
    table.add_column("records", justify="right")
    table.add_column("median ms", justify="right")
    table.add_column("p95 ms", justify="right")
    table.add_column("median / interval", justify="right")
    table.add_column("creation -> raw commit", justify="right")
    table.add_column("raw -> X (job A)", justify="right")
    table.add_column("X -> Y (job B)", justify="right")
    table.add_column("per-run medians ms", justify="right")
    for m in ("exactly_once", "aligned"):
        table.add_row(m, f"{len(lat[m]):,}", f"{med[m]:.0f}", f"{p95[m]:.0f}", f"{med[m] / iv_ms:.2f}",
                      f"{hops[m]['gen']:.0f}", f"{hops[m]['A']:.0f}", f"{hops[m]['B']:.0f}",
                      ", ".join(f"{statistics.median(r['latency_ms']):.0f}" for r in runs[m]))
    console.print(table)

    prof_table = Table(title="Aligned job epochs: where a hop goes (median ms per epoch; upstream commit -> own "
                             "ZooKeeper commit)")
    prof_table.add_column("job")
    steps = list(STEPS)
    for s in steps:
        prof_table.add_column(s, justify="right")
    aligned_profile: dict[str, dict[str, float]] = {}
    for job in ("A", "B"):
        vals = {s: summarize(runs["aligned"], field("profile_ms", job, s)) for s in steps}
        aligned_profile[job] = {s: statistics.median(v) if v else float("nan") for s, v in vals.items()}
        prof_table.add_row(job, *(f"{aligned_profile[job][s]:.1f}" for s in steps))
    console.print(prof_table)
    console.print("  busy: the worker was still in its previous step when the upstream epoch committed; watch: "
                  "upstream commit timestamp -> ZooKeeper watch fired (includes the upstream's commit round trip); "
                  "fix epoch: ZooKeeper reads and the create that fix the covered subject epochs; consume: time "
                  "blocked in Consumer.consume; load+process: loading the epoch's slices from ZooKeeper, assign, "
                  "position, the job function and sink.send; flush: releasing held records, flushing, awaiting "
                  "the epoch node; then the Kafka transaction commit and the ZooKeeper commit multi-op")

    ok = added_frac <= TARGET
    console.print(f"aligned - exactly-once = {added:+.0f} ms = {100 * added_frac:+.1f}% of the interval "
                  f"(target <= {100 * TARGET:.0f}%): {'PASS' if ok else 'FAIL'}; per round "
                  f"{', '.join(f'{v:+.0f} ms' for v in per_round_added)}")
    console.print(f"other processes kept {foreign:.2f} of {os.cpu_count()} cores busy during the run"
                  + (" [red](numbers are noisy: rerun on a quiet machine)[/red]" if foreign > 0.3 else ""))

    out = write_results("bench_latency", {
        "benchmark": "bench_latency", "interval_s": args.interval, "rate": args.rate, "rounds": args.rounds,
        "epochs_per_run": args.epochs, "partitions": PARTITIONS, "seed": args.seed,
        "consume_timeout_ms_override": args.consume_timeout_ms,
        "median_ms": med, "p95_ms": p95, "added_ms": added, "added_fraction_of_interval": added_frac,
        "added_ms_per_round": per_round_added, "target_fraction": TARGET, "pass": ok,
        "hop_median_ms": hops, "aligned_profile_median_ms": aligned_profile, "foreign_cpu_cores": foreign,
        "runs": {m: [{k: v for k, v in r.items() if k not in ("latency_ms", "hops_ms")} |
                     {"median_ms": statistics.median(r["latency_ms"]), "p95_ms": pct(r["latency_ms"], 0.95)}
                     for r in rs] for m, rs in runs.items()},
    })
    console.print(f"wrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    main()
