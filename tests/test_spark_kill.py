"""A Spark driver streaming X -> Y through the aligned source and sink, SIGKILLed and restarted twice.

The query runs in its own process (tests/workers/spark_relay.py); the test kills the driver JVM and its
Python process with SIGKILL, once right after the sink committed batch 1 in ZooKeeper but before
Spark's commit log recorded it (so Spark runs batch 1 again) and once in the middle of a batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import Counter, defaultdict

import pytest

from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from tests.helpers import Worker, raw_count

pytest.importorskip("pyspark")

EPOCHS = 6
RECORDS = 60
SINK = "relay"
LIVE = 300
"""Liveness bound (seconds) on waits for a Spark driver: generous, for a busy machine; never a speed check."""


def _start(spawn, stack, root, source, target, checkpoint, *extra: str) -> tuple[Worker, int]:
    worker = spawn.worker("tests.workers.spark_relay", "--zk", stack.zk, "--kafka", stack.kafka, "--root", root,
                          "--source", source, "--target", target, "--sink", SINK, "--checkpoint", str(checkpoint),
                          *extra)
    jvm = int(worker.wait_line(lambda line: line.startswith("jvm "), LIVE).split()[1])
    return worker, jvm


def _kill(worker: Worker, jvm: int) -> None:
    """SIGKILL the Spark driver JVM and the Python driver process."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(jvm, signal.SIGKILL)
    worker.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(jvm, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the Spark driver JVM {jvm} survived SIGKILL for 30 s")


def _wait_batch(ledger, worker: Worker, target: str, batch: int, timeout: float = LIVE) -> None:
    """Until the sink committed micro-batch ``batch`` in ZooKeeper."""
    from aligner.connectors.spark.writer import read_progress

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress, _ = read_progress(ledger, target, SINK)
        if progress is not None and progress.batch >= batch:
            return
        assert worker.proc.poll() is None, f"the Spark driver exited early: {''.join(worker._stderr)[-3000:]}"
        time.sleep(0.01)
    raise TimeoutError(f"batch {batch} was not committed in {timeout}s")


def test_killed_driver_restarts_from_checkpoint_exactly_once(stack, root, ledger, tmp_path, spawn):
    from aligner.connectors.spark.lineage import cut, sink_lineage, source_batch

    source, target = "kx-" + tmp_path.name[-8:], "ky-" + tmp_path.name[-8:]
    create_subject(ledger, stack.kafka, source, 2)
    create_subject(ledger, stack.kafka, target, 2)
    with SinkProducer(ledger, stack.kafka, source, "up", 0, [0, 1]) as producer:
        for e in range(EPOCHS):
            producer.begin()
            for j in range(RECORDS):
                producer.send(json.dumps({"e": e, "j": j}).encode(), key=str(j).encode())
            producer.commit()
    checkpoint = tmp_path / "cp"
    worker, jvm = _start(spawn, stack, root, source, target, checkpoint, "--pause-after-commit", "1")
    _wait_batch(ledger, worker, target, 1)
    _kill(worker, jvm)  # batch 1 committed in ZooKeeper, not in Spark's commit log: it will run again

    worker, jvm = _start(spawn, stack, root, source, target, checkpoint)
    _wait_batch(ledger, worker, target, 2)
    time.sleep(0.4)  # a kill point, not a wait: anywhere after batch 2 is fine
    _kill(worker, jvm)  # somewhere in batch 3 (or later)

    worker, _ = _start(spawn, stack, root, source, target, checkpoint)
    worker.finish(LIVE)

    # Y's epochs map one-to-one onto X's: sink lineage (Y epoch -> batch) joined with source lineage.
    written = sink_lineage(ledger, target, SINK)
    assert len(written) == EPOCHS, f"expected one Y epoch per X epoch, got {sorted(written)}"
    y_to_x = {}
    for y, node in written.items():
        read = source_batch(ledger, node.query, node.batch)
        assert list(read) == [source] and read[source].first == read[source].last
        y_to_x[y] = read[source].first
        assert cut(ledger, SINK, y) == {source: [y_to_x[y]], target: [y]}
    assert sorted(y_to_x.values()) == list(range(EPOCHS))
    assert len({n.query for n in written.values()}) == 1, "the restarts kept the checkpoint's query id"

    with EpochReader(ledger, stack.kafka) as reader:
        src = {(r.epoch, r.partition, r.offset): json.loads(r.value)["j"] for r in reader.read(source, 0, EPOCHS - 1)}
        got: Counter = Counter()
        per_epoch: dict[int, set[int]] = defaultdict(set)
        for r in reader.read(target, min(written), max(written)):
            v = json.loads(r.value)
            got[(v["src_epoch"], v["src_partition"], v["src_offset"], v["j"])] += 1
            per_epoch[r.epoch].add(v["src_epoch"])
    assert len(src) == EPOCHS * RECORDS
    # Batch 1 really ran twice: its second run's records are in Kafka, stamped with attempts nobody names.
    assert raw_count(stack.kafka, target, 2) > EPOCHS * RECORDS
    assert got == Counter({(*k, j): 1 for k, j in src.items()}), "Y does not hold every X result exactly once"
    assert dict(per_epoch) == {y: {x} for y, x in y_to_x.items()}
