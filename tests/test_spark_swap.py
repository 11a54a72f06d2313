"""Hot-swap of Spark Structured Streaming queries (issue 13): Q1 -> Q2 exactly once, resumable.

Q1 keeps a running count per key, Q2 (a new checkpoint, incompatible state) a running sum; each runs
as an aligned job in its own driver process (tests/workers/spark_swap.py) under continuous input.
The coordinator pre-commits S, both queries acknowledge it; then one party dies at a swap step (the
coordinator, Q1's driver or Q2's driver, SIGKILLed at pre-commit or at commit) and is restarted (a
driver from its checkpoint, the coordinator as `aligner hotswap`). Every input's result reaches the
target exactly once, from Q1 for input epochs <= S and from Q2 after, and Q2's state was rebuilt
from the start of the input.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import defaultdict

import pytest

from aligner.connectors.subjects import create_subject
from aligner.coordinator.hotswap import HotSwap
from aligner.coordinator.stack import wait_for
from aligner.jobs import JobLedger
from aligner.models import ContributionNode
from tests.helpers import Worker
from tests.streams import assert_exactly_once, read_all

pytest.importorskip("pyspark")

LIVE = 300
"""Liveness bound (seconds) on waits for Spark drivers: generous, for a busy machine; never a speed check."""


class Query:
    """One version's driver process; restartable from its checkpoint, SIGKILLed with its JVM."""

    def __init__(self, spawn, stack, root, raw: str, target: str, job: str, version: str, partitions: str,
                 checkpoint, follows: str | None = None) -> None:
        self.spawn = spawn
        self.args = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--source", raw, "--target", target,
                     "--job", job, "--version", version, "--partitions", partitions, "--checkpoint", str(checkpoint),
                     *(["--follows", follows] if follows else [])]
        self.job = job
        self.worker: Worker | None = None
        self.jvm = 0

    def start(self) -> Query:
        self.worker = self.spawn.worker("tests.workers.spark_swap", *self.args)
        self.jvm = int(self.worker.wait_line(lambda line: line.startswith("jvm "), LIVE).split()[1])
        self.worker.wait_line(lambda line: line.startswith("query "), LIVE)
        return self

    def healthy(self) -> None:
        assert self.worker is not None
        if self.worker.proc.poll() not in (None, 0):
            self.worker.healthy()

    def kill(self) -> None:
        """SIGKILL the driver JVM and the Python driver process."""
        assert self.worker is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.jvm, signal.SIGKILL)
        self.worker.kill()
        wait_for(lambda: not _alive(self.jvm), 30, f"the Spark driver JVM {self.jvm} to die")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _precommit_acked(swapper: HotSwap, o, n, on_wait):
    """Pre-commit S and wait until both queries acknowledged it; a later S when one saw it too late."""
    swap, version = swapper._precommit(o, n, None, -1, None)
    acks = ["waiting"]

    def settled() -> bool:
        acks.append(swapper._acks(o, n, swap))
        return acks[-1] != "waiting"

    while True:
        wait_for(settled, LIVE, f"both queries to acknowledge S={swap.epoch}", on_wait=on_wait)
        if acks[-1] == "all":
            return swap, version
        swap, version = swapper._precommit(o, n, swap, version, None)


def _verify(ledger, stack, target: str, sent: int, swap_epoch: int) -> None:
    outputs = read_all(ledger, stack.kafka, target)
    assert_exactly_once(outputs, sent)
    by_key: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    for epoch, value in outputs:
        assert value["v"] == (1 if epoch <= swap_epoch else 2), f"epoch {epoch} holds a v{value['v']} result"
        by_key[value["k"]].append((value["in"]["n"], value))
    assert any(e > swap_epoch for e, _ in outputs) and any(e <= swap_epoch for e, _ in outputs)
    for k, rows in by_key.items():
        rows.sort(key=lambda r: r[0])
        total = 0
        for rank, (n, value) in enumerate(rows, 1):
            total += n
            if value["v"] == 1:
                assert value["count"] == rank, f"key {k}: v1 counted {value['count']} at input {n}, not {rank}"
            else:  # v2 rebuilt its state from the start of the input: its running sums include v1's inputs
                assert value["sum"] == total, f"key {k}: v2 summed {value['sum']} at input {n}, not {total}"
    times = []
    for e in (swap_epoch, swap_epoch + 1):
        path = ledger.layout.epoch(target, e)
        times.append(max(ledger.read(ContributionNode, f"{path}/{c}")[0].committed_at
                         for c in ledger.zk.get_children(path)))
    assert times[0] <= times[1], f"Q2 committed S+1 = {swap_epoch + 1} before Q1 committed S"


