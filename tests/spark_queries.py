"""The stateful Spark query of the hot-swap tests (experiments/running_query.py, one driver process per
version: tests/workers/spark_swap.py) and the check of its output across swaps."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import defaultdict

from aligner.connectors.subjects import create_subject
from aligner.errors import UnknownJobError
from aligner.jobs import JobLedger
from experiments.chaos.checker import lineage_tiling
from tests.helpers import Worker, wait_for
from tests.streams import assert_exactly_once, read_all
from tests.swaps import assert_s_before_s_plus_1

LIVE = 300
"""Liveness bound (seconds) on waits for Spark drivers: generous, for a busy machine; never a speed check."""


class Query:
    """One version's driver process; restartable from its checkpoint, SIGKILLed with its JVM."""

    def __init__(self, spawn, stack, root, raw: str, target: str, job: str, version: str, partitions: str,
                 checkpoint, follows: str | None = None, shadow: bool = False, remote: str | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.spawn = spawn
        self.args = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--source", raw, "--target", target,
                     "--job", job, "--version", version, "--partitions", partitions, "--checkpoint", str(checkpoint),
                     *(["--follows", follows] if follows else []), *(["--shadow"] if shadow else []),
                     *(["--remote", remote] if remote else []), *extra]
        self.job = job
        self.worker: Worker | None = None
        self.jvm = 0

    def launch(self) -> Query:
        self.worker = self.spawn.worker("tests.workers.spark_swap", *self.args)
        return self

    def ready(self) -> Query:
        assert self.worker is not None
        self.jvm = int(self.worker.wait_line(lambda line: line.startswith("jvm "), LIVE).split()[1])
        self.worker.wait_line(lambda line: line.startswith("query "), LIVE)
        return self

    def healthy(self) -> None:
        assert self.worker is not None
        if self.worker.proc.poll() not in (None, 0):
            self.worker.healthy()

    def kill(self) -> None:
        """SIGKILL the driver JVM and the Python driver process (a Connect client: the process only)."""
        assert self.worker is not None
        self.worker.kill()
        if self.jvm <= 0:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.jvm, signal.SIGKILL)
        wait_for(lambda: not _alive(self.jvm), 30, f"the Spark driver JVM {self.jvm} to die")


def consumers(jobs: JobLedger, job: str, subject: str) -> dict:
    """The job's consumer nodes on ``subject``; none before its first worker registered it."""
    try:
        return jobs.consumers(job, subject)
    except UnknownJobError:
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True




def verify_running(ledger, stack, target: str, sent: int, *swaps: int) -> None:
    """Every input's result exactly once at the target, from version 1 up to the first swap epoch S,
    version i+1 after the i-th; a Spark v2 rebuilt its state from the start of the input."""
    outputs = read_all(ledger, stack.kafka, target)
    assert_exactly_once(outputs, sent)
    by_key: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    for epoch, value in outputs:
        expected = 1 + sum(epoch > s for s in swaps)
        assert value["v"] == expected, f"epoch {epoch} holds a v{value['v']} result, not v{expected}"
        by_key[value["in"]["n"] % 4].append((value["in"]["n"], value))
    versions = {value["v"] for _, value in outputs}
    assert versions == set(range(1, len(swaps) + 2)), f"results from versions {sorted(versions)}"
    for k, rows in by_key.items():
        rows.sort(key=lambda r: r[0])
        total = 0
        for rank, (n, value) in enumerate(rows, 1):
            total += n
            if "count" in value:  # a Spark v1's running count
                assert value["count"] == rank, f"key {k}: v1 counted {value['count']} at input {n}, not {rank}"
            elif "sum" in value:  # a Spark v2 rebuilt its state from the start of the input: all inputs so far
                assert value["sum"] == total, f"key {k}: v2 summed {value['sum']} at input {n}, not {total}"
    for s in swaps:
        assert_s_before_s_plus_1(ledger, target, s)
    assert_lineage_tiles(ledger, stack.kafka, outputs, raw_of(ledger, target), target)


