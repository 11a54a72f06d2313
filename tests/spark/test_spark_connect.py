"""The aligned data source from a Spark Connect client (a Connect server from pyspark's own jars, clients in
processes of their own): batch reads by epoch, range, asOf and lineage return what the library's own reader
returns; the relay X -> Y streams through Connect exactly once, a client SIGKILLed in the middle of a
micro-batch and started again on the same checkpoint leaves every X result in Y once, and a stateful query
run as an aligned job from a Connect client is hot-swapped for a new version exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aligner.connectors.reader import EpochReader
from aligner.coordinator.hotswap import HotSwap
from aligner.embedded.spark_cluster import ConnectServer
from tests.helpers import as_args, wait_for
from tests.relay import LIVE, SINK, check, fill, kill, start
from tests.spark_queries import SwapPair

pytest.importorskip("pyspark")
pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")

EPOCHS = 4
RECORDS = 40


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory):
    server = ConnectServer(tmp_path_factory.mktemp("connect"))
    try:
        server.start(LIVE)
        yield server
    finally:
        server.stop()


def _names(tmp_path: Path) -> tuple[str, str]:
    return "nx-" + tmp_path.name[-8:], "ny-" + tmp_path.name[-8:]


def test_stream_and_batch_reads_through_connect(connect, stack, root, ledger, tmp_path, spawn):
    source, target = _names(tmp_path)
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    worker, _ = start(spawn, stack, root, source, target, tmp_path / "cp", "--remote", connect.url)
    worker.finish(LIVE)
    y_to_x = check(ledger, stack.kafka, source, target, EPOCHS, RECORDS)

    y = max(y_to_x)
    reads = {"epoch=1": (source, 1, 1), "epochs=0:2": (source, 0, 2), "asOf=3": (source, 0, 3),
             f"lineage={SINK}:{y}": (source, y_to_x[y], y_to_x[y])}
    client = spawn.worker("tests.workers.spark_connect_reads", "--remote", connect.url, "--zk", stack.zk,
                          "--kafka", stack.kafka, "--root", root, "--subject", source,
                          *[arg for r in [*reads, "epoch=99"] for arg in ("--read", r)])
    with EpochReader(ledger, stack.kafka) as reader:
        for read, (subject, first, last) in reads.items():
            line = json.loads(client.wait_line(lambda s: s.startswith("{"), LIVE))
            want = sorted([r.epoch, r.partition, r.offset] for r in reader.read(subject, first, last))
            assert line["read"] == read and line["records"] == want, f"{read}: Connect read differs"
            assert want, f"{read} read nothing"
    error = client.wait_line(lambda s: s.startswith("error"), LIVE)
    assert "epoch 99 of subject" in error and "is not committed" in error, f"not the library's error: {error}"
    client.finish(LIVE)


def test_client_killed_while_its_query_runs(connect, stack, root, ledger, tmp_path, spawn):
    """The client SIGKILLed while its query is inside batch 1's write (held there): the server-side query
    is orphaned; a new client on the same checkpoint takes over, and Y holds every X result once."""
    source, target = _names(tmp_path)
    fill(ledger, stack.kafka, source, target, EPOCHS, RECORDS)
    hang = tmp_path / "hang"
    hold = {"hangTask": "1/0", "hangAt": "precommit", "hangFile": str(hang), "hangSeconds": "20"}
    worker, jvm = start(spawn, stack, root, source, target, tmp_path / "cp", "--remote", connect.url,
                        *as_args("--sink-option", hold))
    wait_for(lambda: hang.exists() or worker.proc.poll() is not None, LIVE, "batch 1's write to be held")
    kill(worker, jvm)
    worker, _ = start(spawn, stack, root, source, target, tmp_path / "cp", "--remote", connect.url)
    worker.finish(LIVE)
    check(ledger, stack.kafka, source, target, EPOCHS, RECORDS)


def test_query_hotswap_through_connect(connect, stack, root, ledger, subject_name, tmp_path, spawn):
    """Q1 (a running count) and Q2 (a running sum, rebuilt from the start of the input) as aligned jobs
    from Connect clients (``register_query``, ``AlignedQuery`` and ``stop_query`` on the client side),
    hot-swapped by the coordinator under continuous input: every result once, from Q1 up to S, Q2 after;
    Q1's client stops its query once its sink finished."""
    pair = SwapPair(spawn, stack, ledger, root, subject_name, tmp_path, remote=connect.url)
    swap = HotSwap(ledger).run(pair.old.job, pair.new.job, pair.target, timeout=LIVE)
    assert swap.phase == "done"
    pair.finish(swap.epoch)
