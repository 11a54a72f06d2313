"""The detached embedded stack (`aligner stack up|status|env|down`) never destroys data because one
component died: ordinary commands name the dead component and how to restart it, `stack up`
restarts only what is down on its own port and data, and only `stack down` removes state.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from aligner.connectors.kafka import QUIET, consumer_config
from aligner.connectors.marker import EpochMarker
from aligner.connectors.subjects import create_subject
from aligner.coordinator.cli.connect import ZK_OUTAGE_LIMIT
from aligner.embedded.stack import _alive
from aligner.ledger import Ledger
from aligner.models import SubjectNode
from tests.conftest import ROOT, run_cli
from tests.helpers import detached_stack_down, wait_for


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def _count_records(bootstrap: str, topic: str) -> int:
    """Records in partition 0 of ``topic`` as the broker holds them (stamps and epochs ignored)."""
    consumer = Consumer(consumer_config(bootstrap))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        count, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.5):
                error = m.error()
                if error is None:
                    count += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    return count
        raise AssertionError(f"no end of partition from {topic} within 60s")
    finally:
        consumer.close()


@pytest.fixture
def home_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """CLI environment of a private ALIGNER_HOME; its detached stack is stopped on every path."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNER_ZK", "ALIGNER_KAFKA", "ALIGNER_DEBUG")}
    env.update({"ALIGNER_HOME": str(home), "ALIGNER_ROOT": f"/aligner-stack-{uuid.uuid4().hex[:8]}",
                "PYTHONPATH": str(ROOT)})
    yield env
    detached_stack_down(env)


def _pids(env: dict[str, str]) -> dict[str, int]:
    state = json.loads((Path(env["ALIGNER_HOME"]) / "stack.json").read_text())
    return {"zk": state["zk_pid"], "kafka": state["kafka_pid"], "retention": state["retention_pid"]}


def _states(env: dict[str, str]) -> dict[str, str]:
    r = run_cli(env, "stack", "status", "--json")
    assert r.returncode == 0, r.stderr
    return {c["name"]: c["state"] for c in json.loads(r.stdout)["components"]}


