"""``aligner stack up --netns``: the detached stack's ZooKeeper (each server of an ensemble) and broker each in a
network namespace of its own, reached from the host at their namespace addresses; ``stack up`` restarts a dead
component in its namespace, ``stack down`` removes every namespace and the bridge. They need root (namespaces).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from aligner.connectors.kafka import QUIET, consumer_config
from aligner.embedded.netns import LabState, NetLab, available
from aligner.embedded.stack import _alive, wait_for
from tests.conftest import ROOT, run_cli
from tests.helpers import detached_stack_down

needs_netns = pytest.mark.skipif(available() is not None, reason=str(available()))
SOURCES = os.pathsep.join(str(p) for p in (ROOT / "aligner", ROOT / "connectors", ROOT / "coordinator", ROOT))
"""The CLI's PYTHONPATH: this checkout's three package roots first, so it runs this checkout's code."""


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def _state(env: dict[str, str]) -> dict[str, Any] | None:
    path = Path(env["ALIGNER_HOME"]) / "stack.json"
    return json.loads(path.read_text()) if path.exists() else None


def _ip(*argv: str) -> str:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def home_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """CLI environment of a private ALIGNER_HOME; on every path its stack is stopped (`stack down`, then
    whatever is left killed) and its lab removed, should `stack down` have left it."""
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNER_ZK", "ALIGNER_KAFKA", "ALIGNER_DEBUG")}
    env.update({"ALIGNER_HOME": str(tmp_path / "home"), "ALIGNER_ROOT": f"/netns-{uuid.uuid4().hex[:8]}",
                "PYTHONPATH": SOURCES})
    try:
        yield env
    finally:
        saved = _state(env)
        try:
            detached_stack_down(env)
        finally:
            if saved is not None and saved.get("netns") is not None:
                NetLab.restore(LabState.from_json(saved["netns"])).close()


def _up(env: dict[str, str], *args: str) -> dict[str, Any]:
    up = run_cli(env, "stack", "up", "--netns", "--no-retention", "--json", *args)
    assert up.returncode == 0, up.stderr
    info: dict[str, Any] = json.loads(up.stdout)
    return info


def _exports(env: dict[str, str]) -> dict[str, str]:
    r = run_cli(env, "stack", "env", "--json")
    assert r.returncode == 0, r.stderr
    exports: dict[str, str] = json.loads(r.stdout)
    return exports


def _assert_lab_gone(tag: str) -> None:
    assert tag not in _ip("netns", "list") and tag not in _ip("-o", "link", "show")


def _produce_and_consume(bootstrap: str) -> None:
    topic = f"netns-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    producer.produce(topic, b"through the bridge", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(consumer_config(bootstrap))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []

        def read() -> bool:
            for m in consumer.consume(10, timeout=0.5):
                error = m.error()
                if error is None:
                    got.append(m.value() or b"")
                elif error.code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(error)
            return bool(got)

        wait_for(read, 30, f"the record of {topic}")
        assert got == [b"through the bridge"]
    finally:
        consumer.close()


@needs_netns
@pytest.mark.stack
def test_stack_up_netns_runs_each_component_in_its_namespace_and_down_removes_the_lab(
        home_env: dict[str, str]) -> None:
    env = home_env
    info = _up(env)
    lab = info["netns"]
    assert isinstance(lab, dict) and info["actions"] == {"zookeeper": "started", "kafka": "started"}
    tag = str(lab["tag"])
    assert tag.startswith("alns")  # not aln<pid>: a lab that opens later does not sweep it
    exports = _exports(env)
    hosts = dict(lab["hosts"])
    assert exports == {"ALIGNER_ZK": info["zk"], "ALIGNER_KAFKA": info["kafka"]}
    assert exports["ALIGNER_ZK"].startswith(f"{hosts['zookeeper']}:")
    assert exports["ALIGNER_KAFKA"].startswith(f"{hosts['kafka']}:")
    for pid, name in ((info["zk_pid"], "zookeeper"), (info["kafka_pid"], "kafka")):
        assert _ip("netns", "identify", str(pid)).strip() == f"{tag}-{name}"
    zk = KazooClient(hosts=exports["ALIGNER_ZK"], timeout=10)
    zk.start(timeout=15)
    try:
        zk.ensure_path(f"{env['ALIGNER_ROOT']}/reached")
        assert zk.exists(f"{env['ALIGNER_ROOT']}/reached")
    finally:
        zk.stop()
        zk.close()
    _produce_and_consume(exports["ALIGNER_KAFKA"])
    status = run_cli(env, "stack", "status", "--no-probe")
    assert status.returncode == 0 and f"{info['kafka']} (netns {tag}-kafka)" in status.stdout, status.stdout

    # A dead broker comes back in its namespace, on its address.
    old = info["kafka_pid"]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not _alive(old), 10, "the killed broker to be gone")
    again = run_cli(env, "stack", "up", "--json")
    assert again.returncode == 0, again.stderr
    restarted = json.loads(again.stdout)
    assert restarted["actions"] == {"zookeeper": "running", "kafka": "restarted"}
    assert restarted["kafka"] == info["kafka"] and restarted["netns"] == lab
    assert _ip("netns", "identify", str(restarted["kafka_pid"])).strip() == f"{tag}-kafka"
    _produce_and_consume(restarted["kafka"])

    down = run_cli(env, "stack", "down")
    assert down.returncode == 0, down.stderr
    assert f"and bridge {tag}br" in down.stdout
    assert not _alive(restarted["zk_pid"]) and not _alive(restarted["kafka_pid"])
    _assert_lab_gone(tag)


