"""bench_pipeline with CPU accounting per phase: calling thread, other threads of the process
(librdkafka, kazoo), Tansu, ZooKeeper, in us per record (cf. cpu_split.py for the sink).

    PYTHONPATH=. ALIGNER_RESULTS=experiments/results/profiles/json \
        .venv/bin/python experiments/results/profiles/cpu_split_pipeline.py --records 100000 --rounds 3
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict

import experiments.bench_pipeline as bp
from aligner.coordinator.stack import EmbeddedStack
from experiments import _process_ticks

HZ = os.sysconf("SC_CLK_TCK")
pids: dict[str, int] = {}
rows: dict[str, list[dict[str, float]]] = defaultdict(list)

orig_enter = EmbeddedStack.__enter__


def enter(self):
    info = orig_enter(self)
    pids["kafka"], pids["zk"] = info.kafka_pid, info.zk_pid
    return info


EmbeddedStack.__enter__ = enter


def measured(name, fn):
    def run(*a, **kw):
        if name == "aligned job":
            worker = a[0]
            if not isinstance(worker.source._consumer, bp.CountingConsumer):  # reopened by the watchdog
                worker.source._consumer = bp.CountingConsumer(worker.source._consumer)
        me0, th0 = _process_ticks(os.getpid()), time.thread_time()
        k0, z0 = _process_ticks(pids["kafka"]), _process_ticks(pids["zk"])
        res = fn(*a, **kw)
        me, th = _process_ticks(os.getpid()) - me0, time.thread_time() - th0
        k, z = _process_ticks(pids["kafka"]) - k0, _process_ticks(pids["zk"]) - z0
        us = 1e6 / res["records"]
        rows[name].append({"wall": res["seconds_from_start"] * us, "caller": th * us,
                           "other threads": (me / HZ - th) * us, "broker (tansu)": k / HZ * us,
                           "zookeeper": z / HZ * us})
        return res
    return run


bp.raw_run = measured("raw", bp.raw_run)
bp.aligned_run = measured("aligned job", bp.aligned_run)
sys.argv = ["bench_pipeline", *sys.argv[1:]]
try:
    bp.main()
finally:
    cols = ["wall", "caller", "other threads", "broker (tansu)", "zookeeper"]
    print("\nus per record (median over rounds); wall from the run's start")
    print(f"{'pipeline':14s}" + "".join(f"{c:>16s}" for c in cols) + f"{'CPU total':>12s}")
    for name, rs in rows.items():
        med = {c: statistics.median(r[c] for r in rs) for c in cols}
        print(f"{name:14s}" + "".join(f"{med[c]:16.2f}" for c in cols) + f"{sum(med[c] for c in cols[1:]):12.2f}")