def test_a_dead_zookeeper_is_reported_and_restarted_with_its_data(home_env: dict[str, str]) -> None:
    env = home_env
    up = run_cli(env, "stack", "up", "--retention", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    assert info["actions"] == {"zookeeper": "started", "kafka": "started", "retention": "started"}
    subject = f"s-{uuid.uuid4().hex[:8]}"
    with Ledger.connect(info["zk"], env["ALIGNER_ROOT"]) as led:
        create_subject(led, info["kafka"], subject, 1)
        producer = Producer({"bootstrap.servers": info["kafka"], **QUIET})
        for n in range(5):
            producer.produce(subject, json.dumps({"n": n}).encode(), partition=0)
        producer.flush(30)
        marker = EpochMarker(led, info["kafka"], subject).open()
        try:
            marker.mark()  # epoch 0, committed in ZooKeeper
        finally:
            marker.close()

    os.kill(info["zk_pid"], signal.SIGKILL)
    wait_for(lambda: not _alive(info["zk_pid"]), 30, "ZooKeeper to die")

    r = run_cli(env, "status")
    line = _one_line(r.stderr)
    assert r.returncode == 1
    assert f"cannot reach ZooKeeper at {info['zk']}" in line
    assert f"the embedded stack's ZooKeeper (pid {info['zk_pid']}) is down" in line and "aligner stack up" in line
    # Nothing was stopped or removed because ZooKeeper died.
    assert _alive(info["kafka_pid"]) and _count_records(info["kafka"], subject) == 5
    assert (Path(info["workdir"]) / "zk-data").is_dir() and (Path(env["ALIGNER_HOME"]) / "stack.json").exists()
    # The retention loop rides out the outage (it waits for ZooKeeper, its metrics still answer).
    assert _states(env) == {"zookeeper": "down", "kafka": "up", "retention": "up"}
    status = run_cli(env, "stack", "status")
    assert status.returncode == 0 and "down" in status.stdout and str(info["zk_pid"]) in status.stdout

    again = run_cli(env, "stack", "up", "--json")
    assert again.returncode == 0, again.stderr
    restarted = json.loads(again.stdout)
    assert restarted["actions"] == {"zookeeper": "restarted", "kafka": "running", "retention": "running"}
    assert restarted["zk"] == info["zk"] and restarted["kafka"] == info["kafka"]  # same ports
    assert restarted["kafka_pid"] == info["kafka_pid"] and restarted["zk_pid"] != info["zk_pid"]
    assert _states(env) == {"zookeeper": "up", "kafka": "up", "retention": "up"}
    # The committed znodes came back with ZooKeeper, and the broker kept the records.
    epochs = json.loads(run_cli(env, "epochs", subject, "--json").stdout)["epochs"]
    assert [(e["epoch"], e["committed"]) for e in epochs] == [(0, True)]
    read = run_cli(env, "read", subject, "--epoch", "0", "--json")
    assert read.returncode == 0, read.stderr
    assert sorted(rec["value"]["n"] for rec in json.loads(read.stdout)["records"]) == list(range(5))

    # A paused ZooKeeper is named as such (a command gives up in bounded time) and left alone by `stack up`.
    os.kill(restarted["zk_pid"], signal.SIGSTOP)
    try:
        started = time.monotonic()
        r = run_cli(env, "subjects", "list")
        line = _one_line(r.stderr)
        assert r.returncode == 1 and time.monotonic() - started < ZK_OUTAGE_LIMIT + 15  # its outage limit, and start-up
        assert f"cannot reach ZooKeeper at {info['zk']}" in line and f"kill -CONT {restarted['zk_pid']}" in line
        assert _states(env) == {"zookeeper": "paused", "kafka": "up", "retention": "up"}
        assert json.loads(run_cli(env, "stack", "up", "--json").stdout)["actions"]["zookeeper"] == "paused"
    finally:
        os.kill(restarted["zk_pid"], signal.SIGCONT)

    # A dead broker is restarted alone, on its port; ZooKeeper and its data are untouched.
    os.kill(info["kafka_pid"], signal.SIGKILL)
    wait_for(lambda: not _alive(info["kafka_pid"]), 30, "Tansu to die")
    r = run_cli(env, "read", subject, "--epoch", "0")
    line = _one_line(r.stderr)
    assert r.returncode == 1 and f"cannot reach Kafka at {info['kafka']}" in line and "aligner stack up" in line
    third = json.loads(run_cli(env, "stack", "up", "--json").stdout)
    assert third["actions"] == {"zookeeper": "running", "kafka": "restarted", "retention": "running"}
    assert third["kafka"] == info["kafka"] and third["zk_pid"] == restarted["zk_pid"]
    assert json.loads(run_cli(env, "epochs", subject, "--json").stdout)["epochs"][0]["committed"]

    # A dead retention loop is restarted alone, on its metrics port.
    os.kill(info["retention_pid"], signal.SIGKILL)
    wait_for(lambda: not _alive(info["retention_pid"]), 30, "retention to die")
    fourth = json.loads(run_cli(env, "stack", "up", "--json").stdout)
    assert fourth["actions"] == {"zookeeper": "running", "kafka": "running", "retention": "restarted"}
    assert fourth["retention_port"] == info["retention_port"] and fourth["root"] == env["ALIGNER_ROOT"]

    pids = _pids(env)
    down = run_cli(env, "stack", "down")
    assert down.returncode == 0, down.stderr
    assert f"stopped ZooKeeper pid {pids['zk']}" in down.stdout
    assert f"stopped Kafka (Tansu) pid {pids['kafka']}" in down.stdout
    assert f"removed data dir {info['workdir']}" in down.stdout and "removed state file" in down.stdout
    assert f"stopped Retention (coordinator) pid {pids['retention']}" in down.stdout
    assert not any(_alive(p) for p in pids.values()) and not Path(info["workdir"]).exists()
    nothing = run_cli(env, "stack", "down")
    assert nothing.returncode == 0 and "nothing removed" in nothing.stdout


def test_embedded_zookeeper_purges_its_data_dir_and_answers_mntr(stack) -> None:
    """Issue 23 item 2: snapshots and transaction logs are purged hourly (3 kept), and ``mntr`` (which the
    soak samples for znode counts and data size) is whitelisted."""
    import socket

    cfg = (Path(stack.workdir) / "zoo.cfg").read_text().splitlines()
    assert "autopurge.snapRetainCount=3" in cfg and "autopurge.purgeInterval=1" in cfg
    host, port = stack.zk.rsplit(",", 1)[0].rsplit(":", 1)
    figures: dict[str, str] = {}

    def mntr() -> bool:  # "not currently serving requests" until the server has loaded its database
        try:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"mntr")
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
        except OSError:  # a server still starting may reset the connection
            return False
        for line in reply.decode().splitlines():
            if "\t" in line:
                name, value = line.split("\t", 1)
                figures[name] = value
        return "zk_znode_count" in figures

    wait_for(mntr, 60, "ZooKeeper to answer mntr", interval=0.2)
    assert int(figures["zk_znode_count"]) > 0 and "zk_approximate_data_size" in figures