@needs_netns
@pytest.mark.stack
def test_stack_up_netns_runs_each_ensemble_server_in_its_namespace(home_env: dict[str, str]) -> None:
    env = home_env
    info = _up(env, "--zk-servers", "3")
    lab = info["netns"]
    assert isinstance(lab, dict)
    tag, hosts = str(lab["tag"]), dict(lab["hosts"])
    zk = _exports(env)["ALIGNER_ZK"]
    assert zk == ",".join(f"{hosts[f'zk{i}']}:{port}" for i, port in enumerate(info["zk_ports"], 1))
    for i, pid in enumerate(info["zk_pids"], 1):
        assert _ip("netns", "identify", str(pid)).strip() == f"{tag}-zk{i}"
    client = KazooClient(hosts=zk, timeout=10)
    client.start(timeout=15)
    try:
        client.ensure_path(f"{env['ALIGNER_ROOT']}/reached")
    finally:
        client.stop()
        client.close()
    assert run_cli(env, "stack", "down").returncode == 0
    _assert_lab_gone(tag)


@needs_netns
@pytest.mark.stack
def test_stack_up_netns_on_a_running_plain_stack_is_refused_in_one_line(home_env: dict[str, str]) -> None:
    env = home_env
    plain = run_cli(env, "stack", "up", "--no-retention", "--json")
    assert plain.returncode == 0, plain.stderr
    refused = run_cli(env, "stack", "up", "--netns")
    assert refused.returncode == 1
    line = _one_line(refused.stderr)
    assert "runs on loopback" in line and "`aligner stack up --netns`" in line
    assert json.loads(plain.stdout)["zk_pid"] == (_state(env) or {})["zk_pid"]  # left as it was
    assert run_cli(env, "stack", "up", "--netns", "--zk-tls").returncode == 2


def test_stack_up_netns_without_the_tools_says_so_in_one_line(home_env: dict[str, str]) -> None:
    """Without iproute2 and nftables (here: not on PATH), or without root: one line, exit 1, nothing started."""
    refused = run_cli({**home_env, "PATH": "/nonexistent"}, "stack", "up", "--netns", "--no-retention")
    assert refused.returncode == 1
    line = _one_line(refused.stderr)
    assert "iproute2 nftables" in line or "need root" in line, line
    assert _state(home_env) is None


def test_the_lab_is_kept_in_the_state_file_and_old_state_files_still_read(tmp_path: Path) -> None:
    """A state file written before --netns reads as a loopback stack; a lab's state rebuilds its hosts (namespace,
    veth index) as the lab that opened made them."""
    from dataclasses import asdict

    from aligner.embedded.stack import StackInfo, _write_state, read_stack

    old: dict[str, Any] = {"zk": "127.0.0.1:2181", "kafka": "127.0.0.1:9092", "workdir": str(tmp_path),
                           "zk_pid": 1, "kafka_pid": 2}
    (tmp_path / "stack.json").write_text(json.dumps(old))
    plain = read_stack(tmp_path)
    assert plain is not None and plain.netns is None and plain.lab() is None
    lab = LabState("alns7", "10.213.9.0/24", (("zookeeper", "10.213.9.2"), ("kafka", "10.213.9.3")))
    _write_state(tmp_path, StackInfo(**{**old, "zk": "10.213.9.2:2181", "kafka": "10.213.9.3:9092"}, netns=lab))
    info = read_stack(tmp_path)
    assert info is not None and info.netns == lab and asdict(info)["netns"]["tag"] == "alns7"
    restored = info.lab()
    assert restored is not None and restored.bridge == "alns7br" and restored.gateway == "10.213.9.1"
    assert [(h.ns, h.ip, h.index) for h in restored.hosts.values()] == [
        ("alns7-zookeeper", "10.213.9.2", 2), ("alns7-kafka", "10.213.9.3", 3)]
    assert info.host("kafka") == "10.213.9.3" and restored.state() == lab