def raw_of(ledger, target: str) -> str:
    """The one input of the queries writing ``target`` (every version reads the same subject)."""
    jobs = ledger.jobs
    inputs = {s for name in jobs.job_names() for s in jobs.job(name).inputs if jobs.job(name).output == target}
    assert len(inputs) == 1, f"the jobs writing {target!r} read {sorted(inputs)}"
    return inputs.pop()


def assert_lineage_tiles(ledger, kafka: str, outputs: list[tuple[int, dict]], raw: str, target: str) -> None:
    """Every aligned target epoch's lineage (what ``aligner lineage`` and a consistent cut answer) holds the
    input epochs its rows come from, and no input epoch is in the lineage of two target epochs: the lineages
    tile the input exactly as the rows do (the chaos checker's rule, :func:`lineage_tiling`)."""
    epoch_of = {value["n"]: epoch for epoch, value in read_all(ledger, kafka, raw)}
    carried: dict[int, set[int]] = defaultdict(set)
    for epoch, value in outputs:
        carried[epoch].add(epoch_of[value["in"]["n"]])
    committed = [e for e in ledger.subjects.epoch_numbers(target) if ledger.epochs.is_committed(target, e)]
    problems = lineage_tiling(ledger, target, committed, carried, raw)
    assert not problems, f"lineage of {target!r}:\n" + "\n".join(what for what, _ in problems)


class SwapPair:
    """Q1 (running count) and Q2 (running sum, following Q1) of raw -> target under continuous input, started
    and waited for until Q1 writes and Q2 follows; ``finish`` checks a committed swap through to the end.
    ``extra`` / ``remote`` go to both drivers (a cluster's master, a Connect server)."""

    def __init__(self, spawn, stack, ledger, root: str, raw: str, tmp_path, remote: str | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.ledger, self.stack, self.raw, self.target = ledger, stack, raw, f"{raw}-t"
        create_subject(ledger, stack.kafka, raw, 2)
        create_subject(ledger, stack.kafka, self.target, 4)
        self.more = threading.Event()
        self.gen = spawn.generator(raw, epochs=100_000, pace=0.1, until=self.more)
        self.old = Query(spawn, stack, root, raw, self.target, f"{raw}-q1", "1", "0,1", tmp_path / "q1",
                         remote=remote, extra=extra)
        self.new = Query(spawn, stack, root, raw, self.target, f"{raw}-q2", "2", "2,3", tmp_path / "q2",
                         follows=self.old.job, remote=remote, extra=extra)
        for q in (self.old, self.new):
            q.launch()
        for q in (self.old, self.new):
            q.ready()
        self.jobs = ledger.jobs
        wait_for(lambda: (ledger.epochs.frontier(self.target) or -1) >= 1 and any(
            c.job_epoch is not None for c in consumers(self.jobs, self.new.job, raw).values()), LIVE,
            "Q1 writing, Q2 following", on_wait=self.healthy)

    def healthy(self) -> None:
        self.old.healthy()
        self.new.healthy()

    def finish(self, swap_epoch: int) -> None:
        """After the swap committed at S: Q1's driver stops its query once its sink finished, Q2 writes on,
        then the input stops, Q2 reads all of it, and every result is once from the version owning it."""
        assert self.old.worker is not None
        self.old.worker.wait_line(lambda line: line == "swapped out", LIVE)
        assert self.old.worker.wait(LIVE) == 0, self.old.worker.stderr
        wait_for(lambda: (self.ledger.epochs.frontier(self.target) or 0) >= swap_epoch + 3, LIVE,
                 "Q2 output after the swap", on_wait=self.healthy)
        self.more.set()
        sent = self.gen.finished()
        last = self.ledger.epochs.frontier(self.raw)
        wait_for(lambda: (self.jobs.consumers(self.new.job, self.raw)[0].subject_epoch or -1) >= last, LIVE,
                 "Q2 to read the whole input", on_wait=self.healthy)
        verify_running(self.ledger, self.stack, self.target, sent, swap_epoch)
