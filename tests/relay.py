"""The Spark relay X -> Y of the crash tests (tests/workers/spark_relay.py): fill X, start and kill the driver,
and check that Y holds every X record's result exactly once, one Y epoch per X epoch."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import Counter, defaultdict
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from tests.helpers import Worker, json_value

SINK = "relay"
LIVE = 300
"""Liveness bound (seconds) on waits for a Spark driver: generous, for a busy machine; never a speed check."""


def fill(ledger: Any, kafka: str, source: str, target: str, epochs: int, records: int) -> None:
    """Subjects X and Y of 2 partitions; X holds ``epochs`` committed epochs of ``records`` records."""
    create_subject(ledger, kafka, source, 2)
    create_subject(ledger, kafka, target, 2)
    with SinkProducer(ledger, kafka, source, "up", 0, [0, 1]) as producer:
        for e in range(epochs):
            producer.begin()
            for j in range(records):
                producer.send(json.dumps({"e": e, "j": j}).encode(), key=str(j).encode())
            producer.commit()


def start(spawn: Any, stack: Any, root: str, source: str, target: str, checkpoint: Any,
          *extra: str) -> tuple[Worker, int]:
    """The relay's driver process and its JVM's pid."""
    worker = spawn.worker("tests.workers.spark_relay", "--zk", stack.zk, "--kafka", stack.kafka, "--root", root,
                          "--source", source, "--target", target, "--sink", SINK, "--checkpoint", str(checkpoint),
                          *extra)
    jvm = int(worker.wait_line(lambda line: line.startswith("jvm "), LIVE).split()[1])
    return worker, jvm


def kill(worker: Worker, jvm: int) -> None:
    """SIGKILL the Spark driver JVM and the Python driver process (a Connect client's: jvm 0, none)."""
    worker.kill()
    if jvm <= 0:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(jvm, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(jvm, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the Spark driver JVM {jvm} survived SIGKILL for 30 s")


def wait_batch(ledger: Any, worker: Worker, target: str, batch: int, timeout: float = LIVE) -> None:
    """Until the sink committed micro-batch ``batch`` in ZooKeeper."""
    from aligner.connectors.spark.writer import read_progress

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress, _ = read_progress(ledger, target, SINK)
        if progress is not None and progress.batch >= batch:
            return
        assert worker.proc.poll() is None, f"the Spark driver exited early: {worker.stderr}"
        time.sleep(0.01)
    raise TimeoutError(f"batch {batch} was not committed in {timeout}s")


def check(ledger: Any, kafka: str, source: str, target: str, epochs: int, records: int) -> dict[int, int]:
    """Y holds every X result exactly once, Y's epochs map one-to-one onto X's (sink lineage joined with
    source lineage), and the run kept one query id. Returns Y epoch -> X epoch."""
    from aligner.connectors.spark.lineage import cut, sink_lineage, source_batch

    written = sink_lineage(ledger, target, SINK)
    assert len(written) == epochs, f"expected one Y epoch per X epoch, got {sorted(written)}"
    y_to_x = {}
    for y, node in written.items():
        assert node.query is not None, f"Y epoch {y} was written without a query"
        read = source_batch(ledger, node.query, node.batch)
        assert list(read) == [source] and read[source].first == read[source].last
        y_to_x[y] = read[source].first
        assert cut(ledger, SINK, y) == {source: [y_to_x[y]], target: [y]}
    assert sorted(y_to_x.values()) == list(range(epochs))
    assert len({n.query for n in written.values()}) == 1, "the restarts kept the checkpoint's query id"

    with EpochReader(ledger, kafka) as reader:
        src = {(r.epoch, r.partition, r.offset): json_value(r.value)["j"] for r in reader.read(source, 0, epochs - 1)}
        got: Counter = Counter()
        per_epoch: dict[int, set[int]] = defaultdict(set)
        for r in reader.read(target, min(written), max(written)):
            v = json_value(r.value)
            got[(v["src_epoch"], v["src_partition"], v["src_offset"], v["j"])] += 1
            per_epoch[r.epoch].add(v["src_epoch"])
    assert len(src) == epochs * records
    assert got == Counter({(*k, j): 1 for k, j in src.items()}), "Y does not hold every X result exactly once"
    assert dict(per_epoch) == {y: {x} for y, x in y_to_x.items()}
    return y_to_x
