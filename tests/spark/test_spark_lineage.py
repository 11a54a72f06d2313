"""Lineage of Spark queries running as aligned jobs, across driver kills and a hot-swap.

Q1 (a running count) writes the target; its driver is SIGKILLed while a micro-batch is planned but not
committed (its write task held inside the open Kafka transaction), once outside a swap and once at a
swap step, and restarted from its checkpoint each time. Q2 (a running sum, following Q1) starts only after
Q1 wrote several epochs, so its first micro-batch rebuilds its state over many of Q1's job epochs at once
and voids them. After the swap, every committed target epoch's lineage (what ``aligner lineage``, a
consistent cut and ``aligner verify`` answer) must hold the input epochs its rows carry, and no input
epoch may be in the lineage of two target epochs.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from aligner.connectors.subjects import create_subject
from aligner.coordinator.hotswap import HotSwap
from tests.helpers import as_args, wait_for
from tests.spark_queries import LIVE, Query, consumers, verify_running
from tests.swaps import committed, precommit_acked

pytest.importorskip("pyspark")


def _hold(arm: Path, held: Path) -> tuple[str, ...]:
    """Options of the tests' faulty sink: slot 0's first write attempt of a micro-batch holds while ``arm``
    exists (taking it)."""
    opts = {"hangTask": "*/0", "hangAt": "write", "hangFile": str(held), "hangArm": str(arm)}
    return tuple(as_args("--sink-option", opts))


@pytest.mark.parametrize("step", ["precommit", pytest.param("commit", marks=pytest.mark.long)])
def test_lineage_of_every_target_epoch_is_what_its_rows_read(stack, root, ledger, subject_name, spawn, tmp_path,
                                                              step):
    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 4)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=100_000, pace=0.1, until=more)
    arm, held = tmp_path / "arm", tmp_path / "held"
    old = Query(spawn, stack, root, raw, target, f"{raw}-q1", "1", "0,1", tmp_path / "q1", extra=_hold(arm, held))
    new = Query(spawn, stack, root, raw, target, f"{raw}-q2", "2", "2,3", tmp_path / "q2", follows=old.job)

    def healthy() -> None:
        for q in (old, new):
            if q.worker is not None:
                q.healthy()

    def kill_in_a_batch(last: int | None = None) -> None:
        """SIGKILL Q1's driver with a micro-batch planned (its offsets logged, its job epoch fixed) and not
        committed, then restart it from its checkpoint. ``last``: Q1 writes no batch after this target epoch
        (the swap epoch); when it wrote that one before a batch could hold, it is killed where it stands."""
        held.unlink(missing_ok=True)
        arm.write_text("")
        wait_for(lambda: held.exists() or (last is not None and (ledger.epochs.frontier(target) or -1) >= last), LIVE,
                 "Q1's write task to hold inside a micro-batch", on_wait=healthy)
        arm.unlink(missing_ok=True)
        old.kill()
        old.launch().ready()

    old.launch().ready()
    wait_for(lambda: (ledger.epochs.frontier(target) or -1) >= 2, LIVE, "Q1 writing", on_wait=healthy)
    kill_in_a_batch()
    wait_for(lambda: (ledger.epochs.frontier(target) or -1) >= 6, LIVE, "Q1 writing after its restart", on_wait=healthy)

    jobs = ledger.jobs
    new.launch().ready()  # late: its first batch covers every job epoch Q1 fixed so far
    wait_for(lambda: any(c.job_epoch is not None for c in consumers(jobs, new.job, raw).values()), LIVE,
             "Q2 following", on_wait=healthy)
    swapper = HotSwap(ledger)
    o, n = swapper.check(old.job, new.job, target)
    swap, version = precommit_acked(swapper, o, n, LIVE, healthy)
    if step == "commit":
        swap = committed(swap)
        jobs.write_swap(swap, version)
    kill_in_a_batch(last=swap.epoch)
    assert swapper.run(o.job, n.job, target, timeout=LIVE).phase == "done"

    assert old.worker is not None
    old.worker.wait_line(lambda line: line == "swapped out", LIVE)
    assert old.worker.wait(LIVE) == 0, old.worker.stderr
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "Q2 output after the swap",
             on_wait=healthy)
    more.set()
    sent = gen.finished()
    last = ledger.epochs.frontier(raw)
    wait_for(lambda: (jobs.consumers(new.job, raw)[0].subject_epoch or -1) >= last, LIVE,
             "Q2 to read the whole input", on_wait=healthy)
    verify_running(ledger, stack, target, sent, swap.epoch)  # exactly once, and every epoch's lineage
