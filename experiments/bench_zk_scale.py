"""ZooKeeper under many committing producers: what one ensemble holds (issue 21, "how cost grows").

``--producers`` producers (default 100: 10 subjects of 10 private partitions each, one producer per
partition) commit epochs through the ledger at ``--rate`` epochs per second each (default 10), spread
over ``--processes`` worker processes (threads in each, one ZooKeeper session per producer, as
separate jobs would have). Only ZooKeeper is exercised: each epoch is the sink's two round trips
(``ensure_epoch``, then the commit multi-op with the producer's ranges) without a Kafka transaction,
as the epoch marker commits. Measured for ``--seconds``:

- epochs per second achieved against the target, round trips per commit, commit latency (both round
  trips) median / p95 / p99, and ZooKeeper's CPU (cores, and CPU ms per commit);
- the baseline, run the same way in the same stack: the same number of raw kazoo clients at the same
  rate, each epoch a ``create`` and then a two-op multi (``create`` + ``set_data``) of about the same
  bytes: the least ZooKeeper work that records an epoch and moves a producer's offsets;
- the pipelined sink's shape (``--pipelined``, session 28): each commit multi-op also makes the next
  epoch's node (``ledger.commits.commit_epoch_async`` with the writers document), so an epoch is one round trip;
  waited for here, as only ZooKeeper's side is measured. It applies to a subject's only writer, so each
  producer has a subject of its own. Its baseline: raw clients whose epoch is one three-op multi (the
  next epoch's ``create``, this one's child ``create``, ``set_data``).

The ratio is ZooKeeper CPU per ledger commit over CPU per raw epoch. The capacity line extrapolates
the ZooKeeper CPU per commit to the commits per second one core of ZooKeeper serves.

    python -m experiments.bench_zk_scale [--producers 100] [--rate 10] [--seconds 30] [--processes 4] [--pipelined]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import statistics
import threading
import time
from typing import Any

from kazoo.client import KazooClient
from rich.console import Console
from rich.table import Table

from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Contribution, Ledger
from aligner.models import Range, SubjectNode, WritersNode
from experiments import ForeignCpu, cpu_seconds
from experiments.common import write_results

ROOT = "/bench-zk-scale"
PER_SUBJECT = 10
RECORDS = 1000
"""Offsets each producer's range advances per epoch (the ranges' size; nothing is read)."""


def _ledger_producer(zk: str, subject: str, partition: int, rate: float, window: tuple[float, float],
                     out: Any, pipelined: bool = False) -> None:
    """One producer: claim a partition, then commit an epoch every 1/rate s; commits started within ``window``
    (monotonic seconds) are counted. ``pipelined``: the pipelined sink's requests (the next epoch's node in
    the commit multi-op), each waited for."""
    led = Ledger.connect(zk, ROOT)
    try:
        lease = led.claims.claim(subject, "bench", str(partition), [partition], lambda: {partition: 0})
        writers: dict[str, tuple[WritersNode, int]] = {}
        made = False
        """Whether the last commit made this epoch's node (pipelined, as the only writer of its subject)."""
        latencies: list[float] = []
        due = time.monotonic()
        trips = 0
        while time.monotonic() < window[1]:
            counted = time.monotonic() >= window[0]
            trips0 = led.round_trips
            epoch = lease.next_epoch
            start = lease.node.next_offsets[partition]
            ranges = {partition: Range(start=start, end=start + RECORDS)}
            t0 = time.perf_counter()
            if not made:
                writers[subject] = led.commits.ensure_epoch(subject, epoch, writers.get(subject))
            if pipelined:
                pending = led.commits.commit_epoch_async(epoch, [Contribution(lease, None, ranges)], (), writers)
                leases, ahead = led.commits.epoch_committed(pending)
                lease, made = leases[0], subject in ahead
                writers.update(ahead)
            else:
                lease = led.commits.commit(lease, epoch, None, ranges)
            if counted:
                latencies.append(time.perf_counter() - t0)
                trips += led.round_trips - trips0
            due += 1.0 / rate
            time.sleep(max(0.0, due - time.monotonic()))
        out.put({"commits": len(latencies), "trips": trips, "latencies": latencies})
    finally:
        led.close()


