"""The chaos checker, short: the whole chain under a seeded nemesis of at least 10 faults, 0 anomalies.

It runs ``python -m experiments.chaos`` as a child process (in a session of its own, so the fixture
can stop it and, through it, every component it started), with a bound of 3 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import experiment_process

pytest.importorskip("pyspark")
pytest.importorskip("faust")

ROOT = Path(__file__).resolve().parents[2]
SEED, FAULTS = 11, 10


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The chaos checker process; SIGTERM (it unwinds and stops every component), then SIGKILL."""
    out = tmp_path / "chaos"
    with experiment_process("experiments.chaos", "--seed", str(SEED), "--faults", str(FAULTS), "--duration", "45",
                            "--rate", "100", "--out", str(out)) as proc:
        yield proc, out


@pytest.mark.long  # 2 minutes; make test keeps the schedule, checker and first-signal tests
def test_short_seeded_chaos_run_has_no_anomalies(chaos: tuple[subprocess.Popen[str], Path]) -> None:
    proc, out = chaos
    try:
        output, _ = proc.communicate(timeout=420)  # ~1 minute alone; a liveness bound for a busy machine
    except subprocess.TimeoutExpired:
        pytest.fail("the chaos run took longer than 7 minutes")
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


def test_schedule_is_a_function_of_the_seed() -> None:
    from experiments.chaos.nemesis import FAULT_WEIGHTS, schedule

    first, ops = schedule(5, 50, 120)
    assert (first, ops) == schedule(5, 50, 120)
    assert first != schedule(6, 50, 120)[0]
    assert len(first) == 50 and {f.kind for f in first} <= set(FAULT_WEIGHTS)
    assert [f.at for f in first] == sorted(f.at for f in first)
    assert all(f.duration > 10 for f in first if f.kind == "expire-session")  # beyond the session timeout
    assert [o.kind for o in ops].count("hotswap") == 1
    assert all(f.kind != "kill-faust" for f in schedule(5, 50, 120, faust=False)[0])


def test_checker_classes_count_what_they_name() -> None:
    from collections import Counter

    from experiments.chaos.checker import Anomalies, exactly_once, monotonic

    an = Anomalies()
    exactly_once(an, "a", Counter({1: 1, 2: 3, 9: 1}), {1, 2, 3, 4})
    monotonic(an, "a", [((0, 10), 5), ((0, 11), 4), ((1, 3), 1), ((0, 12), 6)])
    totals = an.totals()
    assert (totals["lost"], totals["duplicated"], totals["unexpected"], totals["non_monotonic"]) == (2, 2, 1, 1)
    assert an.as_json()["examples"]["lost"] == ["a: inputs [3, 4]"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_stops_the_runner_and_everything_it_started(
        chaos: tuple[subprocess.Popen[str], Path], sig: signal.Signals) -> None:
    """One SIGTERM (a supervisor) or SIGINT (Ctrl-C) while faults play: the runner exits within 10 s and
    leaves no process behind (its hard stop kills what did not unwind in time)."""
    from tests import guard

    proc, _ = chaos
    assert proc.stdout is not None
    playing = False
    for line in proc.stdout:  # the schedule, "stack: ...", then the faults as they happen
        playing = playing or line.startswith("stack:")
        if playing and "kill-" in line:
            break
    else:
        pytest.fail("the chaos run ended before its first fault")
    started = list(guard.descendants(proc.pid).values())
    assert started, "the run started no process"
    os.kill(proc.pid, sig)
    try:
        rc = proc.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the chaos runner did not stop within 10 s of {sig.name}")
    assert rc == 130
    deadline = time.monotonic() + 10  # killed ones are reaped by init: allow a moment
    while (left := [p for p in started if guard.alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes outlived the runner: {[str(p) for p in left]}"
