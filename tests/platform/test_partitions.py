"""Network partitions (issue 52): a component cut off from ZooKeeper, Kafka or its peers while the chain runs.

Each test plays the chaos checker's run with a fixed nemesis of one network fault, every component in a
network namespace of its own (:mod:`aligner.coordinator.netns`), and holds the drained chain to the checker's
every anomaly class, fencing and missing commits included. They need root (namespaces, nftables).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aligner.coordinator.netns import available
from experiments.chaos.nemesis import Fault
from experiments.chaos.run import Run, execute

pytest.importorskip("pyspark")

pytestmark = [pytest.mark.stack, pytest.mark.skipif(available() is not None, reason=str(available()))]


def play(tmp_path: Path, faults: list[Fault], ops: list[Fault] | None = None) -> tuple[Run, dict[str, Any]]:
    run = Run(52, faults, ops or [], tmp_path / "run", rate=100.0, faust=False, netns=True)
    return run, execute(run, drain_timeout=400)


def assert_clean(run: Run, result: dict[str, Any]) -> None:
    totals = result["check"]["anomalies"]["totals"]
    assert sum(totals.values()) == 0, (totals, result["check"]["anomalies"]["examples"])
    assert not run.observations, run.observations
    assert result["check"]["records_checked"] > 0
    assert run.swap_committed


def test_worker_cut_from_zookeeper_past_its_session_writes_every_record_once(tmp_path: Path) -> None:
    """A job worker keeps reaching Kafka but not ZooKeeper for longer than its session timeout (10 s): its
    session expires, it stops committing and says why; when the cut heals it resumes, by itself, and every
    record reaches ``a`` exactly once."""
    run, result = play(tmp_path, [Fault(8.0, "cut-zk", "worker 0", 16.0)])
    assert_clean(run, result)
    cut = next(e for e in run.events if e["kind"] == "cut-zk")
    assert cut["target"] == "A-0 from ZooKeeper"
    worker = run.procs["A-0"]
    assert worker.starts == 1, "the worker was restarted: it must ride the partition out"
    said = worker.stderr_tail(1 << 20)
    assert "ZooKeeper connection lost" in said and "session expired" in said, said[-2000:]
