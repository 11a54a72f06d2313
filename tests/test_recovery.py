"""Crash recovery of jobs and coordinators, with real SIGKILLs of real processes."""

from __future__ import annotations

import random
import threading

from aligner.alignment import State
from aligner.jobs import JobLedger
from connectors.runtime import JobSpec
from connectors.subjects import create_subject
from coordinator.stack import wait_for
from tests.helpers import Worker
from tests.jobs import tag_v1
from tests.streams import Generator, JobThread, assert_exactly_once, read_all

KILLS = 20


def test_job_killed_twenty_times_outputs_every_result_once(stack, root, ledger, subject_name):
    raw, x = subject_name, f"{subject_name}-x"
    for n in (raw, x):
        create_subject(ledger, stack.kafka, n, 2)
    kills_done = threading.Event()
    gen = Generator(stack, root, raw, epochs=5000, per_epoch=10, pace=0.02, until=kills_done).start()
    args = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--job", f"{raw}-k",
            "--function", "tests.jobs:tag_v1", "--input", raw, "--output", x, "--interval", "0.05"]
    rng = random.Random(7)
    attempts = []
    for _ in range(KILLS):
        w = Worker("connectors.runtime", *args)
        opened = w.wait_line(lambda line: line.startswith("open"), timeout=60)
        attempts.append(opened)
        # Kill at a random point: right after opening, mid-epoch, or after some commits.
        for _ in range(rng.randrange(0, 3)):
            w.wait_line(lambda line: line.startswith("committed") or line == "done", timeout=60)
        threading.Event().wait(rng.uniform(0, 0.05))
        w.kill()
    kills_done.set()
    assert gen.done.wait(60) and not gen.error
    w = Worker("connectors.runtime", *args)
    w.finish(timeout=180)
    assert len({a.split("attempt=")[1] for a in attempts}) == KILLS
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)


def test_coordinator_killed_between_catch_up_and_aligned_resumes(stack, root, ledger, subject_name, cli_env):
    raw, x = subject_name, f"{subject_name}-x"
    for n in (raw, x):
        create_subject(ledger, stack.kafka, n, 2)
    job = f"{raw}-c"
    resumed = threading.Event()
    gen = Generator(stack, root, raw, epochs=60, pace=0.04, hold=resumed).start()
    t = JobThread(stack, root, JobSpec(job=job, inputs=(raw,), output=x, interval=0.5), tag_v1)
    jobs = JobLedger(ledger)
    wait_for(lambda: jobs.consumers(job, raw), 30, "the consumer to report")

    first = Worker("coordinator", "align", job, "--json", env=cli_env)
    wait_for(lambda: (jobs.decision(job)[0] is not None and jobs.decision(job)[0].phase == "aligning"),
             60, "the coordinator to record its Align decision")
    first.kill()
    phase = jobs.decision(job)[0].phase
    assert phase == "aligning" and jobs.source_state(job, raw).state is not State.ALIGNED

    second = Worker("coordinator", "align", job, "--json", env=cli_env)
    assert second.proc.wait(120) == 0, "".join(second._stderr)
    assert jobs.decision(job)[0].phase == "aligned"
    assert jobs.source_state(job, raw).state is State.ALIGNED
    resumed.set()
    gen.done.wait(60)
    t.join(120)
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)
