"""A Spark driver streaming X -> Y through the aligned source and sink, SIGKILLed and restarted twice.

The query runs in its own process (tests/workers/spark_relay.py); the test kills the driver JVM and its
Python process with SIGKILL, once right after the sink committed batch 1 in ZooKeeper but before
Spark's commit log recorded it (so Spark runs batch 1 again) and once in the middle of a batch.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers import raw_count
from tests.relay import LIVE, check, fill, kill, start, wait_batch

pytest.importorskip("pyspark")

EPOCHS = 6
RECORDS = 60


def test_killed_driver_restarts_from_checkpoint_exactly_once(stack, root, ledger, tmp_path, spawn):
    source, target = "kx-" + tmp_path.name[-8:], "ky-" + tmp_path.name[-8:]
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    checkpoint = tmp_path / "cp"
    worker, jvm = start(spawn, stack, root, source, target, checkpoint, "--pause-after-commit", "1")
    wait_batch(ledger, worker, target, 1)
    kill(worker, jvm)  # batch 1 committed in ZooKeeper, not in Spark's commit log: it will run again

    worker, jvm = start(spawn, stack, root, source, target, checkpoint)
    wait_batch(ledger, worker, target, 2)
    time.sleep(0.4)  # a kill point, not a wait: anywhere after batch 2 is fine
    kill(worker, jvm)  # somewhere in batch 3 (or later)

    worker, _ = start(spawn, stack, root, source, target, checkpoint)
    worker.finish(LIVE)

    check(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    # Batch 1 really ran twice: its second run's records are in Kafka, stamped with attempts nobody names.
    assert raw_count(stack.kafka, target, 2) > EPOCHS * RECORDS