def _raw_producer(zk: str, index: int, rate: float, window: tuple[float, float], out: Any,
                  pipelined: bool = False) -> None:
    """The baseline: one kazoo client, each epoch a create and a two-op multi, at the same rate; ``pipelined``:
    one three-op multi (the next epoch's create in it)."""
    client = KazooClient(hosts=zk)
    client.start(30)
    try:
        base = f"{ROOT}-raw{'-pipelined' if pipelined else ''}/p{index}"
        client.ensure_path(f"{base}/epochs")
        client.ensure_path(f"{base}/offsets")
        payload = b'{"writers":{"bench/0":{}},"attempt":null,"ranges":{"0":{"start":0,"end":1000}}}'
        latencies: list[float] = []
        due = time.monotonic()
        epoch = 0
        if pipelined:
            client.create(f"{base}/epochs/{epoch:010d}", payload)
        while time.monotonic() < window[1]:
            counted = time.monotonic() >= window[0]
            t0 = time.perf_counter()
            if not pipelined:
                client.create(f"{base}/epochs/{epoch:010d}", payload)
            tx = client.transaction()
            if pipelined:
                tx.create(f"{base}/epochs/{epoch + 1:010d}", payload)
            tx.create(f"{base}/epochs/{epoch:010d}/c", payload)
            tx.set_data(f"{base}/offsets", payload)
            tx.commit()
            if counted:
                latencies.append(time.perf_counter() - t0)
            epoch += 1
            due += 1.0 / rate
            time.sleep(max(0.0, due - time.monotonic()))
        out.put({"commits": len(latencies), "trips": (1 if pipelined else 2) * len(latencies), "latencies": latencies})
    finally:
        client.stop()
        client.close()


