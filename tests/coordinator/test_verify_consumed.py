"""`aligner verify --consumed SUBJECT --job A --job B`: did the jobs consume identical whole epochs?

Real stack throughout. Two runtime jobs on different checkpoint timers, aligned by the coordinator,
consumed the same epochs, every checkpoint on an epoch boundary (their workers' committed positions
included); job epochs fixed by hand through the ledger show a skipped epoch and an epoch read twice;
an unknown job is one clear line, exit 1.
"""

from __future__ import annotations

import json
import threading

from aligner.connectors.runtime import JobSpec
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.models import JobNode, Span
from tests.conftest import run_cli
from tests.helpers import wait_for
from tests.jobs import tag_v1

LIVE = 120
"""Liveness bound (seconds) on waits: generous, for a busy machine; never a speed check."""


def _consumed(cli_env, subject: str, *jobs: str):
    args = ["verify", "--consumed", subject, *(a for j in jobs for a in ("--job", j))]
    return run_cli(cli_env, *args, "--json"), run_cli(cli_env, *args)


def test_two_aligned_runtime_jobs_consumed_identical_epochs(stack, root, ledger, subject_name, cli_env, spawn):
    raw = subject_name
    create_subject(ledger, stack.kafka, raw, 2)
    aligned = threading.Event()
    gen = spawn.generator(raw, epochs=12, pace=0.1, hold=aligned)
    coordinator = Coordinator(ledger)
    for job, interval in (("a", 0.3), ("b", 0.7)):  # own checkpoints that differ until the alignment
        create_subject(ledger, stack.kafka, f"{raw}-{job}", 2)
        spawn.job(JobSpec(job=f"{raw}-{job}", inputs=(raw,), output=f"{raw}-{job}", interval=interval), tag_v1)
    for job in ("a", "b"):
        assert coordinator.align(f"{raw}-{job}", timeout=LIVE).job_epoch is not None
    aligned.set()
    gen.finished()
    last = ledger.epochs.frontier(raw)
    assert last is not None
    jobs = ledger.jobs
    for job in ("a", "b"):
        def consumed_all(job: str = job) -> bool:
            return (jobs.consumers(f"{raw}-{job}", raw)[0].subject_epoch or -1) >= last

        wait_for(consumed_all, LIVE, f"job {job} to consume every epoch")

    as_json, text = _consumed(cli_env, raw, f"{raw}-a", f"{raw}-b")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["differences"] == []
    assert report["last"] == last and report["identical"] == last - report["first"] + 1 >= 12
    for r in report["jobs"]:
        assert r["aligned_from_boundary"] is True, r  # its last unaligned checkpoint ended on an epoch boundary
        assert r["consumed"][-1][1] == last and len(r["consumed"]) == 1
    assert text.returncode == 0, text.stderr
    assert f"identical {raw}-a, {raw}-b consumed the same {report['identical']} whole epochs" in text.stdout


def _job_with_epochs(ledger, kafka: str, raw: str, job: str, spans: list[tuple[int, int]]) -> None:
    """A registered aligned job whose job epochs cover ``spans`` of ``raw``, its output committed for each."""
    out = f"{job}-out"
    create_subject(ledger, kafka, out, 1)
    ledger.jobs.register(JobNode(job=job, inputs=(raw,), output=out, parallelism=1, mode="aligned"))
    with SinkProducer(ledger, kafka, out, job, 0, [0]) as producer:
        for e, (first, last) in enumerate(spans):
            ledger.jobs.fix_job_epoch(job, e, {raw: Span(first=first, last=last)}, {raw: last + 1})
            producer.begin()
            producer.commit()


def test_differing_jobs_and_unknown_job_fail_with_one_line(stack, root, ledger, subject_name, cli_env):
    raw = subject_name
    create_subject(ledger, stack.kafka, raw, 2)
    with SinkProducer(ledger, stack.kafka, raw, "feed", 0, [0, 1]) as producer:
        for e in range(8):
            producer.begin()
            producer.send(json.dumps({"e": e}).encode(), key=b"k")
            producer.commit()
    _job_with_epochs(ledger, stack.kafka, raw, f"{raw}-x", [(0, 0), (1, 3), (4, 7)])
    _job_with_epochs(ledger, stack.kafka, raw, f"{raw}-y", [(0, 2), (3, 7)])
    _job_with_epochs(ledger, stack.kafka, raw, f"{raw}-gap", [(0, 1), (3, 7)])
    _job_with_epochs(ledger, stack.kafka, raw, f"{raw}-twice", [(0, 3), (3, 7)])

    as_json, text = _consumed(cli_env, raw, f"{raw}-x", f"{raw}-y")
    assert as_json.returncode == text.returncode == 0, (as_json.stderr, text.stderr)
    assert json.loads(as_json.stdout)["identical"] == 8

    as_json, text = _consumed(cli_env, raw, f"{raw}-x", f"{raw}-gap")
    assert as_json.returncode == text.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["identical"] == 0 and report["differences"], report
    line = text.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("differ: "), text.stderr
    assert f"{raw}-gap" in line and "2" in line and "Traceback" not in text.stderr

    as_json, text = _consumed(cli_env, raw, f"{raw}-y", f"{raw}-twice")
    assert text.returncode == 1 and "more than once" in text.stderr, text.stderr
    assert any("epochs 3 of" in d for d in json.loads(as_json.stdout)["differences"])

    _, text = _consumed(cli_env, raw, f"{raw}-x", f"{raw}-nobody")
    assert text.returncode == 1, text.stdout
    assert len(text.stderr.strip().splitlines()) == 1 and f"{raw}-nobody" in text.stderr, text.stderr
    assert "Traceback" not in text.stderr

    usage = run_cli(cli_env, "verify", "--consumed", raw, "--job", f"{raw}-x")
    assert usage.returncode == 2 and "two different --job" in usage.stderr, usage.stderr
