"""ZooKeeper requests and blocked seconds per aligned job epoch in bench_pipeline's set-up.

Runs experiments.bench_pipeline (its main, unchanged) with the job ledger's RetryingClient wrapped on
the instance: every get / get_children / exists / set / create / transaction commit made while
``aligned_run`` runs is counted and timed, by the calling project function. Results go to stdout.

    ALIGNER_RESULTS=experiments/results/profiles/json .venv/bin/python experiments/results/profiles/zk_per_epoch.py --records 100000 --rounds 2
"""
from __future__ import annotations

import sys
import time
import traceback
from collections import Counter, defaultdict

import experiments.bench_pipeline as bp

stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
epochs = 0
active = False


def caller() -> str:
    for fr in reversed(traceback.extract_stack(limit=14)[:-2]):
        if "/connectors/" in fr.filename and "/zk.py" not in fr.filename:
            return f"{fr.filename.split('/connectors/')[-1]}:{fr.lineno} {fr.name}"
    return "?"


def wrap(obj, name):
    fn = getattr(obj, name)

    def timed(*a, **kw):
        if not active:
            return fn(*a, **kw)
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            s = stats[f"{name:13s} {caller()}"]
            s[0] += 1
            s[1] += time.perf_counter() - t0
    setattr(obj, name, timed)


orig_aligned_run = bp.aligned_run


def aligned_run(worker, first, fn, n):
    global active, epochs
    if not getattr(worker, "_zk_wrapped", False):
        zk = worker.ledger.zk
        for name in ("get", "get_children", "exists", "set", "create", "delete"):
            if hasattr(zk, name):
                wrap(zk, name)
        tx = zk.transaction

        def transaction(ops):
            t = tx(ops)
            for m in ("commit", "commit_async"):
                if hasattr(t, m):
                    wrap(t, m)
            return t
        zk.transaction = transaction
        worker._zk_wrapped = True
    if not isinstance(worker.source._consumer, bp.CountingConsumer):
        # the source watchdog reopened its consumer (SubjectSource._reopen) under load: bench_pipeline's
        # aligned_run then fails on counter.messages; wrap the new consumer again
        worker.source._consumer = bp.CountingConsumer(worker.source._consumer)
        print("note: the source's consumer was reopened by its watchdog; wrapped again", flush=True)
    active = True
    try:
        return orig_aligned_run(worker, first, fn, n)
    finally:
        active = False
        epochs += n


bp.aligned_run = aligned_run
sys.argv = ["bench_pipeline", *sys.argv[1:]]
try:
    bp.main()
finally:
    total_n = sum(s[0] for s in stats.values())
    total_s = sum(s[1] for s in stats.values())
    print(f"\n{epochs} aligned job epochs: {total_n / max(1, epochs):.1f} ZooKeeper requests and "
          f"{1000 * total_s / max(1, epochs):.1f} ms blocked in them per epoch")
    for k, (n, s) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        print(f"{n / max(1, epochs):6.2f}/epoch {1000 * s / max(1, epochs):7.2f} ms/epoch  {k}")
