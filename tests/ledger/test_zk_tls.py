"""ZooKeeper over TLS: the embedded stack's secure client port, against the real ZooKeeper.

One stack with ``zk_tls=True`` for the module (its own, stopped on every path); the default stack of
the other tests stays plaintext. A TLS mismatch is one clear error at once, never a session that
silently never comes.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aligner.embedded.stack import EmbeddedStack, StackInfo, _alive, components, make_tls
from aligner.errors import AlignerError, UnreachableError
from aligner.ledger import Ledger
from aligner.models import Range, SubjectNode
from aligner.settings import zk_security
from tests.conftest import ROOT, run_cli
from tests.helpers import detached_stack_down

TLS_VARS = ("ALIGNER_ZK_TLS_CA", "ALIGNER_ZK_TLS_CERT", "ALIGNER_ZK_TLS_KEY")


@pytest.fixture(scope="module")
def tls_stack() -> Iterator[StackInfo]:
    embedded = EmbeddedStack(zk_tls=True)
    pids: list[int] = []
    try:
        info = embedded.start()
        pids = [info.zk_pid, info.kafka_pid]
        yield info
    finally:
        embedded.stop()
        assert not [p for p in pids if _alive(p)], "the TLS stack's processes outlived it"


@pytest.fixture
def tls_env(tls_stack: StackInfo, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process and the CLI's environment point at the TLS stack, with its client files."""
    env = tls_stack.env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ALIGNER_ZK_AUTH", raising=False)
    return env


def _cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALIGNER_")}
    env.update({"ALIGNER_HOME": str(home), "ALIGNER_ROOT": f"/tls-{uuid.uuid4().hex[:8]}", "PYTHONPATH": str(ROOT)})
    env.update(extra)
    return env


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_stack_serves_only_a_secure_port_and_exports_the_client_files(tls_stack: StackInfo) -> None:
    cfg = (Path(tls_stack.workdir) / "zoo.cfg").read_text()
    assert f"secureClientPort={tls_stack.port('zookeeper')}" in cfg
    assert "\nclientPort=" not in cfg  # no plaintext port to bypass TLS
    assert "ssl.clientAuth=need" in cfg
    env = tls_stack.env()
    assert all(Path(env[v]).is_file() for v in TLS_VARS)
    assert [c.state for c in components(tls_stack)] == ["up", "up"]  # ruok over TLS


def test_ledger_over_tls_registers_a_subject_and_commits_an_epoch(tls_stack: StackInfo,
                                                                  tls_env: dict[str, str]) -> None:
    name = f"tls-{uuid.uuid4().hex[:8]}"
    with Ledger.connect(tls_stack.zk, f"/tls-{uuid.uuid4().hex[:8]}", timeout=15) as ledger:
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
        lease = ledger.claims.claim(name, "sink", "0", [0], lambda: {0: 0})
        ledger.commits.ensure_epoch(name, lease.next_epoch, None)
        ledger.commits.commit(lease, lease.next_epoch, lease.node.incarnation, {0: Range(start=0, end=0)})
        assert ledger.epochs.is_committed(name, lease.next_epoch)
        assert ledger.zk.kazoo.use_ssl


def test_plaintext_client_on_the_secure_port_is_one_clear_error(tls_stack: StackInfo, tmp_path: Path) -> None:
    with pytest.raises(UnreachableError, match=r"is a TLS \(secure\) client port .* set ALIGNER_ZK_TLS_CA"):
        Ledger.connect(tls_stack.zk, "/tls-plain", timeout=15)
    res = run_cli(_cli_env(tmp_path, ALIGNER_ZK=tls_stack.zk, ALIGNER_KAFKA=tls_stack.kafka), "status")
    assert res.returncode == 1, res
    line = _one_line(res.stderr)
    assert line.startswith(f"aligner: error: cannot reach ZooKeeper at {tls_stack.zk}") and "ALIGNER_ZK_TLS_CA" in line


def test_status_with_the_tls_environment_works(tls_stack: StackInfo, tmp_path: Path) -> None:
    res = run_cli(_cli_env(tmp_path, **tls_stack.env()), "status", "--json")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr


