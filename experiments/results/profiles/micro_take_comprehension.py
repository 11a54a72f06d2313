"""The ceiling of building a run of records with one comprehension (no per-record branches), beside micro_take.py.

    PYTHONPATH=. .venv/bin/python experiments/results/profiles/micro_take_comprehension.py
"""
exec(open("experiments/results/profiles/micro_take.py").read().split("gc.freeze()")[0])
import gc, time
gc.freeze()
from aligner.connectors.source import SourceRecord
def comp():
    t = time.perf_counter()
    for i in range(0, N, 10000):
        out = [SourceRecord("in", 0, m.offset(), 1, m.key(), m.value(), m.timestamp()[1]) for m in msgs[i:i + 10000]]
        out = None
    return time.perf_counter() - t
best = min(comp() for _ in range(5))
print(f"{1e6*best/N:.3f} us/record  one comprehension per run (the ceiling of that cut)")