def _process(kind: str, zk: str, jobs: list[tuple[str, int, int]], rate: float, window: tuple[float, float],
             out: Any) -> None:
    """One worker process: a thread per producer."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    threads = []
    pipelined = kind.endswith("pipelined")
    for subject, partition, index in jobs:
        if kind.startswith("ledger"):
            t = threading.Thread(target=_ledger_producer, args=(zk, subject, partition, rate, window, out, pipelined))
        else:
            t = threading.Thread(target=_raw_producer, args=(zk, index, rate, window, out, pipelined))
        threads.append(t)
        t.start()
    for t in threads:
        t.join()


def run(kind: str, zk: str, zk_pid: int, producers: int, rate: float, seconds: float,
        processes: int) -> dict[str, Any]:
    # The pipelined shape applies to a subject's only writer: there, one subject per producer.
    per_subject, prefix = (1, "q") if kind.endswith("pipelined") else (PER_SUBJECT, "s")
    subjects = (producers + per_subject - 1) // per_subject
    jobs = [(f"{prefix}{i // per_subject}", i % per_subject, i) for i in range(producers)]
    out: Any = mp.get_context("spawn").Queue()
    start = time.monotonic() + 10.0  # the processes start, connect and claim first
    window = (start, start + seconds)
    procs = [mp.get_context("spawn").Process(target=_process, args=(kind, zk, jobs[w::processes], rate, window, out))
             for w in range(processes)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start - time.monotonic()))
    z0 = cpu_seconds(zk_pid)
    time.sleep(max(0.0, window[1] - time.monotonic()))
    zk_cores = (cpu_seconds(zk_pid) - z0) / seconds
    results = [out.get(timeout=120) for _ in range(producers)]
    for p in procs:
        p.join(30)
    latencies = sorted(x for r in results for x in r["latencies"])
    commits = sum(r["commits"] for r in results)
    q = statistics.quantiles(latencies, n=100)
    return {"kind": kind, "subjects": subjects, "producers": producers, "commits": commits,
            "epochs_per_s": commits / seconds, "target_per_s": producers * rate,
            "trips_per_commit": sum(r["trips"] for r in results) / commits,
            "latency_ms": {"p50": 1000 * q[49], "p95": 1000 * q[94], "p99": 1000 * q[98]},
            "zk_cores": zk_cores}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, default=100)
    ap.add_argument("--rate", type=float, default=10.0, help="epochs per second per producer")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--pipelined", action="store_true",
                    help="also the pipelined sink's shape (one round trip per epoch) and its raw baseline")
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    console = Console(width=120)
    with EmbeddedStack() as info:
        led = Ledger.connect(info.zk, ROOT)
        for i in range((args.producers + PER_SUBJECT - 1) // PER_SUBJECT):
            led.subjects.register_subject(SubjectNode(name=f"s{i}", topic=f"s{i}", partitions=PER_SUBJECT))
        for i in range(args.producers if args.pipelined else 0):
            led.subjects.register_subject(SubjectNode(name=f"q{i}", topic=f"q{i}", partitions=1))
        cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
        kinds = ("raw", "ledger", *(("raw, pipelined", "ledger, pipelined") if args.pipelined else ()))
        rows = [run(kind, info.zk, info.zk_pid, args.producers, args.rate, args.seconds, args.processes)
                for kind in kinds]
        foreign = cpu.cores()
        led.close()
    raw, ours = rows[:2]
    per_commit = {r["kind"]: 1000 * r["zk_cores"] / max(1e-9, r["epochs_per_s"]) for r in rows}
    table = Table(title=f"{args.producers} producers x {args.rate:g} epochs/s, {args.seconds:g} s, "
                        f"{args.processes} processes (ZooKeeper only)")
    for col in ("", "epochs/s (target)", "round trips / commit", "latency p50 / p95 / p99 ms",
                "ZooKeeper cores", "ZooKeeper CPU ms / commit"):
        table.add_column(col, justify="right")
    for r in rows:
        lat = r["latency_ms"]
        table.add_row(r["kind"], f"{r['epochs_per_s']:,.0f} ({r['target_per_s']:,.0f})", f"{r['trips_per_commit']:.2f}",
                      f"{lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f}", f"{r['zk_cores']:.2f}",
                      f"{per_commit[r['kind']]:.3f}")
    console.print(table)
    def capacity(label: str, raw_ms: float, ledger_ms: float) -> dict[str, float]:
        """ZooKeeper CPU per epoch, raw / ledger, and the commits one ZooKeeper core serves at the ledger's cost."""
        out = {"raw_over_ledger": raw_ms / ledger_ms if ledger_ms else float("nan"),
               "commits_per_zk_core": 1000 / ledger_ms if ledger_ms else float("nan")}
        console.print(f"{label}raw / ledger = {out['raw_over_ledger']:.2f}; at this cost one ZooKeeper core serves "
                      f"~{out['commits_per_zk_core']:,.0f} commits/s "
                      f"(~{out['commits_per_zk_core'] / args.rate:,.0f} producers at {args.rate:g} epochs/s)")
        return out

    two_trips = capacity("ZooKeeper CPU per epoch, ", per_commit["raw"], per_commit["ledger"])
    pipelined = capacity("pipelined: ", per_commit["raw, pipelined"], per_commit["ledger, pipelined"]) \
        if args.pipelined else {}
    console.print(f"processes other than this one and the stack, this benchmark's producer processes among them, "
                  f"kept {foreign:.2f} of 2 cores busy")
    write_results("bench_zk_scale", {"args": vars(args), "rows": rows, "zk_cpu_ms_per_commit": per_commit,
                                     **two_trips, "foreign_cores": foreign, "raw_epochs_per_s": raw["epochs_per_s"],
                                     "ledger_epochs_per_s": ours["epochs_per_s"], "pipelined": pipelined})


if __name__ == "__main__":
    main()
