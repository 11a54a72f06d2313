"""The chaos checker, short: the whole chain under a seeded nemesis of at least 10 faults, 0 anomalies.

It runs ``python -m experiments.chaos`` as a child process (in a session of its own, so the fixture
can stop it and, through it, every component it started), with a bound of 3 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("faust")

ROOT = Path(__file__).resolve().parent.parent
SEED, FAULTS = 11, 10


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The chaos checker process; SIGTERM (it unwinds and stops every component), then SIGKILL."""
    out = tmp_path / "chaos"
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.chaos", "--seed", str(SEED), "--faults", str(FAULTS),
         "--duration", "45", "--rate", "100", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_short_seeded_chaos_run_has_no_anomalies(chaos: tuple[subprocess.Popen[str], Path]) -> None:
    proc, out = chaos
    try:
        output, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("the chaos run took longer than 3 minutes")
    report = json.loads((out / f"seed-{SEED}.json").read_text())
    assert report.get("error") is None, output[-4000:]
    assert report["faults_total"] >= FAULTS, report["faults_by_kind"]
    assert not report["observations"], report["observations"]
    totals = report["check"]["anomalies"]["totals"]
    assert sum(totals.values()) == 0, (totals, report["check"]["anomalies"]["examples"])
    assert report["check"]["records_checked"] > 0
    assert report["swap_committed"] and report["check"]["swap"]["v2_records"] > 0
    assert (out / f"seed-{SEED}.png").stat().st_size > 0
    assert proc.returncode == 0, output[-4000:]
