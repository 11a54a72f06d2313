"""bench_pipeline with the aligned source's consume calls counted: calls, empty ones, seconds inside.

    PYTHONPATH=. .venv/bin/python experiments/results/profiles/consume_polls.py --records 200000 --rounds 2 --peer no
"""
import sys, time
sys.argv = ["bench_pipeline", *(sys.argv[1:] or ["--records", "200000", "--rounds", "2", "--peer", "no"])]
from experiments import bench_pipeline as bp
calls = {"n": 0, "empty": 0, "wait": 0.0}
orig = bp.CountingConsumer.consume
def consume(self, num=1, timeout=-1):
    t = time.perf_counter()
    b = orig(self, num, timeout)
    calls["wait"] += time.perf_counter() - t
    calls["n"] += 1
    calls["empty"] += not b
    return b
bp.CountingConsumer.consume = consume
orig_run = bp.aligned_run
def run(*a, **k):
    calls.update(n=0, empty=0, wait=0.0)
    m0 = bp.CountingConsumer.messages
    r = orig_run(*a, **k)
    print("consume calls", calls, "messages", bp.CountingConsumer.messages - m0, "seconds", round(r["seconds"], 2))
    return r
bp.aligned_run = run
bp.main()
