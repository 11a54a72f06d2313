"""Throughput with 1 and 2 workers (issue 21, item 8): does an aligned job scale as the raw loop does?

Set-up: subject ``in`` (4 partitions) and two aligned jobs reading it, each with the identity transform and an
output subject of its own (4 partitions): ``pipe-w1`` with one worker and ``pipe-w2`` with two, worker ``i`` on
partitions ``i, i + W, ...``. Every worker runs in a process of its own: threads of one process would share the
GIL and show no scaling. Each job is aligned on ``in`` as ``bench_pipeline`` aligns its worker (its processes are
stepped together while tiny epochs keep coming, the coordinator aligns the job, they drain), so the measured
phases start with aligned, idle workers that have read everything written.

Each round pre-writes ``--records`` 100-byte records into ``in`` in subject epochs of 10,000 (not timed), then
runs, in alternating order, over those same records:

- **aligned job, W=1 / W=2**: every worker process steps one job epoch per subject epoch (``JobWorker.step``:
  aligned source, identity, stamped sink, one ZooKeeper multi-op per epoch) until it consumed the round's last
  epoch;
- **raw loop, P=1 / P=2**: ``bench_pipeline``'s raw loop (read_committed consumer -> transactional producer, one
  transaction per 10,000 records) in one process over the 4 partitions, or in two on 2 partitions each (as the
  workers split them).

Every process is started before the rounds, idles between runs and gets each run as a line on stdin; it answers
with the ``perf_counter`` time (CLOCK_MONOTONIC: one clock for all processes) its first record reached the job
function or the raw loop, and the time its last output was committed (aligned: the last step returned, after its
ZooKeeper commit; raw: ``raw_run`` returned, after its last Kafka commit and closing its consumer). Throughput is
records / (latest end - earliest first record), the median over rounds. Closing a process's stdin ends it (it is
killed after 30 s), on every path. On 2 cores ZooKeeper and the broker share the CPU with the workers, so two
workers cannot reach twice one: the raw loop's scaling in the same run is the yardstick.

``work`` in the results, per pipeline summed over the rounds and its processes: the records and value bytes read
back from its output after each run (not timed) and the Kafka transactions that carried records (the raw loop's
commits, the workers' sink epochs). Two workers commit one transaction each per epoch where one raw process of
two commits per 10,000 of its records, so records and bytes are compared, not transactions.

    .venv/bin/python -m experiments.bench_workers [--records 300000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from aligner.connectors.kafka import QUIET, ensure_topic
from aligner.connectors.runtime import JobSpec, JobWorker, settle_heap
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.errors import StoppedError
from aligner.ledger import Ledger
from experiments import ForeignCpu
from experiments.bench_pipeline import (
    EPOCH,
    PARTITIONS,
    VALUE,
    FirstRecord,
    align_worker,
    identity,
    raw_run,
    write_epochs,
)
from experiments.common import PRODUCER_SETTINGS, Work, read_back, topic_ends, work_results, write_results

ROOT = "/bench-workers"
REPO = Path(__file__).resolve().parent.parent
INPUT = "in"
RAW_OUT = "raw-out"
PARALLELISM = (1, 2)
Role = Literal["aligned", "raw"]
RUNS: dict[str, tuple[Role, int]] = {f"{role} {'job, W' if role == 'aligned' else 'loop, P'}={n}": (role, n)
                                     for role in ("aligned", "raw") for n in PARALLELISM}
"""The four measured pipelines: (kind, processes)."""


def job_spec(workers: int) -> JobSpec:
    """The aligned job with ``workers`` workers: identity from ``in`` to its own output subject."""
    return JobSpec(job=f"pipe-w{workers}", inputs=(INPUT,), output=f"out-w{workers}", parallelism=workers,
                   interval=0.05)


def partitions_of(index: int, processes: int) -> list[int]:
    """The input partitions of process ``index`` of ``processes`` (as the runtime assigns a worker's)."""
    return list(range(index, PARTITIONS, processes))


# ---- the child processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildConfig:
    role: Role
    processes: int
    index: int
    zk: str
    kafka: str

    @property
    def name(self) -> str:
        return f"{self.role}-{self.processes}-{self.index}"


def say(reply: dict[str, Any]) -> None:
    print(json.dumps(reply), flush=True)


def read_commands(commands: queue.Queue[str | None], stop: threading.Event) -> None:
    """stdin's lines into ``commands``; at its end (the parent closed it or died) ``stop`` is set."""
    for line in sys.stdin:
        commands.put(line.strip())
    stop.set()
    commands.put(None)


def serve_aligned(config: ChildConfig, commands: queue.Queue[str | None], stop: threading.Event) -> None:
    """One worker of the job: ``step`` runs one job epoch, ``run E`` steps until subject epoch E is consumed."""
    led = Ledger.connect(config.zk, ROOT, stop=stop)
    try:
        worker = JobWorker(led, config.kafka, job_spec(config.processes), config.index, identity).open()
        try:
            settle_heap()  # as `aligner-worker` does once its worker is open
            first = FirstRecord()
            source = worker.io.source
            assert source is not None
            say({"ready": os.getpid()})
            while (command := commands.get()) is not None:
                if command == "step":
                    worker.step(stop)
                    say({"aligned": worker.sources.aligned, "consumed": source.consumed(INPUT)})
                    continue
                until = int(command.split()[1])
                first.reset()
                first.install(worker, identity)  # the wrapper steps aside after the first record: again per run
                out0 = worker.records_out
                assert worker.io.sink is not None
                e0 = worker.io.sink.next_epoch
                while source.consumed(INPUT) < until:
                    worker.step(stop)
                say({"records": worker.records_out - out0, "first": first.at, "end": time.perf_counter(),
                     "consumed": source.consumed(INPUT), "transactions": worker.io.sink.next_epoch - e0})
        finally:
            worker.close()
    finally:
        led.close()


def serve_raw(config: ChildConfig, commands: queue.Queue[str | None]) -> None:
    """The raw loop over this process's partitions: ``raw {"starts": .., "ends": ..}`` runs it once."""
    kp = Producer({"bootstrap.servers": config.kafka, "transactional.id": f"bench.workers.{config.name}",
                   **PRODUCER_SETTINGS, **QUIET})
    kp.init_transactions(30)
    say({"ready": os.getpid()})
    while (command := commands.get()) is not None:
        span = json.loads(command.split(maxsplit=1)[1])
        starts, ends = ({int(p): o for p, o in span[k].items()} for k in ("starts", "ends"))
        res = raw_run(config.kafka, INPUT, RAW_OUT, kp, starts, ends)
        end = time.perf_counter()
        say({"records": res["records"], "first": end - res["seconds"], "end": end,
             "transactions": res["transactions"]})
    kp.flush(10)


def child(config: ChildConfig) -> None:
    """A child process's life: commands from stdin until it ends, replies on stdout."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    commands: queue.Queue[str | None] = queue.Queue()
    stop = threading.Event()
    reader = threading.Thread(target=read_commands, args=(commands, stop), daemon=True, name="commands")
    reader.start()
    if config.role == "aligned":
        with contextlib.suppress(StoppedError):  # stdin ended inside a step: the parent stops us
            serve_aligned(config, commands, stop)
    else:
        serve_raw(config, commands)


class Child:
    """This module in a process of its own (``--child``): commands as lines on its stdin, one JSON reply a line on
    its stdout, its stderr in a log file. Closing its stdin ends it cleanly; it is killed if that takes 30 s."""

    def __init__(self, config: ChildConfig, logs: Path) -> None:
        self.config = config
        self.log = logs / f"{config.name}.log"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "experiments.bench_workers",
                                          "--child", json.dumps(asdict(config))],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pump = threading.Thread(target=self._pump, daemon=True, name=f"{config.name}-replies")
        self.pump.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.replies.put(json.loads(line))
        self.replies.put(None)

    def _failed(self, what: str) -> RuntimeError:
        tail = self.log.read_text().strip().splitlines()[-5:] or ["no output"]
        return RuntimeError(f"{self.config.name} {what} (exit code {self.proc.poll()}): " + " | ".join(tail))

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError:
            raise self._failed("is gone") from None

    def reply(self, timeout: float, stop: threading.Event | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            if stop is not None and stop.is_set():
                raise StoppedError(f"{self.config.name}: stopped waiting for a reply")
            if time.monotonic() > deadline:
                raise self._failed(f"did not answer within {timeout:.0f}s")
            try:
                got = self.replies.get(timeout=0.5)
            except queue.Empty:
                continue
            if got is None:
                raise self._failed("exited")
            return got

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.pump.join(10)


class Workers:
    """A job's worker processes, stepped so that ``bench_pipeline.align_worker`` aligns them as it aligns one
    in-process JobWorker (it uses ``spec``, ``step``, ``sources.aligned`` and ``io.source.consumed`` only). A step
    steps the workers that consumed the least: one that ended its last unaligned epoch earlier joins the aligned job
    epochs one step later, and stepping the others with it would leave them waiting for an epoch no one writes."""

    def __init__(self, spec: JobSpec, children: list[Child]) -> None:
        self.spec = spec
        self.children = children
        self.io = self.sources = self.source = self  # the parts align_worker reads, as a JobWorker's
        self.states = [{"aligned": False, "consumed": -1} for _ in children]

    @property
    def aligned(self) -> bool:
        return all(s["aligned"] for s in self.states)

    def consumed(self, _subject: str) -> int:
        return min(int(s["consumed"]) for s in self.states)

    def step(self, stop: threading.Event) -> bool:
        behind = [i for i, s in enumerate(self.states) if s["consumed"] == self.consumed(INPUT)]
        for i in behind:
            self.children[i].send("step")
        for i in behind:
            self.states[i] = self.children[i].reply(300, stop)
        return True


def timed(name: str, children: list[Child], commands: list[str], records: int) -> dict[str, Any]:
    """One measured run of ``records`` records: every child gets its command at once; the run lasts from the
    earliest first record to the latest end."""
    for c, command in zip(children, commands, strict=True):
        c.send(command)
    replies = [c.reply(1800) for c in children]
    moved = sum(r["records"] for r in replies)
    if moved != records or any(r["first"] is None for r in replies):
        raise RuntimeError(f"{name} moved {moved} records, expected {records}: {replies}")
    first, end = min(r["first"] for r in replies), max(r["end"] for r in replies)
    return {"records": moved, "seconds": end - first, "transactions": sum(r["transactions"] for r in replies),
            "processes": [{"records": r["records"], "seconds": r["end"] - r["first"],
                           "starts_after": r["first"] - first} for r in replies]}


def per_s(run: dict[str, Any]) -> float:
    return float(run["records"] / run["seconds"])


# ---- main ----------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, console: Console, logs: Path) -> dict[str, Any]:
    """Start every process, align the jobs, run the rounds; the processes end before the stack does."""
    epochs = args.records // EPOCH
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNS}
    work = {name: Work() for name in RUNS}
    children: list[Child] = []
    with EmbeddedStack() as info:
        led = Ledger.connect(info.zk, ROOT)
        try:
            create_subject(led, info.kafka, INPUT, PARTITIONS)
            for w in PARALLELISM:
                create_subject(led, info.kafka, job_spec(w).output, PARTITIONS)
            ensure_topic(info.kafka, RAW_OUT, PARTITIONS)
            procs: dict[str, list[Child]] = {}
            for name, (role, n) in RUNS.items():
                procs[name] = []
                for i in range(n):
                    procs[name].append(Child(ChildConfig(role, n, i, info.zk, info.kafka), logs))
                    children.append(procs[name][-1])
            for c in children:
                c.reply(300)  # ready
            with SinkProducer(led, info.kafka, INPUT, "gen", 0, list(range(PARTITIONS))) as sink:
                write_epochs(sink, 3, 8)
                align_s: dict[str, float] = {}
                jobs = {name: Workers(job_spec(n), procs[name])
                        for name, (role, n) in RUNS.items() if role == "aligned"}
                for name, workers in jobs.items():  # duck-typed: see Workers
                    align_s[name] = align_worker(led, sink, cast(JobWorker, workers), console)
                    if not workers.aligned:
                        raise RuntimeError(f"{name}: the workers are not aligned")
                last = sink.lease.node.committed_epoch or 0
                never = threading.Event()
                for workers in jobs.values():  # the tiny epochs written while the other job was aligned
                    while workers.consumed(INPUT) < last:
                        workers.step(never)
                cpu = ForeignCpu(info.zk_pid, info.kafka_pid, *(c.proc.pid for c in children))
                for r in range(args.rounds):
                    e0, e1 = write_epochs(sink, epochs, EPOCH)
                    starts = {p: sl.start for p, sl in led.epochs.committed(INPUT, e0).slices.items()}
                    ends = {p: sl.end for p, sl in led.epochs.committed(INPUT, e1).slices.items()}
                    gc.collect()
                    order = list(RUNS)
                    order = order[r % len(order):] + order[:r % len(order)]  # each goes first in turn
                    for name in order:
                        role, n = RUNS[name]
                        written = led.subjects.subject(job_spec(n).output).topic if role == "aligned" else RAW_OUT
                        since = topic_ends(info.kafka, written, PARTITIONS)
                        if role == "aligned":
                            commands = [f"run {e1}"] * n
                        else:
                            commands = ["raw " + json.dumps({"starts": {p: starts[p] for p in partitions_of(i, n)},
                                                             "ends": {p: ends[p] for p in partitions_of(i, n)}})
                                        for i in range(n)]
                        results[name].append(timed(name, procs[name], commands, args.records))
                        work[name].add(read_back(info.kafka, written, since, results[name][-1]["transactions"]))
                    rates = ", ".join(f"{n} {per_s(v[-1]):,.0f}/s" for n, v in results.items())
                    console.print(f"round {r + 1}/{args.rounds}: {rates}")
                foreign = cpu.cores()
        finally:
            for c in children:
                c.close()
            led.close()
    return {"runs": results, "align_seconds": align_s, "foreign_cpu_cores": foreign,
            **work_results(work, ("records", "bytes"))}


def report(args: argparse.Namespace, console: Console, measured: dict[str, Any]) -> None:
    results: dict[str, list[dict[str, Any]]] = measured["runs"]
    rate = {n: statistics.median(map(per_s, v)) for n, v in results.items()}
    by = {RUNS[n]: rate[n] for n in RUNS}
    ratio = {n: by["aligned", n] / by["raw", n] for n in PARALLELISM}
    scaling = {role: by[role, 2] / by[role, 1] for role in ("aligned", "raw")}
    table = Table(title=f"Consume -> identity -> produce in 1 and 2 processes, {args.records:,} records x "
                        f"{args.rounds} rounds (100 B values, {PARTITIONS} partitions, epochs of {EPOCH:,})")
    for i, column in enumerate(("pipeline", "records/s (median)", "min .. max", "aligned/raw, same parallelism",
                                "2 processes / 1")):
        table.add_column(column, justify="left" if i == 0 else "right")
    for name, runs in results.items():
        role, n = RUNS[name]
        rates = list(map(per_s, runs))
        table.add_row(name, f"{rate[name]:,.0f}", f"{min(rates):,.0f} .. {max(rates):,.0f}",
                      f"{ratio[n]:.2f}" if role == "aligned" else "",
                      f"{scaling[role]:.2f}" if n == 2 else "")
    console.print(table)
    foreign = measured["foreign_cpu_cores"]
    noisy = " [red](numbers are noisy: rerun on a quiet machine)[/red]" if foreign > 0.3 else ""
    console.print(f"scaling 1 -> 2 processes: aligned {scaling['aligned']:.2f}, raw {scaling['raw']:.2f} "
                  f"(aligned's share of raw's scaling {scaling['aligned'] / scaling['raw']:.2f}); other processes "
                  f"kept {foreign:.2f} of {os.cpu_count()} cores busy during the rounds{noisy}")
    doc: dict[str, Any] = {
        "benchmark": "bench_workers", "workers_aligned": True, "records_per_s_median": rate,
        "ratio_aligned_vs_raw": {str(n): ratio[n] for n in PARALLELISM}, "scaling_2_vs_1": scaling,
        "records_per_round": args.records, "rounds": args.rounds, "epoch_records": EPOCH, "partitions": PARTITIONS,
        "value_bytes": len(VALUE), "producer_settings": PRODUCER_SETTINGS, "cpu_count": os.cpu_count(), **measured,
    }
    out = write_results("bench_workers", doc)
    console.print(f"wrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000, help="records per round (a multiple of 10,000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a worker or raw-loop process started by this module
    args = ap.parse_args()
    if args.child is not None:
        child(ChildConfig(**json.loads(args.child)))
        return
    console = Console(width=120)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as logs:
        measured = measure(args, console, Path(logs))
    report(args, console, measured)


if __name__ == "__main__":
    main()
