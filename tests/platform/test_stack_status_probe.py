"""`aligner stack status` warns about a partition grown past the size where a fetch takes over 100 ms.

The embedded broker answers a fetch in time growing with the record batches of the partition
(measured). A detached stack of its own gets a topic with one partition of 60k one-record
batches (a fetch from its log start: ~0.5 s idle, more on a busy machine) and one of three batches:
the warning names the large one only, `--json` carries it, `--no-probe` and a dead broker leave the
command working. A busy machine only makes fetches slower: the large partition is flagged either way,
and the small one is under the probe's floor (fewer offsets than the batches any slow partition
holds), so it is never timed by the command; timed directly, it answers before the large one.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from aligner.connectors.fetch_probe import PROBE_FLOOR, SLOW_FETCH_S, probe
from aligner.connectors.kafka import QUIET, ensure_topic
from aligner.embedded.stack import _alive
from tests.conftest import ROOT, run_cli
from tests.helpers import detached_stack_down, wait_for
from tests.runtime.test_slow_broker import BIG, fill_batches

SMALL = 3
"""Batches in the small partition (each its own produce and flush)."""


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """CLI environment of a private ALIGNER_HOME with a detached stack (no retention loop); stopped on every path."""
    home = tmp_path_factory.mktemp("probe") / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNER_ZK", "ALIGNER_KAFKA", "ALIGNER_DEBUG")}
    env.update({"ALIGNER_HOME": str(home), "ALIGNER_ROOT": f"/aligner-probe-{uuid.uuid4().hex[:8]}",
                "PYTHONPATH": str(ROOT)})
    try:
        up = run_cli(env, "stack", "up", "--no-retention", "--json")
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        env["TEST_KAFKA"], env["TEST_KAFKA_PID"] = info["kafka"], str(info["kafka_pid"])
        yield env
    finally:
        detached_stack_down(env)


@pytest.fixture(scope="module")
def topic(stack_env: dict[str, str]) -> str:
    """A topic whose partition 0 holds BIG one-record batches and partition 1 SMALL; partition 2 is empty."""
    name = f"probe-{uuid.uuid4().hex[:8]}"
    bootstrap = stack_env["TEST_KAFKA"]
    ensure_topic(bootstrap, name, 3)
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for n in range(SMALL):
        producer.produce(name, json.dumps({"n": n}).encode(), partition=1)
        assert producer.flush(60) == 0
    fill_batches(bootstrap, name, 0, BIG)
    return name


def _status(env: dict[str, str], *args: str) -> tuple[Any, str]:
    r = run_cli(env, "stack", "status", *args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return (json.loads(r.stdout) if "--json" in args else None), r.stdout + r.stderr


def test_a_large_partition_is_warned_about_and_a_small_one_is_not(stack_env: dict[str, str], topic: str) -> None:
    assert PROBE_FLOOR > SMALL
    _, text = _status(stack_env)
    warnings = [line for line in text.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, text
    assert warnings[0].startswith(f"warning: {topic}[0]: a fetch from its log start answered "), text
    assert f"offsets 0..{BIG}" in warnings[0] and "see the docs, The embedded stack" in warnings[0], text
    assert f"{topic}[1]" not in text and f"{topic}[2]" not in text, text
    assert "fetch probe: 1 partition(s) timed" in text and "1 over 100 ms" in text, text

    data, _ = _status(stack_env, "--json")
    slow = data["slow_partitions"]
    assert [(s["topic"], s["partition"]) for s in slow] == [(topic, 0)], slow
    assert slow[0]["low"] == 0 and slow[0]["high"] == BIG
    assert slow[0]["seconds"] is None or slow[0]["seconds"] > SLOW_FETCH_S, slow
    assert data["fetch_probe"]["measured"] == slow and data["fetch_probe"]["small_partitions"] == 2
    assert data["fetch_probe"]["skipped"] == {} and data["fetch_probe"]["error"] is None


def test_timed_directly_the_small_partition_answers_first(stack_env: dict[str, str], topic: str) -> None:
    """Under the floor the command does not time it; timed anyway, the measured order is the sizes'
    order (absolute times are the machine's; their order is the broker's)."""
    result = probe(stack_env["TEST_KAFKA"], floor=1)
    times = {(m.topic, m.partition): m.seconds for m in result.measured}
    assert set(times) == {(topic, 0), (topic, 1)} and result.small == 1, result  # the empty one is never timed
    big, small = times[(topic, 0)], times[(topic, 1)]
    assert small is not None and (big is None or small < big), times
    assert [(m.topic, m.partition) for m in result.slow][:1] == [(topic, 0)], result


def test_a_spent_budget_names_what_was_not_measured(stack_env: dict[str, str], topic: str) -> None:
    result = probe(stack_env["TEST_KAFKA"], budget=0.0)
    assert result.measured == [] and result.error is None
    assert list(result.skipped) == [f"{topic}[0]"] and "budget" in result.skipped[f"{topic}[0]"]


def test_no_probe_and_a_dead_broker_keep_the_status_working(stack_env: dict[str, str], topic: str) -> None:
    data, text = _status(stack_env, "--no-probe", "--json")
    assert data["slow_partitions"] is None and data["fetch_probe"] is None
    _, text = _status(stack_env, "--no-probe")
    assert "warning:" not in text and "fetch probe" not in text, text

    pid = int(stack_env["TEST_KAFKA_PID"])  # last: the broker does not come back for this module
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 30, "Tansu to die")
    data, _ = _status(stack_env, "--json")
    assert data["slow_partitions"] is None and data["fetch_probe"] is None
    states = {c["name"]: c["state"] for c in data["components"]}
    assert states["kafka"] == "down", states
    _, text = _status(stack_env)
    assert "warning:" not in text and "aligner stack up" in text, text
