"""The embedded stack runs the ZooKeeper server jar ``ALIGNER_ZOOKEEPER_JAR`` names (the chaos checker's partition
runs use a newer one than Debian 12's 3.8.0, which can forget acknowledged writes), and says so in one line when
that jar is missing, before anything starts."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from aligner.embedded.processes import DEBIAN_ZK_JAR, ZK_CONF, zk_classpath
from tests.conftest import ROOT, run_cli


def test_debian_s_jar_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALIGNER_ZOOKEEPER_JAR", raising=False)
    assert zk_classpath() == (str(DEBIAN_ZK_JAR), ZK_CONF)


def test_another_jar_goes_on_the_class_path_after_its_own_jute(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    jar, jute = tmp_path / "zookeeper-3.9.3.jar", tmp_path / "zookeeper-jute-3.9.3.jar"
    jar.touch()
    jute.touch()
    monkeypatch.setenv("ALIGNER_ZOOKEEPER_JAR", str(jar))
    assert zk_classpath() == (str(jute), str(jar), ZK_CONF)


def test_a_missing_jar_is_one_line_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "zookeeper.jar"
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNER_ZK", "ALIGNER_KAFKA", "ALIGNER_DEBUG")}
    env.update({"ALIGNER_HOME": str(tmp_path / "home"), "ALIGNER_ROOT": f"/aligner-jar-{uuid.uuid4().hex[:8]}",
                "PYTHONPATH": str(ROOT), "ALIGNER_ZOOKEEPER_JAR": str(missing)})
    done = run_cli(env, "stack", "up", "--no-retention")
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(missing) in lines[0] and "ALIGNER_ZOOKEEPER_JAR" in lines[0], done.stderr
    assert not (tmp_path / "home" / "stack.json").exists()
