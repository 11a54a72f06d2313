"""Crash recovery of jobs and coordinators, with real SIGKILLs of real processes."""

from __future__ import annotations

import random
import threading

from aligner.alignment import State
from aligner.connectors.runtime import JobSpec
from aligner.connectors.subjects import create_subject
from aligner.coordinator.gc import collect
from aligner.retention_policy import RetentionPolicy
from tests.helpers import wait_for
from tests.jobs import tag_v1
from tests.streams import assert_exactly_once, read_all

KILLS = 20
LIVE = 180
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""


def assert_counts_run_on(outputs: list[tuple[int, dict]]) -> None:
    """The keyed per-partition counts of ``count_v1``/``count_batch`` run 1..n on each of the 2 partitions:
    restored state neither skipped nor repeated an input."""
    for p in (0, 1):
        counts = sorted(v["count"] for _, v in outputs if v["p"] == p)
        assert counts == list(range(1, len(counts) + 1)), f"partition {p}: the restored counts skip or repeat"


def test_job_killed_twenty_times_outputs_every_result_once(stack, root, ledger, subject_name, spawn):
    raw, x = subject_name, f"{subject_name}-x"
    for n in (raw, x):
        create_subject(ledger, stack.kafka, n, 2)
    kills_done = threading.Event()
    gen = spawn.generator(raw, epochs=5000, per_epoch=10, pace=0.02, until=kills_done)
    args = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--job", f"{raw}-k",
            "--function", "tests.jobs:tag_v1", "--input", raw, "--output", x, "--interval", "0.05"]
    rng = random.Random(7)
    attempts = []
    for _ in range(KILLS):
        w = spawn.worker("aligner.connectors.runtime.worker", *args)
        opened = w.wait_line(lambda line: line.startswith("open"), timeout=LIVE)
        attempts.append(opened)
        # Kill at a random point: right after opening, mid-epoch, or after some commits.
        for _ in range(rng.randrange(0, 3)):
            w.wait_line(lambda line: line.startswith("committed") or line == "done", timeout=LIVE)
        threading.Event().wait(rng.uniform(0, 0.05))  # a random kill point, not a wait for anything
        w.kill()
    kills_done.set()
    gen.finished()
    w = spawn.worker("aligner.connectors.runtime.worker", *args)
    w.finish(timeout=LIVE)
    assert len({a.split("attempt=")[1] for a in attempts}) == KILLS
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)


def test_state_bases_let_retention_collect_the_changelog_and_kills_restore_exactly(stack, root, ledger,
                                                                                   subject_name, spawn):
    """A stateful job writes its whole state every 3 epochs (its state base); retention passes collect its
    changelog below the bases while the worker is SIGKILLed again and again. Every restart restores from a
    base above the collected epochs: every result once, and the per-partition counts (keyed state) run on
    without a gap or a repeat."""
    raw, x = subject_name, f"{subject_name}-x"
    for n in (raw, x):
        create_subject(ledger, stack.kafka, n, 2)
    job, kills_done = f"{raw}-s", threading.Event()
    changelog = f"{job}.state"
    gen = spawn.generator(raw, epochs=5000, per_epoch=10, pace=0.02, until=kills_done)
    args = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--job", job, "--function",
            "tests.jobs:count_v1", "--input", raw, "--output", x, "--interval", "0.05", "--state-snapshot-every", "3"]
    tight = RetentionPolicy(hours=0, min_epochs=2)
    for _ in range(6):
        w = spawn.worker("aligner.connectors.runtime.worker", *args)
        for _ in range(4):
            w.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
        collect(ledger, policy=tight, subjects=[changelog])  # the output stays whole, to be counted
        w.kill()
    assert ledger.subjects.first_retained(changelog) > 0, "retention never collected the changelog"
    kills_done.set()
    gen.finished()
    spawn.worker("aligner.connectors.runtime.worker", *args).finish(timeout=LIVE)
    outputs = read_all(ledger, stack.kafka, x)
    assert_exactly_once(outputs, gen.sent)
    assert_counts_run_on(outputs)
    jobs = ledger.jobs
    records = jobs.worker_epochs(job, 0)
    assert records and all(r.state_base is not None and 0 <= r.epoch - r.state_base < 3 for r in records.values())


def test_batch_job_killed_again_and_again_outputs_every_result_once(stack, root, ledger, subject_name, spawn):
    """A batch job function (``@batch``: one call per fetch) under SIGKILLs: every result once, the keyed
    per-partition counts run on without a gap or a repeat, each call's records commit in one job epoch, and
    the calls really got batches."""
    raw, x = subject_name, f"{subject_name}-x"
    for n in (raw, x):
        create_subject(ledger, stack.kafka, n, 2)
    kills_done = threading.Event()
    gen = spawn.generator(raw, epochs=5000, per_epoch=10, pace=0.02, until=kills_done)
    args = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--job", f"{raw}-b",
            "--function", "tests.jobs:count_batch", "--input", raw, "--output", x, "--interval", "0.05"]
    for _ in range(5):
        w = spawn.worker("aligner.connectors.runtime.worker", *args)
        for _ in range(3):
            w.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
        w.kill()
    kills_done.set()
    gen.finished()
    spawn.worker("aligner.connectors.runtime.worker", *args).finish(timeout=LIVE)
    outputs = read_all(ledger, stack.kafka, x)
    assert_exactly_once(outputs, gen.sent)
    assert_counts_run_on(outputs)
    calls: dict[tuple[int, int], set[int]] = {}
    for epoch, v in outputs:
        calls.setdefault(tuple(v["b"]), set()).add(epoch)
    assert all(len(epochs) == 1 for epochs in calls.values()), "a batch's results span output epochs"
    assert max(v["n"] for _, v in outputs) > 1, "every call got a single record: no batch path"
    assert len(calls) < len(outputs)


def test_coordinator_killed_between_catch_up_and_aligned_resumes(stack, ledger, subject_name, cli_env, spawn):
    raw, x = subject_name, f"{subject_name}-x"
    for n in (raw, x):
        create_subject(ledger, stack.kafka, n, 2)
    job = f"{raw}-c"
    resumed = threading.Event()
    gen = spawn.generator(raw, epochs=20, pace=0.04, hold=resumed)
    t = spawn.job(JobSpec(job=job, inputs=(raw,), output=x, interval=0.5), tag_v1)
    jobs = ledger.jobs
    wait_for(lambda: bool(jobs.consumers(job, raw)), LIVE, "the consumer to report")

    def recorded_aligning() -> bool:
        decision = jobs.decision(job)[0]
        return decision is not None and decision.phase == "aligning"

    first = spawn.worker("aligner.coordinator", "align", job, "--json", env=cli_env)
    wait_for(recorded_aligning, LIVE, "the coordinator to record its Align decision", on_wait=first.healthy)
    first.kill()
    decision = jobs.decision(job)[0]
    assert decision is not None
    phase = decision.phase
    assert phase == "aligning" and jobs.source_state(job, raw).state is not State.ALIGNED

    second = spawn.worker("aligner.coordinator", "align", job, "--json", env=cli_env)
    assert second.wait(LIVE) == 0, second.stderr
    decision = jobs.decision(job)[0]
    assert decision is not None and decision.phase == "aligned"
    assert jobs.source_state(job, raw).state is State.ALIGNED
    resumed.set()  # 20 more epochs through the aligned job
    gen.finished()
    t.join()
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)
