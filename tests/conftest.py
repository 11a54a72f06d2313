"""Test harness: one real embedded stack (ZooKeeper + Tansu) per session, isolated state per test.

Set ALIGNER_TEST_BACKEND=docker to run the same tests against Apache Kafka + ZooKeeper through
testcontainers; that path needs a Docker engine and is skipped where there is none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aligner.ledger import Ledger
from coordinator.stack import EmbeddedStack, StackInfo

ROOT = Path(__file__).resolve().parent.parent


def _docker_stack() -> Iterator[StackInfo]:  # pragma: no cover - needs Docker
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("ALIGNER_TEST_BACKEND=docker but no Docker engine is reachable")
    tc = pytest.importorskip("testcontainers.kafka")
    zk_mod = pytest.importorskip("testcontainers.core.container")
    with zk_mod.DockerContainer("zookeeper:3.8").with_exposed_ports(2181) as zk, \
            tc.KafkaContainer("confluentinc/cp-kafka:7.7.0") as kafka:
        host = zk.get_container_host_ip()
        yield StackInfo(zk=f"{host}:{zk.get_exposed_port(2181)}", kafka=kafka.get_bootstrap_server(),
                        workdir="", zk_pid=0, kafka_pid=0)


@pytest.fixture(scope="session")
def stack() -> Iterator[StackInfo]:
    if os.environ.get("ALIGNER_TEST_BACKEND") == "docker":
        yield from _docker_stack()
        return
    with EmbeddedStack() as info:
        yield info


@pytest.fixture
def root() -> str:
    """A private ZooKeeper root per test, so tests never see each other's subjects."""
    return f"/aligner-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def ledger(stack: StackInfo, root: str) -> Iterator[Ledger]:
    led = Ledger.connect(stack.zk, root)
    yield led
    led.close()


@pytest.fixture
def subject_name() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cli_env(stack: StackInfo, root: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ALIGNER_ZK": stack.zk, "ALIGNER_KAFKA": stack.kafka, "ALIGNER_ROOT": root,
            "ALIGNER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}


def run_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
