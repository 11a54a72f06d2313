"""Hot-swap of Spark Structured Streaming queries: Q1 -> Q2 exactly once, resumable.

Q1 keeps a running count per key, Q2 (a new checkpoint, incompatible state) a running sum; each runs
as an aligned job in its own driver process (tests/workers/spark_swap.py) under continuous input.
The coordinator pre-commits S, both queries acknowledge it; then one party dies at a swap step (the
coordinator, Q1's driver or Q2's driver, SIGKILLed at pre-commit or at commit) and is restarted (a
driver from its checkpoint, the coordinator as `aligner hotswap`). Every input's result reaches the
target exactly once, from Q1 for input epochs <= S and from Q2 after, and Q2's state was rebuilt
from the start of the input.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from aligner.connectors.runtime import JobSpec
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.coordinator.hotswap import HotSwap
from aligner.coordinator.verify import shadow_span, verify_before_swap, verify_outputs
from aligner.errors import HotSwapRefused
from tests.helpers import faust_worker, wait_for
from tests.jobs import tag_v1
from tests.spark_queries import LIVE, Query, consumers, verify_running
from tests.streams import read_all
from tests.swaps import committed, precommit_acked

pytest.importorskip("pyspark")



KILLS: list[tuple[str, tuple[str, ...]]] = [(step, (who,)) for step in ("precommit", "commit")
                                            for who in ("coordinator", "old", "new")]
"""One test per kill point: each party (the coordinator, Q1's driver, Q2's driver) SIGKILLed at each swap
step while the others go on. ALIGNER_SPARK_SWAP_TOGETHER=1 adds one test per step killing all three."""
if os.environ.get("ALIGNER_SPARK_SWAP_TOGETHER"):
    KILLS += [(step, ("coordinator", "old", "new")) for step in ("precommit", "commit")]


LONG = {kill for kill in KILLS if kill != ("precommit", ("old",))}
"""make test keeps Q1's driver killed at pre-commit (the runtime's swaps keep every kill point, test_hotswap);
the other kill points run in make test-long."""


@pytest.mark.parametrize(("step", "killed"), [
    pytest.param(s, k, id=f"{s}-{'+'.join(k)}", marks=[pytest.mark.long] if (s, k) in LONG else []) for s, k in KILLS])
def test_spark_query_hotswap_survives_kills_exactly_once(stack, root, ledger, subject_name, cli_env, spawn,
                                                         tmp_path, step, killed):
    started = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}", flush=True)

    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 4)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=100_000, pace=0.1, until=more)
    old = Query(spawn, stack, root, raw, target, f"{raw}-q1", "1", "0,1", tmp_path / "q1")
    new = Query(spawn, stack, root, raw, target, f"{raw}-q2", "2", "2,3", tmp_path / "q2", follows=old.job)
    queries = {"old": old, "new": new}
    for q in queries.values():  # Q2 starts beside Q1 at once: it waits for Q1's job epochs by itself
        q.launch()
    for q in queries.values():
        q.ready()
    mark("Q1 and Q2 started")

    def healthy() -> None:
        for q in queries.values():
            q.healthy()

    jobs = ledger.jobs
    wait_for(lambda: (ledger.epochs.frontier(target) or -1) >= 1 and any(
        c.job_epoch is not None for c in jobs.consumers(new.job, raw).values()), LIVE, "Q1 writing, Q2 following",
        on_wait=healthy)
    mark("Q1 writing, Q2 following")
    swapper = HotSwap(ledger)
    o, n = swapper.check(old.job, new.job, target)
    swap, version = precommit_acked(swapper, o, n, LIVE, healthy)
    mark(f"S = {swap.epoch} acknowledged")
    if step == "commit":
        swap = committed(swap)
        jobs.write_swap(swap, version)
    drivers = [queries[who] for who in killed if who != "coordinator"]
    for q in drivers:
        q.kill()
    for q in drivers:
        q.launch()
    for q in drivers:
        q.ready()
    mark(f"killed at {step}: {', '.join(killed)}; drivers restarted")
    if "coordinator" in killed:  # the coordinator that wrote the step is gone; `aligner hotswap` resumes
        resumed = spawn.worker("aligner.coordinator", "hotswap", "--old", old.job, "--new", new.job,
                               "--subject", target, "--json", env=cli_env)
        wait_for(lambda: resumed.proc.poll() is not None, LIVE, "aligner hotswap to finish", on_wait=healthy)
        assert resumed.proc.returncode == 0, resumed.stderr
    else:
        assert swapper.run(o.job, n.job, target, timeout=LIVE).phase == "done"
    mark("swap done")
    done = jobs.swap(old.job)[0]
    assert done is not None and done.phase == "done" and done.epoch == swap.epoch
    # Q1's sink finished after S and the query terminated cleanly (awaitTermination returned).
    assert old.worker is not None
    old.worker.wait_line(lambda line: line == "swapped out", LIVE)
    assert old.worker.wait(LIVE) == 0, old.worker.stderr
    assert "failed to abort" not in old.worker.stderr, old.worker.stderr
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "Q2 output after the swap",
             on_wait=healthy)
    mark("Q1 ended, Q2 writing")
    more.set()
    sent = gen.finished()
    last = ledger.epochs.frontier(raw)
    wait_for(lambda: (jobs.consumers(new.job, raw)[0].subject_epoch or -1) >= last, LIVE,
             "Q2 to read the whole input", on_wait=healthy)
    mark("Q2 read everything")
    verify_running(ledger, stack, target, sent, swap.epoch)


def test_runtime_job_swapped_for_a_spark_query_and_the_query_for_a_faust_job_exactly_once(
        stack, root, ledger, subject_name, spawn, tmp_path):
    """Cross-engine, there and back: a runtime job v1 is replaced by a Spark query v2 that
    rebuilds its own state, and the Spark query (swapped in, then out: a second upgrade) by a job v3
    in a real Faust worker. No version declares output partitions: each takes the target's two partitions
    over from the one before at its swap, across engines. The Spark query runs in shadow mode first
    (13.3): the swap is refused while its results differ from the runtime job's, and goes ahead once
    the intended differences are named; its shadow then holds exactly what it voided, up to S."""
    started = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}", flush=True)

    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 2)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=100_000, pace=0.2, until=more)
    # A shadow plans one job epoch per micro-batch (its shadow is compared epoch by epoch): v1's aligned
    # job epochs (10 input epochs, 2 s) are no faster than the query's batches, or it would fall behind.
    spec = JobSpec(job=f"{raw}-v1", inputs=(raw,), output=target, interval=1.0, epochs_per_checkpoint=10)
    v1 = spawn.job(spec, tag_v1)
    spark = Query(spawn, stack, root, raw, target, f"{raw}-q2", "2", "", tmp_path / "q2",
                  follows=spec.job, shadow=True).launch()
    Coordinator(ledger).align(spec.job, timeout=LIVE)
    spark.ready()
    jobs = ledger.jobs
    wait_for(lambda: any(c.job_epoch is not None for c in jobs.consumers(spark.job, raw).values()), LIVE,
             "the Spark query following", on_wait=spark.healthy)
    mark("Spark following")
    with pytest.raises(HotSwapRefused, match=r"differs from .* at epoch \d+"):
        verify_before_swap(ledger, stack.kafka, spec.job, spark.job, 3, timeout=LIVE)
    assert jobs.swap(spec.job)[0] is None, "a refused swap changed nothing"
    intended = ["src", "seen", "k", "sum", "v"]  # the runtime's and the query's extra fields; "in" must agree
    report = verify_before_swap(ledger, stack.kafka, spec.job, spark.job, 3, ignore=intended, timeout=LIVE)
    assert report is not None and report["first_difference"] is None and report["records"] > 0
    mark("verified")
    swapper = HotSwap(ledger)
    first = swapper.run(spec.job, spark.job, target, timeout=LIVE)
    assert first.phase == "done"
    mark("first swap done")
    v1.join(LIVE)  # the runtime job ended by itself after S
    back = f"{raw}-v3"
    v3 = faust_worker(spawn, root, str(tmp_path / "home"), back, raw, target, interval="0.3", version="3",
                      follows=spark.job)
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= first.epoch + 3 and any(
        c.job_epoch is not None for c in consumers(jobs, back, raw).values()), LIVE,
        "Spark output after the swap, and v3 following", on_wait=spark.healthy)
    mark("v3 following")
    second = swapper.run(spark.job, back, target, timeout=LIVE)
    assert second.phase == "done" and second.epoch > first.epoch
    assert spark.worker is not None
    spark.worker.wait_line(lambda line: line == "swapped out", LIVE)
    assert spark.worker.wait(LIVE) == 0, spark.worker.stderr
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= second.epoch + 3, LIVE, "v3 output after the second swap")
    mark("second swap done, v3 writing")
    more.set()
    sent = gen.finished()
    v3.wait_line(lambda line: line.startswith("finished "), LIVE)  # the input finished: v3 drains it
    mark("v3 finished")
    verify_running(ledger, stack, target, sent, first.epoch, second.epoch)
    doc, _ = ledger.subjects.writers(target)
    assert ledger.subjects.subject(target).partitions == 2
    for p in (0, 1):  # the target's partitions went from engine to engine, epochs ending and starting at S
        assert [doc.owner_of(p, e) for e in (first.epoch, first.epoch + 1, second.epoch + 1)] == [
            f"{spec.job}:0", f"{spark.job}:{p}", f"{back}:0"]
        for s in (first.epoch, second.epoch):  # from where S ended, or (a dense epoch) just past its commit marker
            end = ledger.epochs.committed(target, s).slices[p].end
            assert end <= ledger.epochs.committed(target, s + 1).slices[p].start <= end + 1
    shadow = f"{spark.job}.shadow"
    assert all(e.finished_after is not None for e in ledger.subjects.writers(shadow)[0].writers.values())
    assert all(epoch <= first.epoch for epoch, _ in read_all(ledger, stack.kafka, shadow))
    span = shadow_span(ledger, spec.job, spark.job)
    assert span is not None and span[1] == first.epoch
    whole = verify_outputs(ledger, stack.kafka, [spec.job, spark.job], *span, by_job=True, ignore=intended)
    assert whole["first_difference"] is None and whole["records"] > 0
