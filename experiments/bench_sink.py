"""Sink throughput: SinkProducer (epochs of 10,000 records) vs a raw confluent-kafka transactional loop.

Both write 100-byte values round-robin into a 4-partition topic from one producer that owns all four
partitions, with one Kafka transaction per 10,000 records and the same Producer settings. Runs are
interleaved on one embedded stack, each round starting one writer later than the round before (on
a shared 2-core machine a fixed order ties a writer to its place in the round), and the median is
reported, with the median of each writer's per-round ratio to its round's raw + stamp loop and a bootstrap
95 % interval of it. Fifteen rounds by default: on two shared cores the same code's ratio of medians spread
0.80-1.09 over five-round runs, 0.95-1.04 over fifteen-round ones.

Every raw loop calls ``produce`` positionally, as the sink does. The two diagnostic rows are raw loops that
add, one at a time, what the sink adds per record: the stamp header, then a Python delivery callback. They
attribute the gap between raw and sink; the wall time the sink spends in its two ZooKeeper round trips per epoch is
measured too. The sink runs
four ways: ``send`` per record with each commit waited for; the same with pipelined commits
(``commit(wait=False)``: the ZooKeeper commit rides beside the next epoch's sends); and ``send_many``, one call per
epoch, with each commit waited for and pipelined.

ZooKeeper is warmed first (``--warm-epochs`` one-record pipelined epochs of a subject of their own):
in a JVM started seconds before, a commit costs the server several times the CPU it costs once the
JIT has compiled its request path, as it has in an ensemble that has run for a while, and on two
shared cores that CPU is taken from the broker and the writers. The ZooKeeper CPU each sink's epochs
cost during the rounds is printed, beside the warm-up's.

``--pin`` gives the writers (this process, its librdkafka threads included) core 0 and ZooKeeper and the
broker the other cores: the shape of a deployment, where they run on machines of their own, as far as
two cores allow. Every writer, raw or sink, runs pinned alike.

``work`` in the results, per writer summed over the rounds: the records and value bytes read back from its
topic after the rounds, and the Kafka transactions its loop committed; all three must agree across the writers.

    .venv/bin/python -m experiments.bench_sink [--rounds 15] [--records 200000] [--warm-epochs 10000] [--pin]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from aligner.connectors.kafka import QUIET, ensure_topic
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from aligner.stamps import HEADER, Stamp
from experiments import ForeignCpu, cpu_seconds, pin_threads
from experiments.common import (
    PRODUCER_SETTINGS,
    Headers,
    LedgerTimer,
    Work,
    median_interval,
    read_back,
    topic_ends,
    warm_zookeeper,
    work_results,
    write_results,
)

PARTITIONS = 4
EPOCH = 10_000
VALUE = b"x" * 100
TARGET = 0.8
STAMP_TARGET = 0.95
SINK_ZK_CALLS = ("ensure_epoch", "ensure_epoch_async", "epoch_ensured", "commit_epoch", "commit_epoch_async",
                 "epoch_committed")
"""The sink's ZooKeeper calls per epoch. Round trip 1 goes out in ``begin`` (``ensure_epoch_async``)
and is awaited in ``commit`` (``epoch_ensured``); a pipelined round trip 2 goes out after the Kafka
commit (``commit_epoch_async``) and is awaited by the next commit (``epoch_committed``). Timed is
what the sink spends blocked in them, not the overlapped waits."""


def raw_producer(bootstrap: str, topic: str) -> Producer:
    kp = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench.raw.{topic}",
                   **PRODUCER_SETTINGS, **QUIET})
    kp.init_transactions(30)
    return kp


def raw_run(kp: Producer, topic: str, records: int, headers: Headers | None = None,
            callback: bool = False, work: Work | None = None) -> float:
    """The baseline loop: one transaction per EPOCH records, optionally with the sink's per-record extras
    (``work`` counts its transactions)."""
    last: dict[int, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            p, o = msg.partition(), msg.offset()
            if o > last.get(p, -1):
                last[p] = o

    cb = delivered if callback else None
    produce = kp.produce
    t0 = time.perf_counter()
    for start in range(0, records, EPOCH):
        kp.begin_transaction()
        for i in range(start, min(start + EPOCH, records)):
            try:  # positional, as the sink's Lane.send calls it: keywords cost ~0.25-0.4 us a record
                produce(topic, VALUE, None, i % PARTITIONS, cb, None, 0, headers)
            except BufferError:
                kp.poll(0.05)
                produce(topic, VALUE, None, i % PARTITIONS, cb, None, 0, headers)
            if i % 2000 == 0:
                kp.poll(0)
        kp.flush(60)
        kp.commit_transaction(60)
        if work is not None:
            work.transactions += 1
    return time.perf_counter() - t0


def sink_run(p: SinkProducer, records: int, wait: bool = True, work: Work | None = None) -> float:
    """``send`` per record; ``wait=False`` pipelines the commits, as a loader that can write epochs again would
    (``work`` counts its epochs committed, one Kafka transaction each)."""
    t0 = time.perf_counter()
    for start in range(0, records, EPOCH):
        p.begin()
        for i in range(start, min(start + EPOCH, records)):
            p.send(VALUE, partition=i % PARTITIONS)
        p.commit(wait=wait)
        if work is not None:
            work.transactions += 1
    p.sync()
    return time.perf_counter() - t0


def sink_many_run(p: SinkProducer, records: int, wait: bool = True, work: Work | None = None) -> float:
    """The batch form (``send_many``, as a job's batch function's output is written): one call per epoch;
    ``wait=False`` pipelines the commits, as a loader writing batches would."""
    batch = [(None, VALUE)] * EPOCH
    t0 = time.perf_counter()
    for start in range(0, records, EPOCH):
        p.begin()
        p.send_many(batch[:min(EPOCH, records - start)])
        p.commit(wait=wait)
        if work is not None:
            work.transactions += 1
    p.sync()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--records", type=int, default=200_000, help="records per run (a multiple of 10,000)")
    ap.add_argument("--warm-epochs", type=int, default=10_000,
                    help="one-record epochs that warm ZooKeeper's JIT before the rounds (0: none)")
    ap.add_argument("--pin", action="store_true",
                    help="writers on core 0, ZooKeeper and the broker on the others (needs 2 cores or more)")
    args = ap.parse_args()
    if args.pin and (os.cpu_count() or 1) < 2:
        ap.error("--pin needs at least 2 cores")
    console = Console(width=120)
    stamp: Headers = [(HEADER, Stamp("sink", 123, 1).encode())]

    logging.getLogger("kazoo").setLevel(logging.ERROR)  # a first-connect retry is logged as a warning

    with EmbeddedStack() as info:
        cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
        if args.pin:
            rest = set(range(1, os.cpu_count() or 2))
            pin_threads(info.zk_pid, rest)
            pin_threads(info.kafka_pid, rest)
            pin_threads(os.getpid(), {0})
        led = Ledger.connect(info.zk, "/bench")
        # One subject per sink writer, as each raw loop has its own topic: every topic grows alike (on the
        # embedded broker a transaction's cost grows with its partitions' size, docs: The embedded stack).
        for subject in ("s", "s-pipelined", "s-many", "s-many-pipelined"):
            create_subject(led, info.kafka, subject, PARTITIONS)
        topics = {name: f"raw-{name}" for name in ("raw", "stamp", "stamp_cb")}
        producers: dict[str, Producer] = {}
        for name, topic in topics.items():
            ensure_topic(info.kafka, topic, PARTITIONS)
            producers[name] = raw_producer(info.kafka, topic)

        runs: dict[str, Callable[[], float]] = {}
        parts = list(range(PARTITIONS))
        with SinkProducer(led, info.kafka, "s", "sink", 0, parts) as sink, \
                SinkProducer(led, info.kafka, "s-pipelined", "sink", 0, parts) as pipelined, \
                SinkProducer(led, info.kafka, "s-many", "sink", 0, parts) as many, \
                SinkProducer(led, info.kafka, "s-many-pipelined", "sink", 0, parts) as many_pipelined:
            written = {"raw": topics["raw"], "raw + stamp header": topics["stamp"],
                       "raw + stamp + on_delivery": topics["stamp_cb"], "sink": led.subjects.subject("s").topic,
                       "sink, pipelined commits": led.subjects.subject("s-pipelined").topic,
                       "sink, send_many": led.subjects.subject("s-many").topic,
                       "sink, send_many, pipelined": led.subjects.subject("s-many-pipelined").topic}
            work = {name: Work() for name in written}
            runs = {
                "raw": lambda: raw_run(producers["raw"], topics["raw"], args.records, work=work["raw"]),
                "raw + stamp header": lambda: raw_run(producers["stamp"], topics["stamp"], args.records, stamp,
                                                      work=work["raw + stamp header"]),
                "raw + stamp + on_delivery": lambda: raw_run(
                    producers["stamp_cb"], topics["stamp_cb"], args.records, stamp, callback=True,
                    work=work["raw + stamp + on_delivery"]),
                "sink": lambda: sink_run(sink, args.records, work=work["sink"]),
                "sink, pipelined commits": lambda: sink_run(pipelined, args.records, wait=False,
                                                            work=work["sink, pipelined commits"]),
                "sink, send_many": lambda: sink_many_run(many, args.records, work=work["sink, send_many"]),
                "sink, send_many, pipelined": lambda: sink_many_run(many_pipelined, args.records, wait=False,
                                                                    work=work["sink, send_many, pipelined"]),
            }
            # warm-up: connections, metadata and the first ZooKeeper epoch are not what we measure
            for name in ("raw", "stamp", "stamp_cb"):
                raw_run(producers[name], topics[name], EPOCH)
            for p in (sink, pipelined, many, many_pipelined):
                sink_run(p, EPOCH)
            warm_seconds, warm_zk_ms = warm_zookeeper(led, info.kafka, info.zk_pid, args.warm_epochs, PARTITIONS)
            console.print(f"ZooKeeper warmed by {args.warm_epochs:,} one-record epochs in {warm_seconds:.1f} s "
                          f"({warm_zk_ms:.2f} ms of its CPU per epoch)")
            since = {name: topic_ends(info.kafka, topic, PARTITIONS) for name, topic in written.items()}
            zk = LedgerTimer(led.commits, SINK_ZK_CALLS)
            trips0 = led.round_trips
            times: dict[str, list[float]] = {name: [] for name in runs}
            zk_seconds: dict[str, float] = dict.fromkeys(runs, 0.0)
            zk_cpu: dict[str, float] = dict.fromkeys(runs, 0.0)
            for r in range(args.rounds):
                names = list(runs)
                for name in names[r % len(names):] + names[:r % len(names)]:
                    run = runs[name]
                    before, cpu0 = zk.seconds, cpu_seconds(info.zk_pid)
                    times[name].append(run())
                    zk_seconds[name] += zk.seconds - before
                    zk_cpu[name] += cpu_seconds(info.zk_pid) - cpu0
                console.print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{n} {args.records / t[-1]:,.0f}/s" for n, t in times.items()))
            zk_trips = led.round_trips - trips0
            foreign = cpu.cores()
            for name, topic in written.items():  # not timed: what each writer's rounds left in its topic
                work[name] = read_back(info.kafka, topic, since[name], work[name].transactions)
        while producers:  # destroy the raw producers before the broker goes away
            producers.popitem()[1].flush(10)
        gc.collect()
        led.close()

    rate = {name: args.records / statistics.median(t) for name, t in times.items()}
    raw_rate = rate["raw"]
    stamp_rate = rate["raw + stamp header"]
    sinks = [name for name in times if name.startswith("sink")]
    epochs = len(sinks) * args.rounds * args.records // EPOCH
    zk_ms = 1000 * zk.seconds / epochs
    zk_share = zk.seconds / sum(sum(times[name]) for name in sinks)
    round_ratios = [r / s for r, s in zip(times["raw"], times["sink"], strict=True)]
    table = Table(title=f"Sink throughput, {args.records:,} records x {args.rounds} rounds "
                        f"(100 B values, {PARTITIONS} partitions, epochs of {EPOCH:,})")
    table.add_column("writer")
    table.add_column("records/s (median)", justify="right")
    table.add_column("min .. max", justify="right")
    table.add_column("ratio vs raw", justify="right")
    table.add_column("ratio vs raw + stamp", justify="right")
    for name, t in times.items():
        ratio = rate[name] / raw_rate
        style = "" if not name.startswith("sink") else ("green" if ratio >= TARGET else "red")
        table.add_row(name, f"{rate[name]:,.0f}", f"{args.records / max(t):,.0f} .. {args.records / min(t):,.0f}",
                      f"[{style}]{ratio:.2f}[/{style}]" if style else f"{ratio:.2f}",
                      f"{rate[name] / stamp_rate:.2f}")
    console.print(table)
    ratio = rate["sink"] / raw_rate
    console.print(f"sink/raw = {ratio:.3f} (target >= {TARGET}): {'PASS' if ratio >= TARGET else 'FAIL'}; "
                  f"per-round ratios {', '.join(f'{r:.2f}' for r in round_ratios)}")
    console.print(f"against raw + stamp header (the floor of any stamped writer; goal >= {STAMP_TARGET}): sink "
                  f"{rate['sink'] / stamp_rate:.2f}, with pipelined commits "
                  f"{rate['sink, pipelined commits'] / stamp_rate:.2f}, "
                  f"send_many {rate['sink, send_many'] / stamp_rate:.2f}")
    # The same, per round: each writer against the raw + stamp loop of its own round (the rate of a shared
    # machine drifts over a run; a round's writers share its conditions).
    stamped = times["raw + stamp header"]
    per_round = {name: [s / t for s, t in zip(stamped, times[name], strict=True)] for name in sinks}
    paired = {name: statistics.median(r) for name, r in per_round.items()}
    intervals = {name: median_interval(r) for name, r in per_round.items()}
    console.print("median of per-round ratios to raw + stamp (95 % interval): " + ", ".join(
        f"{name} {paired[name]:.2f} ({intervals[name][0]:.2f}..{intervals[name][1]:.2f})" for name in sinks))
    # The sink writes dense epochs without stamps, so plain raw is its floor: the same against it.
    per_round_raw = {name: [s / t for s, t in zip(times["raw"], times[name], strict=True)] for name in sinks}
    paired_raw = {name: statistics.median(r) for name, r in per_round_raw.items()}
    intervals_raw = {name: median_interval(r) for name, r in per_round_raw.items()}
    console.print("median of per-round ratios to raw (95 % interval): " + ", ".join(
        f"{name} {paired_raw[name]:.2f} ({intervals_raw[name][0]:.2f}..{intervals_raw[name][1]:.2f})"
        for name in sinks))
    send_ok = paired["sink"] >= STAMP_TARGET
    many_ok = max(paired_raw["sink, send_many"], paired_raw["sink, send_many, pipelined"]) >= STAMP_TARGET
    console.print(f"goals: send >= {STAMP_TARGET} of raw + stamp (what it wrote when every record carried a stamp): "
                  f"{'PASS' if send_ok else 'FAIL'}; send_many >= {STAMP_TARGET} of raw: "
                  f"{'PASS' if many_ok else 'FAIL'}")
    console.print(f"other processes kept {foreign:.2f} of {os.cpu_count()} cores busy during the run"
                  + (" [red](numbers are noisy: rerun on a quiet machine)[/red]" if foreign > 0.3 else ""))
    console.print(f"sink ZooKeeper time: {zk_ms:.2f} ms per epoch (blocked in {', '.join(SINK_ZK_CALLS)}: "
                  f"{zk.calls} calls), "
                  f"{100 * zk_share:.1f}% of sink wall time; "
                  f"{zk_trips / epochs:.2f} round trips per epoch")
    per_run_epochs = args.rounds * args.records // EPOCH
    zk_ms_by_sink = {name: 1000 * zk_seconds[name] / per_run_epochs for name in sinks}
    console.print("sink ZooKeeper time blocked per epoch, by writer: " + ", ".join(
        f"{name} {ms:.2f} ms" for name, ms in zk_ms_by_sink.items()))
    zk_cpu_ms = {name: 1000 * zk_cpu[name] / per_run_epochs for name in times}
    console.print("ZooKeeper server CPU per epoch during each writer's runs: " + ", ".join(
        f"{name} {ms:.2f} ms" for name, ms in zk_cpu_ms.items()))

    out = write_results("bench_sink", {
        "benchmark": "bench_sink",
        "records_per_run": args.records, "rounds": args.rounds, "epoch_records": EPOCH,
        "partitions": PARTITIONS, "value_bytes": len(VALUE), "producer_settings": PRODUCER_SETTINGS,
        "seconds": times,
        "records_per_s_median": rate,
        "ratio_vs_raw": {name: r / raw_rate for name, r in rate.items()},
        "sink_ratio": ratio, "target": TARGET, "pass": ratio >= TARGET,
        "ratio_vs_raw_stamp": {name: r / stamp_rate for name, r in rate.items()}, "stamp_target": STAMP_TARGET,
        "sink_ratio_per_round": round_ratios,
        "ratio_vs_raw_stamp_per_round_median": paired, "ratio_vs_raw_stamp_per_round_interval": intervals,
        "ratio_vs_raw_per_round_median": paired_raw, "ratio_vs_raw_per_round_interval": intervals_raw,
        "foreign_cpu_cores": foreign,
        "sink_zk_ms_per_epoch": zk_ms, "sink_zk_share_of_wall_time": zk_share,
        "sink_zk_round_trips_per_epoch": zk_trips / epochs,
        "sink_zk_ms_per_epoch_by_writer": zk_ms_by_sink,
        "warm_epochs": args.warm_epochs, "warm_seconds": warm_seconds, "warm_zk_cpu_ms_per_epoch": warm_zk_ms,
        "zk_cpu_ms_per_epoch_by_writer": zk_cpu_ms, "pinned": args.pin,
        **work_results(work),
    })
    console.print(f"wrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    main()
