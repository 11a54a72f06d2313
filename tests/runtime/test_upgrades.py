"""Upgrades in a row, short: ``python -m experiments.upgrades --plan ...`` (runtime -> runtime -> Faust ->
Spark -> runtime, 2 -> 4 -> 1 workers -> 4 write tasks -> 2 workers, a random party SIGKILLed in each swap)
checks every record itself; the test runs it as a child process in a session of its own (stopped on every
path) and reads its report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import experiment_process

pytest.importorskip("faust")
pytest.importorskip("pyspark")


@pytest.mark.long  # 4.5 minutes; make test keeps each engine's swaps and rescales (test_hotswap, test_spark_swap)
def test_four_upgrades_in_a_row_mixing_engines_and_parallelism(tmp_path: Path) -> None:
    out = tmp_path / "upgrades"
    plan = "runtime:2,runtime:4,faust:1,spark:4,runtime:2"
    with experiment_process("experiments.upgrades", "--plan", plan, "--seed", "19", "--out", str(out)) as proc:
        try:
            output, _ = proc.communicate(timeout=900)  # ~3 minutes alone; a liveness bound for a busy machine
        except subprocess.TimeoutExpired:
            pytest.fail("four upgrades took longer than 15 minutes")
    report = json.loads((out / "upgrades.json").read_text())
    assert report["anomalies"] == [], output[-4000:]
    check = report["check"]
    assert check["records"] == check["inputs_acked"] > 0
    assert (check["duplicated"], check["lost"], check["wrong_version"]) == (0, 0, 0)
    assert (check["keys_out_of_order"], check["keys_moved"], check["target_partitions"]) == (0, 0, 4)
    assert [(s["engine"], s["workers"]) for s in report["swaps"]] == [
        ("runtime", 4), ("faust", 1), ("spark", 4), ("runtime", 2)]
    assert all(s["killed"] for s in report["swaps"]), report["swaps"]
    gc, last_swap = check["gc"], report["swaps"][-1]["S"]  # swapped-out producers go once below retention
    assert gc["producers"] == {"job-v1": 0, "job-v2": 0, "job-v3": 0,
                               "job-v4": 0 if gc["first_retained"] > last_swap else 4, "job-v5": 2}, gc
    assert proc.returncode == 0, output[-4000:]
