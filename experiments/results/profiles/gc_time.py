"""Seconds the cyclic garbage collector takes per bench_pipeline run, per generation (gc callbacks).

Runs experiments.bench_pipeline's main unchanged, 2 rounds, with ``gc.callbacks`` timing every collection and
charging it to the run under way (raw loop, record path, batch path); prints cumulative counts and seconds
after each run. With a second argument, ``settle_heap`` then sets those thresholds (to compare settings; since
d788dd8 it sets 50000,10,10 itself, so CPython's default is ``700,10,10``). The .out files ran at c6c0d6b:

    ALIGNER_RESULTS=/tmp PYTHONPATH=. .venv/bin/python experiments/results/profiles/gc_time.py 1000000 [50000,10,10]
"""
from __future__ import annotations

import collections
import gc
import sys
import time

import experiments.bench_pipeline as b

stats: dict[tuple[str, int], list[float]] = collections.defaultdict(lambda: [0, 0.0])
started = [0.0]
current = ["none"]


def timed(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        s = stats[(current[0], info["generation"])]
        s[0] += 1
        s[1] += time.perf_counter() - started[0]


def charged(name: str, run, *args, **kwargs):  # type: ignore[no-untyped-def]
    current[0] = name
    try:
        r = run(*args, **kwargs)
        print(name, "seconds", round(r["seconds"], 2),
              {k: (v[0], round(v[1], 3)) for k, v in stats.items() if k[0] == name}, flush=True)
        return r
    finally:
        current[0] = "none"


gc.callbacks.append(timed)
aligned, raw = b.aligned_run, b.raw_run
b.aligned_run = lambda worker, first, fn, epochs: charged(
    "batch" if fn is b.identity_batch else "record", aligned, worker, first, fn, epochs)
b.raw_run = lambda *a, **k: charged("raw", raw, *a, **k)
if len(sys.argv) > 2:
    thresholds = tuple(int(x) for x in sys.argv[2].split(","))
    settle = b.settle_heap

    def settle_and_set() -> None:
        settle()
        gc.set_threshold(*thresholds)
        print("threshold", gc.get_threshold(), flush=True)

    b.settle_heap = settle_and_set
sys.argv = ["bench_pipeline", "--records", sys.argv[1], "--rounds", "2", "--peer", "no"]
b.main()
