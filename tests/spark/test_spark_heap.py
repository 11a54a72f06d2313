"""The Spark adapter's heap settling in Spark's reused Python processes (no session: a subprocess plays a
reused worker, so the freeze does not touch the test process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

# A reused worker: a live set above the limit (modules, clients, caches), then tasks that each make cyclic
# garbage, call in (as read, write and commit do) and end with the full collection pyspark's daemon runs.
WORKER = """
import gc
from aligner.connectors.spark.common import SETTLE_OBJECTS, settle_spark_heap

live = [[i] for i in range(SETTLE_OBJECTS + 5_000)]
gc.collect()
frozen = []
for task in range(200):
    junk = []
    for _ in range(1_000):
        d = {}
        d["self"] = d
        junk.append(d)
    settle_spark_heap()
    del junk
    gc.collect()
    frozen.append(gc.get_freeze_count())
print(frozen[0], frozen[-1], len(gc.get_objects(generation=2)))
"""


def test_a_reused_worker_freezes_its_live_heap_once_and_keeps_collecting_what_tasks_drop() -> None:
    out = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=120, check=True)
    first, last, unfrozen = map(int, out.stdout.split())
    from aligner.connectors.spark.common import SETTLE_OBJECTS

    assert first > SETTLE_OBJECTS  # the live set left the collector's sight at the first task
    assert last == first  # ... once: 199 more tasks' cyclic garbage was collected, not frozen
    assert unfrozen < SETTLE_OBJECTS  # what a full collection walks stays small