def test_stack_up_no_retention_runs_zookeeper_and_the_broker_only(home_env: dict[str, str]) -> None:
    up = run_cli(home_env, "stack", "up", "--no-retention", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    assert info["actions"] == {"zookeeper": "started", "kafka": "started"} and info["retention_pid"] == 0
    assert _states(home_env) == {"zookeeper": "up", "kafka": "up"}


def test_stack_up_zk_servers_runs_an_ensemble_and_restarts_a_dead_server(home_env: dict[str, str]) -> None:
    """``aligner stack up --zk-servers 3``: three servers, each shown by ``stack status``; a killed one is shown
    down (the others serve), restarted by ``stack up`` on its port and data, and stopped by ``stack down``."""
    env = home_env
    up = run_cli(env, "stack", "up", "--zk-servers", "3", "--no-retention", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    servers = ["zookeeper-1", "zookeeper-2", "zookeeper-3"]
    assert info["actions"] == {**dict.fromkeys(servers, "started"), "kafka": "started"}
    assert info["zk"].count(",") == 2 and len(info["zk_pids"]) == 3
    assert _states(env) == {**dict.fromkeys(servers, "up"), "kafka": "up"}
    shown = run_cli(env, "stack", "status", "--no-probe")
    assert shown.returncode == 0 and "ZooKeeper server 2" in shown.stdout

    os.kill(info["zk_pids"][1], signal.SIGKILL)
    wait_for(lambda: _states(env)["zookeeper-2"] == "down", 30, "server 2 to be shown down")
    with Ledger.connect(info["zk"], env["ALIGNER_ROOT"]) as led:  # two of three keep the quorum
        led.subjects.register_subject(SubjectNode(name="s", topic="s", partitions=1))
    again = run_cli(env, "stack", "up", "--json")
    assert again.returncode == 0, again.stderr
    restarted = json.loads(again.stdout)
    assert restarted["actions"] == {"zookeeper-1": "running", "zookeeper-2": "restarted", "zookeeper-3": "running",
                                    "kafka": "running"}
    assert restarted["zk"] == info["zk"] and restarted["zk_pids"][1] != info["zk_pids"][1]
    assert _states(env) == {**dict.fromkeys(servers, "up"), "kafka": "up"}
    refused = run_cli(env, "stack", "up", "--zk-servers", "5")
    assert refused.returncode == 1 and "runs 3 ZooKeeper server(s)" in refused.stderr
    assert run_cli(env, "stack", "up", "--zk-servers", "2").returncode == 2

    down = run_cli(env, "stack", "down")
    assert down.returncode == 0, down.stderr
    assert down.stdout.count("stopped ZooKeeper server") == 3
    assert not any(_alive(p) for p in restarted["zk_pids"])


def _flip_log_byte(data: Path) -> None:
    """Flip a byte inside the newest transaction log's transactions: ZooKeeper refuses the log (CRC check)."""
    log = max(data.glob("log.*"), key=lambda p: p.stat().st_mtime)
    raw = bytearray(log.read_bytes())
    raw[len(raw.rstrip(b"\0")) // 2] ^= 0xFF
    log.write_bytes(bytes(raw))


def test_stack_up_rebuilds_a_member_that_refuses_its_damaged_data(home_env: dict[str, str]) -> None:
    """Every member killed, server 2's transaction log damaged (a byte flipped): ``stack up`` restarts the
    healthy two first, finds server 2 refusing its data and, the others serving a quorum, moves its data
    aside (kept) and starts it empty; it syncs the whole tree from the leader. With two members damaged the
    third holds no quorum: ``stack up`` says so and leaves their data alone."""
    from kazoo.client import KazooClient

    env = home_env
    up = run_cli(env, "stack", "up", "--zk-servers", "3", "--no-retention", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    data = [Path(info["workdir"]) / f"zk-{i}" / "data" / "version-2" for i in range(3)]
    with Ledger.connect(info["zk"], env["ALIGNER_ROOT"]) as led:
        for n in range(300):
            led.subjects.register_subject(SubjectNode(name=f"s{n}", topic=f"s{n}", partitions=1))

    def kill_all(pids: list[int]) -> None:
        for i, pid in enumerate(pids):
            os.kill(pid, signal.SIGKILL)

            def down(i: int = i) -> bool:
                return _states(env)[f"zookeeper-{i + 1}"] == "down"

            wait_for(down, 30, f"server {i + 1} to be down")

    kill_all(info["zk_pids"])
    _flip_log_byte(data[1])
    again = run_cli(env, "stack", "up", "--json")
    assert again.returncode == 0, again.stderr
    rebuilt = json.loads(again.stdout)
    assert rebuilt["actions"]["zookeeper-1"] == rebuilt["actions"]["zookeeper-3"] == "restarted"
    assert rebuilt["actions"]["zookeeper-2"].startswith("rebuilt (its damaged data moved to "), rebuilt["actions"]
    assert len(list(data[1].parent.glob("version-2.damaged-*"))) == 1
    alone = KazooClient(f"127.0.0.1:{info['zk_ports'][1]}")
    alone.start(30)
    try:
        alone.sync("/")
        subjects = alone.get_children(f"{env['ALIGNER_ROOT']}/subjects")
        assert len([s for s in subjects if s.startswith("s")]) == 300
    finally:
        alone.stop()
        alone.close()
    with Ledger.connect(rebuilt["zk"], env["ALIGNER_ROOT"]) as led:  # every member's log has transactions
        for n in range(300, 400):
            led.subjects.register_subject(SubjectNode(name=f"s{n}", topic=f"s{n}", partitions=1))

    kill_all(rebuilt["zk_pids"])
    _flip_log_byte(data[0])
    _flip_log_byte(data[1])
    kept = {i: sorted(p.name for p in data[i].iterdir()) for i in (0, 1)}
    refused = run_cli(env, "stack", "up")
    assert refused.returncode == 1 and "hold no quorum" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert {i: sorted(p.name for p in data[i].iterdir()) for i in (0, 1)} == kept
    assert len(list(data[0].parent.glob("version-2.damaged-*"))) == 0
    assert len(list(data[1].parent.glob("version-2.damaged-*"))) == 1  # the first rebuild's, nothing new
    assert run_cli(env, "stack", "down").returncode == 0


def test_a_stack_in_a_relative_directory_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m experiments.chaos --out experiments/results/x`` gave ZooKeeper a relative dataDir, which it
    resolved in its own directory and refused ("Invalid config")."""
    from aligner.embedded.stack import EmbeddedStack

    monkeypatch.chdir(tmp_path)
    with EmbeddedStack(Path("rel") / "stack") as info:
        assert info.workdir == str(tmp_path / "rel" / "stack")
        assert f"dataDir={tmp_path}/rel/stack/" in (tmp_path / "rel" / "stack" / "zoo.cfg").read_text()
        ledger = Ledger.connect(info.zk, "/rel")
        try:
            ledger.subjects.register_subject(SubjectNode(name="in", topic="in", partitions=1))
            assert ledger.subjects.subject("in").partitions == 1
        finally:
            ledger.close()
