"""Every benchmark the docs cite runs at HEAD: a smoke run of each at tiny sizes (seconds, no timing
assertion), so a benchmark cannot rot unnoticed, nor compare arms that did different work: each benchmark in
WORK records what every arm of its ratios did, and the arms must agree. Results go to a temporary folder
(ALIGNER_RESULTS). A crash of native code (bench_state died of SIGSEGV once in a loaded fresh-clone run, never
alone) prints every thread's Python stack through faulthandler, into the failure message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SMOKE = {
    "bench_sink": ["--rounds", "1", "--records", "20000", "--warm-epochs", "20",
                   *(["--pin"] if (os.cpu_count() or 1) >= 2 else [])],
    "bench_batches": ["--epochs", "2", "--rate", "100"],
    "bench_zk_ops": ["--epochs", "2", "--records", "2", "--kazoo-ops", "20"],
    "bench_zk_scale": ["--producers", "4", "--rate", "2", "--seconds", "2", "--processes", "1", "--pipelined"],
    "bench_reader": ["--records", "20000", "--rounds", "1"],
    "bench_pipeline": ["--records", "20000", "--rounds", "1", "--warm-epochs", "20", "--peer", "no"],
    "bench_state": ["--keys", "2000", "--epochs", "2", "--rounds", "1"],
    "bench_handover": ["--keys", "2000", "--rounds", "1"],
    "bench_state_ops": ["--keys", "2000", "--ops", "1000", "--rounds", "1"],
    "bench_producer_start": ["--starts", "3"],
    "bench_workers": ["--records", "20000", "--rounds", "1"],
    "bench_latency": ["--epochs", "20", "--rounds", "1", "--warmup", "1", "--rate", "200"],
    "bench_console": ["--subjects", "4", "--jobs", "2", "--epochs", "200", "--rounds", "1", "--window", "6"],
    "bench_status": ["--epochs", "3000", "--rounds", "1", "--keep", "100"],
    "bench_spark_read": ["--records", "20000", "--rounds", "1"],
    "bench_spark_hop": ["--minutes", "0.3", "--plain-minutes", "0.2"],
    "bench_spark_swap": ["--swaps", "1", "--steady", "5"],
    "bench_spark_pipeline": ["--records", "20000", "--rounds", "1"],
    "bench_faust": ["--records", "5000", "--rounds", "1"],
}
"""Each benchmark of the docs' Benchmarks table with arguments that make it run for seconds, not minutes (bench_faust
takes about a minute: the plain Faust arm's first JoinGroup on the embedded broker alone takes ~30 s with Faust's
defaults)."""

WORK = {"bench_sink", "bench_reader", "bench_pipeline", "bench_workers", "bench_state", "bench_handover",
        "bench_state_ops", "bench_spark_read", "bench_producer_start", "bench_spark_pipeline", "bench_faust"}
"""The benchmarks whose ratios compare arms that must do the same work: each records ``work`` per arm and the
``comparable`` fields (experiments.common.work_results), and every arm must agree on each of those. The others
record none: one arm against a figure (latency, hop, swap gap, batches), counts rather than rates
(bench_zk_ops), or arms whose work differs by design (status and console: the least read against the product's;
bench_zk_scale: rate-driven arms compared per commit)."""


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_benchmark_runs_at_head(name: str, tmp_path: Path) -> None:
    if name.startswith("bench_spark"):
        pytest.importorskip("pyspark")
    env = {**os.environ, "ALIGNER_RESULTS": str(tmp_path), "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-X", "faulthandler", "-m", f"experiments.{name}", *SMOKE[name]],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name} did not finish a smoke run in 9 minutes: {str(exc.stdout or '')[-2000:]}")
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    result = tmp_path / f"{name}.json"
    assert result.exists(), f"{name} wrote no results to {tmp_path}"
    results = json.loads(result.read_text())
    assert results, f"{name} wrote empty results"
    if name in WORK:
        assert_same_work(name, results)


def assert_same_work(name: str, results: dict[str, Any]) -> None:
    """Every arm of ``name`` did the same work in each field it calls comparable, and did some."""
    work: dict[str, dict[str, int]] = results.get("work") or {}
    comparable: list[str] = results.get("comparable") or []
    assert len(work) >= 2, f"{name} recorded no work per arm: {work}"
    assert "records" in comparable, f"{name}: records must be comparable, not only {comparable}"
    for field in comparable:
        seen = {arm: w[field] for arm, w in work.items()}
        assert len(set(seen.values())) == 1, f"{name}: the arms did different work ({field}): {seen}"
        assert next(iter(seen.values())) > 0, f"{name}: no arm did any work ({field}): {seen}"