def test_untrusted_server_certificate_and_missing_client_certificate(tls_stack: StackInfo, tls_env: dict[str, str],
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    other = make_tls(tmp_path)  # another throwaway CA: ZooKeeper's certificate is not signed by it
    monkeypatch.setenv("ALIGNER_ZK_TLS_CA", str(other.ca))
    with pytest.raises(UnreachableError, match=r"certificate at .* is not accepted"):
        Ledger.connect(tls_stack.zk, "/tls-other-ca", timeout=15)
    monkeypatch.setenv("ALIGNER_ZK_TLS_CA", tls_env["ALIGNER_ZK_TLS_CA"])
    monkeypatch.delenv("ALIGNER_ZK_TLS_CERT")
    monkeypatch.delenv("ALIGNER_ZK_TLS_KEY")
    with pytest.raises(UnreachableError, match="refused the TLS client certificate"):
        Ledger.connect(tls_stack.zk, "/tls-no-cert", timeout=15)


def test_tls_client_on_a_plaintext_port_is_one_clear_error(stack: StackInfo, tls_stack: StackInfo,
                                                           tls_env: dict[str, str]) -> None:
    with pytest.raises(UnreachableError, match="is a plaintext client port, not TLS"):
        Ledger.connect(stack.zk, "/tls-on-plain", timeout=15)


def test_tls_settings_are_checked_before_connecting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in TLS_VARS:
        monkeypatch.delenv(var, raising=False)
    assert zk_security("").tls is None
    monkeypatch.setenv("ALIGNER_ZK_TLS_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(AlignerError, match=r"ALIGNER_ZK_TLS_CA: cannot read .*missing\.pem \(no such file"):
        zk_security("")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    monkeypatch.setenv("ALIGNER_ZK_TLS_CA", str(tmp_path / "junk.pem"))
    with pytest.raises(AlignerError, match="not usable PEM"):
        zk_security("")
    files = make_tls(tmp_path)
    monkeypatch.setenv("ALIGNER_ZK_TLS_CA", str(files.ca))
    monkeypatch.setenv("ALIGNER_ZK_TLS_CERT", str(files.client_cert))
    with pytest.raises(AlignerError, match="go together"):
        zk_security("")
    monkeypatch.setenv("ALIGNER_ZK_TLS_KEY", str(files.client_key))
    opts = zk_security("").kazoo_options()
    assert opts["use_ssl"] and opts["check_hostname"] and opts["ca"] == str(files.ca)


@pytest.fixture
def detached_home(tmp_path: Path) -> Iterator[dict[str, str]]:
    """CLI environment of a private ALIGNER_HOME; its detached stack is stopped on every path."""
    env = _cli_env(tmp_path / "home")
    yield env
    detached_stack_down(env)


def test_stack_up_zk_tls_env_and_status(detached_home: dict[str, str]) -> None:
    up = run_cli(detached_home, "stack", "up", "--zk-tls")
    assert up.returncode == 0, up.stderr
    assert "over TLS: started" in up.stdout
    exports = run_cli(detached_home, "stack", "env", "--json")
    assert exports.returncode == 0, exports.stderr
    env = json.loads(exports.stdout)
    assert set(TLS_VARS) <= env.keys()
    status = run_cli({**detached_home, **env}, "status", "--json")
    assert status.returncode == 0, status.stderr
    found = run_cli(detached_home, "status", "--json")  # no exports: the stack's state file names the files
    assert found.returncode == 0, found.stderr
    states = run_cli(detached_home, "stack", "status", "--json")
    assert [c["state"] for c in json.loads(states.stdout)["components"]] == ["up", "up", "up"]  # retention too
    again = run_cli(detached_home, "stack", "up", "--zk-tls", "--json")  # a TLS stack keeps running as it is
    assert again.returncode == 0 and json.loads(again.stdout)["actions"] == {"zookeeper": "running",
                                                                            "kafka": "running",
                                                                            "retention": "running"}, again.stderr