@pytest.mark.parametrize("who", ["coordinator", "old", "new"])
@pytest.mark.parametrize("step", ["precommit", "commit"])
def test_spark_query_hotswap_survives_a_kill_exactly_once(stack, root, ledger, subject_name, cli_env, spawn,
                                                          tmp_path, who, step):
    started = time.monotonic()
    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 4)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=100_000, pace=0.1, until=more)
    old = Query(spawn, stack, root, raw, target, f"{raw}-q1", "1", "0,1", tmp_path / "q1").start()
    new = Query(spawn, stack, root, raw, target, f"{raw}-q2", "2", "2,3", tmp_path / "q2", follows=old.job)
    queries = {"old": old, "new": new}

    def healthy() -> None:
        for q in queries.values():
            if q.worker is not None:
                q.healthy()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}", flush=True)

    mark("Q1 started")
    wait_for(lambda: (ledger.frontier(target) or -1) >= 1, LIVE, "Q1 writing", on_wait=healthy)
    mark("Q1 writing")
    new.start()
    mark("Q2 started")
    jobs = JobLedger(ledger)
    wait_for(lambda: any(c.job_epoch is not None for c in jobs.consumers(new.job, raw).values()), LIVE,
             "Q2 following", on_wait=healthy)
    mark("Q2 following")
    swapper = HotSwap(ledger)
    o, n = swapper.check(old.job, new.job, target)
    swap, version = _precommit_acked(swapper, o, n, healthy)
    mark(f"S = {swap.epoch} acknowledged")
    if step == "commit":
        swap = swap.model_copy(update={"phase": "commit"})
        jobs.write_swap(swap, version)
    if who == "coordinator":  # the coordinator that wrote the step is gone; `aligner hotswap` resumes
        resumed = spawn.worker("aligner.coordinator", "hotswap", "--old", old.job, "--new", new.job,
                               "--subject", target, "--json", env=cli_env)
        wait_for(lambda: resumed.proc.poll() is not None, LIVE, "aligner hotswap to finish", on_wait=healthy)
        assert resumed.proc.returncode == 0, resumed.stderr
    else:
        queries[who].kill()
        queries[who].start()
        done = swapper.run(o.job, n.job, target, timeout=LIVE)
        assert done.phase == "done"
    mark("swap done")
    done = jobs.swap(old.job)[0]
    assert done.phase == "done" and done.epoch == swap.epoch
    # Q1's sink finished after S and the query terminated cleanly (awaitTermination returned).
    old.worker.wait_line(lambda line: line == "swapped out", LIVE)
    assert old.worker.wait(LIVE) == 0, old.worker.stderr
    wait_for(lambda: (ledger.frontier(target) or 0) >= swap.epoch + 3, LIVE, "Q2 output after the swap",
             on_wait=healthy)
    mark("Q1 ended, Q2 writing")
    more.set()
    sent = gen.finished()
    last = ledger.frontier(raw)
    wait_for(lambda: (jobs.consumers(new.job, raw)[0].subject_epoch or -1) >= last, LIVE,
             "Q2 to read the whole input", on_wait=healthy)
    mark("Q2 read everything")
    _verify(ledger, stack, target, sent, swap.epoch)
    print(f"{who} killed at {step}: S = {swap.epoch}, {sent} inputs, {time.monotonic() - started:.0f}s")
