"""A day's ledger (172,800 half-second epochs on one subject): ``aligner status`` reports it right, and
retention cuts it to the policy's last 1,000 with the frontier unchanged. Correctness only: the time
status takes is ``experiments/bench_status.py``'s to report.

The ledger is built the benchmark's fast way (pipelined multi-ops of the nodes a commit leaves) with one
writer per epoch: the epoch count is what status lists; a second writer would only double the nodes
the session's shared ZooKeeper holds while the test runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import StackInfo
from aligner.errors import EpochCollectedError
from aligner.ledger import Ledger
from aligner.models import EpochNode
from aligner.retention import Retention
from experiments.bench_status import build_ledger
from tests.conftest import run_cli

EPOCHS = 172_800
"""A day of half-second epochs; builds in about a minute on two busy cores."""
KEEP = 1000
GC_TIMEOUT = 480
"""Seconds ``aligner gc`` gets: it lists each collected epoch's children (171,800 reads), minutes on busy cores."""


@pytest.fixture
def big_subject(stack: StackInfo, ledger: Ledger, subject_name: str) -> Iterator[str]:
    """``subject_name`` with EPOCHS committed epochs and one more epoch open (its writer has not
    contributed); the whole root is removed afterwards, in batches, whatever the test did."""
    create_subject(ledger, stack.kafka, subject_name, 2)
    build_ledger(ledger, subject_name, EPOCHS, writers=1, partitions=2)
    open_epoch = EpochNode(epoch=EPOCHS, writers=("bench:0",))
    ledger.zk.create(ledger.layout.epoch(subject_name, EPOCHS), open_epoch.dump())
    try:
        yield subject_name
    finally:
        lay, retention = ledger.layout, Retention(ledger)
        retention.delete([lay.epoch(subject_name, e) for e in ledger.subjects.epoch_numbers(subject_name)], depth=1)
        ledger.zk.delete(lay.root, recursive=True)


def _status(cli_env: dict[str, str], subject: str) -> dict[str, object]:
    done = run_cli(cli_env, "status", "--json", timeout=GC_TIMEOUT)
    assert done.returncode == 0, done.stderr
    rows = [r for r in json.loads(done.stdout)["subjects"] if r["subject"] == subject]
    assert len(rows) == 1, done.stdout[-2000:]
    return rows[0]


@pytest.mark.long  # a day's ledger; make test keeps bench_status's smoke run (test_benchmarks)
@pytest.mark.timeout(900)
def test_status_and_retention_on_a_days_ledger(big_subject: str, ledger: Ledger, cli_env: dict[str, str]) -> None:
    row = _status(cli_env, big_subject)
    assert row["epochs"] == EPOCHS + 1  # the open epoch counts: it is held in ZooKeeper
    assert row["last_committed"] == EPOCHS - 1
    assert ledger.epochs.frontier(big_subject) == EPOCHS - 1

    done = run_cli(cli_env, "gc", "--keep-epochs", str(KEEP), "--json", timeout=GC_TIMEOUT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["subjects"][big_subject]
    floor = EPOCHS - KEEP
    assert (report["first_retained"], report["deleted_epochs"]) == (floor, floor)
    assert ledger.subjects.first_retained(big_subject) == floor
    assert ledger.subjects.epoch_numbers(big_subject) == list(range(floor, EPOCHS + 1))
    assert ledger.epochs.is_committed(big_subject, floor) and not ledger.epochs.is_committed(big_subject, EPOCHS)
    with pytest.raises(EpochCollectedError):
        ledger.epochs.committed(big_subject, floor - 1)

    row = _status(cli_env, big_subject)
    assert row["epochs"] == KEEP + 1
    assert row["last_committed"] == EPOCHS - 1
