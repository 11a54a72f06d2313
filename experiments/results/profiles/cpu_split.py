"""Where the CPU of one record goes, per writer: calling thread, librdkafka's threads, broker, ZooKeeper.

Wall-time ratios on a shared 2-core machine are noisy; CPU seconds per record are not (much). Runs
bench_sink's loops (raw, raw + stamp header, sink) interleaved on one embedded stack and reads
/proc for the CPU time of this process (all threads), of the calling thread (time.thread_time)
and of the Tansu and ZooKeeper processes.

    .venv/bin/python experiments/results/profiles/cpu_split.py [--records 300000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

from experiments import ForeignCpu, _process_ticks
from experiments.bench_sink import EPOCH, PARTITIONS, raw_producer, raw_run, sink_run
from aligner.connectors.kafka import ensure_topic
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.coordinator.stack import EmbeddedStack
from aligner.ledger import Ledger
from aligner.stamps import HEADER, Stamp

HZ = os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    stamp = [(HEADER, Stamp("sink", 123, 1).encode())]
    with EmbeddedStack() as info:
        led = Ledger.connect(info.zk, "/cpu-split")
        create_subject(led, info.kafka, "s", PARTITIONS)
        prods = {}
        for name in ("raw", "stamp"):
            ensure_topic(info.kafka, f"raw-{name}", PARTITIONS)
            prods[name] = raw_producer(info.kafka, f"raw-{name}")
        with SinkProducer(led, info.kafka, "s", "sink", 0, list(range(PARTITIONS))) as sink:
            runs = {
                "raw": lambda: raw_run(prods["raw"], "raw-raw", args.records),
                "raw + stamp header": lambda: raw_run(prods["stamp"], "raw-stamp", args.records, stamp),
                "sink": lambda: sink_run(sink, args.records),
            }
            raw_run(prods["raw"], "raw-raw", EPOCH)
            sink_run(sink, EPOCH)
            res: dict[str, list[dict[str, float]]] = {n: [] for n in runs}
            foreign = ForeignCpu(info.zk_pid, info.kafka_pid)
            for _ in range(args.rounds):
                for name, run in runs.items():
                    me0, th0 = _process_ticks(os.getpid()), time.thread_time()
                    k0, z0 = _process_ticks(info.kafka_pid), _process_ticks(info.zk_pid)
                    wall = run()
                    me, th = _process_ticks(os.getpid()) - me0, time.thread_time() - th0
                    k, z = _process_ticks(info.kafka_pid) - k0, _process_ticks(info.zk_pid) - z0
                    us = 1e6 / args.records
                    res[name].append({"wall": wall * us, "caller": th * us, "librdkafka+other threads": (me / HZ - th) * us,
                                      "broker (tansu)": k / HZ * us, "zookeeper": z / HZ * us})
            cores = foreign.cores()
        for p in prods.values():
            p.flush(10)
        led.close()
    cols = ["wall", "caller", "librdkafka+other threads", "broker (tansu)", "zookeeper"]
    print(f"us per record, median of {args.rounds} rounds of {args.records:,} records; "
          f"other processes kept {cores:.2f} of {os.cpu_count()} cores busy")
    print(f"{'writer':22s}" + "".join(f"{c:>26s}" for c in cols) + f"{'CPU total':>12s}")
    for name, rows in res.items():
        med = {c: statistics.median(r[c] for r in rows) for c in cols}
        print(f"{name:22s}" + "".join(f"{med[c]:26.2f}" for c in cols) + f"{sum(med[c] for c in cols[1:]):12.2f}")


if __name__ == "__main__":
    main()
