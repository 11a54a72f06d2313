"""Always on: quiet inputs, ZooKeeper outages and session expiry, a paused broker, SIGTERM.

These tests run on a stack of their own (they kill its ZooKeeper and pause its broker). Every
component is a real process: an outside producer (a thread of the test, plain confluent-kafka),
the epoch marker (``aligner markers``) and two job workers (``python -m aligner.connectors.runtime.worker``).
Outage lengths are the tests' input; every other wait is on a condition with a liveness bound.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer

from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.embedded.stack import ZOOKEEPER, EmbeddedStack, StackInfo
from aligner.ledger import Ledger
from tests.helpers import Worker, json_value, wait_for
from tests.streams import assert_exactly_once, read_all

LIVE = 180.0
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""

STOP_WITHIN = 5.0
"""SIGTERM must end a long-running component within this many seconds (product rule)."""


@pytest.fixture
def own_stack() -> Iterator[tuple[EmbeddedStack, StackInfo]]:
    stack = EmbeddedStack()
    info = stack.start()
    try:
        yield stack, info
    finally:
        stack.stop()


def zk_pid(stack: EmbeddedStack) -> int:
    """The live ZooKeeper process of the stack (the newest one after restarts)."""
    pid = stack.pid(ZOOKEEPER)
    assert pid is not None, "ZooKeeper is not running"
    return pid


@dataclass
class OutsideProducer:
    """Numbered JSON records {"n": i} into a topic, at a steady pace, until stopped."""

    kafka: str
    topic: str
    pace: float = 0.004
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True, name="outside-producer")
        self.thread.start()

    def _run(self) -> None:
        try:
            p = Producer({"bootstrap.servers": self.kafka, "linger.ms": 5, "log_level": 3})
            while not self.stop.is_set():
                p.produce(self.topic, json.dumps({"n": self.sent}).encode(), str(self.sent).encode())
                self.sent += 1
                p.poll(0)
                self.stop.wait(self.pace)
            while p.flush(1.0):  # a paused broker delays the last records; they are not dropped
                pass
        except BaseException as exc:
            self.error.append(exc)

    def close(self) -> int:
        self.stop.set()
        self.thread.join(LIVE)
        assert not self.thread.is_alive(), "outside producer did not flush"
        assert not self.error, self.error
        return self.sent


@dataclass
class Chain:
    """Outside producer -> marker -> job (2 workers), all stopped by the fixture on every path."""

    info: StackInfo
    root: str
    inp: str
    out: str
    job: str
    ledger: Ledger
    procs: list[Worker] = field(default_factory=list)
    producer: OutsideProducer | None = None

    def cli_args(self) -> list[str]:
        return ["--zk", self.info.zk, "--kafka", self.info.kafka, "--root", self.root]

    def start_marker(self, interval: float = 0.3) -> Worker:
        w = Worker("aligner.coordinator", *self.cli_args(), "markers", self.inp, "--interval", str(interval))
        self.procs.append(w)
        return w

    def start_worker(self, index: int, interval: float = 0.3, opened: bool = True) -> Worker:
        """Worker ``index`` of the job; with ``opened``, once it says it opened (not while ZooKeeper is down)."""
        w = Worker("aligner.connectors.runtime.worker", "--zk", self.info.zk, "--kafka", self.info.kafka,
                   "--root", self.root, "--job", self.job, "--function", "tests.jobs:tag_v1", "--input", self.inp,
                   "--output", self.out, "--worker", str(index), "--parallelism", "2", "--interval", str(interval))
        self.procs.append(w)
        if opened:
            w.wait_line(lambda line: line.startswith("open"), timeout=LIVE)
        return w

    def output_count(self) -> int:
        return len({v["in"]["n"] for _, v in read_all(self.ledger, self.info.kafka, self.out)})

    def drain_and_check(self, sent: int) -> None:
        """Wait until every input has its result, then check each one has exactly one."""
        wait_for(lambda: self.output_count() >= sent, LIVE, f"all {sent} inputs to reach {self.out}", interval=0.5)
        assert_exactly_once(read_all(self.ledger, self.info.kafka, self.out), sent)

    def alive(self) -> None:
        dead = [(w.args[:1], w.proc.returncode) for w in self.procs if w.proc.poll() is not None]
        assert not dead, f"components exited during the fault: {dead}"

    def terminate_all(self) -> None:
        """SIGTERM every component; each must exit 0 within STOP_WITHIN seconds."""
        for w in self.procs:
            w.proc.send_signal(signal.SIGTERM)
        slow = []
        for w in self.procs:
            try:
                code = w.proc.wait(STOP_WITHIN + 2)
            except Exception:
                slow.append(w.args[:1])
                continue
            assert code == 0, f"exit {code}: {w.stderr}"
        assert not slow, f"not stopped within {STOP_WITHIN}s of SIGTERM: {slow}"


@pytest.fixture
def chain(own_stack: tuple[EmbeddedStack, StackInfo]) -> Iterator[Chain]:
    stack, info = own_stack
    root = f"/aligner-faults-{uuid.uuid4().hex[:8]}"
    name = f"f-{uuid.uuid4().hex[:8]}"
    ledger = Ledger.connect(info.zk, root)
    c = Chain(info, root, name, f"{name}-out", f"{name}-job", ledger)
    try:
        create_subject(ledger, info.kafka, c.inp, 2)
        create_subject(ledger, info.kafka, c.out, 2)
        yield c
    finally:
        if c.producer is not None:
            c.producer.stop.set()
            c.producer.thread.join(30)
        for w in c.procs:
            w.stop()
            print(f"--- {' '.join(w.args[:12])}: exit {w.proc.returncode}\n{w.stderr}")
        if stack.pid(ZOOKEEPER) is None:
            stack.restart(ZOOKEEPER, LIVE)  # a failed test must not leave the next one without ZooKeeper
        for p in stack.processes():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
        ledger.close()


def _start(chain: Chain) -> tuple[Worker, list[Worker]]:
    chain.producer = OutsideProducer(chain.info.kafka, chain.inp)
    marker = chain.start_marker()
    workers = [chain.start_worker(i) for i in range(2)]
    for w in workers:
        w.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
    return marker, workers


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("outage", [10, pytest.param(60, marks=pytest.mark.long)])
def test_zookeeper_down_and_back_no_component_exits(chain: Chain, own_stack, outage: int) -> None:
    stack, _ = own_stack
    _start(chain)
    os.kill(zk_pid(stack), signal.SIGKILL)
    time.sleep(outage)  # the outage itself is the test's input, not a wait for progress
    chain.alive()
    stack.restart(ZOOKEEPER, LIVE)
    for w in chain.procs[1:]:
        w.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
    sent = chain.producer.close()  # type: ignore[union-attr]
    chain.alive()
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_components_started_while_zookeeper_is_down_wait_for_it(chain: Chain, own_stack) -> None:
    """A marker and workers (re)started during an outage longer than a connect timeout keep waiting
    (a supervisor restarting them must not see them die), then run as usual once ZooKeeper is back."""
    stack, _ = own_stack
    chain.producer = OutsideProducer(chain.info.kafka, chain.inp)
    os.kill(zk_pid(stack), signal.SIGKILL)
    chain.start_marker()
    for i in range(2):
        chain.start_worker(i, opened=False)
    time.sleep(20)  # the outage, longer than the 15 s a one-shot command waits for a session
    chain.alive()
    stack.restart(ZOOKEEPER, LIVE)
    for w in chain.procs[1:]:
        w.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
    sent = chain.producer.close()
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_worker_session_expiry_is_ridden_out(chain: Chain) -> None:
    _, workers = _start(chain)
    paused = workers[0]
    paused.proc.send_signal(signal.SIGSTOP)
    time.sleep(15)  # longer than the 10 s session timeout: ZooKeeper expires the worker's session
    paused.proc.send_signal(signal.SIGCONT)
    paused.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
    sent = chain.producer.close()  # type: ignore[union-attr]
    chain.alive()
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_broker_paused_thirty_seconds(chain: Chain, own_stack) -> None:
    _, info = own_stack
    _, workers = _start(chain)
    os.kill(info.kafka_pid, signal.SIGSTOP)
    try:
        time.sleep(30)  # a long GC pause or network stall, as clients see it
        chain.alive()
    finally:
        os.kill(info.kafka_pid, signal.SIGCONT)
    for w in workers:
        w.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
    sent = chain.producer.close()  # type: ignore[union-attr]
    chain.alive()
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_quiet_aligned_input_waits_idle_and_resumes(chain: Chain) -> None:
    """The input commits no epoch for a while: the aligned job keeps running, idles, and resumes."""
    marker, workers = _start(chain)
    Coordinator(chain.ledger).align(chain.job, timeout=LIVE)
    for w in workers:
        w.wait_line(lambda line: "aligned=True" in line, timeout=LIVE)
    marker.proc.send_signal(signal.SIGTERM)  # no new subject epoch from here on
    assert marker.proc.wait(STOP_WITHIN + 2) == 0
    chain.procs.remove(marker)
    last = chain.ledger.epochs.frontier(chain.inp)
    # On a busy machine the workers may still be working through the last epochs: the silence starts
    # once they have consumed everything.
    wait_for(lambda: Coordinator(chain.ledger).source_status(chain.job, chain.inp)["lag_epochs"] == 0, LIVE,
             "the workers to consume every committed input epoch", interval=0.2)
    jobs_done = [w.lines[-1] for w in workers]
    before = [_cpu_seconds(w.proc.pid) for w in workers]
    time.sleep(12)  # the silence (the old runtime died after a fixed 120 s; the point here is idling)
    used = [_cpu_seconds(w.proc.pid) - b for w, b in zip(workers, before, strict=True)]
    chain.alive()
    assert all(u < 1.0 for u in used), f"CPU seconds used while waiting 12 s: {used}"
    assert chain.ledger.epochs.frontier(chain.inp) == last, "the input committed an epoch during the silence"
    status = Coordinator(chain.ledger).source_status(chain.job, chain.inp)
    assert status["waiting_seconds"] is not None and status["waiting_seconds"] >= 5, status
    resumed = time.monotonic()
    chain.start_marker()
    for w in workers:
        w.wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
    print(f"first job epoch after the silence committed {time.monotonic() - resumed:.2f}s after the marker "
          f"restarted (incl. its start-up); jobs were at {jobs_done}")
    wait_for(lambda: Coordinator(chain.ledger).source_status(chain.job, chain.inp)["waiting_seconds"] is None,
             LIVE, "`aligner status` to show the job reading again")
    sent = chain.producer.close()  # type: ignore[union-attr]
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_sigterm_during_silence_and_mid_stream_exits_zero_and_loses_nothing(chain: Chain) -> None:
    marker, workers = _start(chain)
    workers[0].proc.send_signal(signal.SIGTERM)  # mid-stream
    assert workers[0].proc.wait(STOP_WITHIN + 2) == 0
    marker.proc.send_signal(signal.SIGTERM)
    assert marker.proc.wait(STOP_WITHIN + 2) == 0
    started = time.monotonic()
    workers[1].proc.send_signal(signal.SIGTERM)  # waiting for an epoch that does not come
    assert workers[1].proc.wait(STOP_WITHIN + 2) == 0
    assert time.monotonic() - started < STOP_WITHIN
    chain.procs.clear()
    chain.start_marker()
    for i in range(2):
        chain.start_worker(i)
    sent = chain.producer.close()  # type: ignore[union-attr]
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_sigusr1_prints_a_workers_stacks_and_it_goes_on(chain: Chain) -> None:
    """A worker asked where it is (SIGUSR1, what the soak sends on a stall) prints every thread's stack on
    stderr and goes on committing; nothing is lost."""
    _marker, workers = _start(chain)
    workers[0].proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: workers[0].said("(most recent call first)") and workers[0].said("in run"), LIVE,
             "the worker's stacks on stderr", on_wait=workers[0].healthy)
    workers[0].wait_line(lambda line: line.startswith("committed"), timeout=LIVE)
    sent = chain.producer.close()  # type: ignore[union-attr]
    chain.drain_and_check(sent)
    chain.terminate_all()


def test_a_commit_that_times_out_recreates_the_producer(own_stack, caplog) -> None:
    """The broker paused inside a sink's Kafka commit: the commit waits it out and succeeds, and the producer
    is recreated before the next transaction (a new InitProducerId fences any late request of that
    transaction: KIP-890's defence, which librdkafka lacks); the next epoch commits through the new
    producer and readers see every record once."""
    from aligner.connectors.reader import EpochReader
    from aligner.connectors.sink import SinkProducer

    _, info = own_stack
    led = Ledger.connect(info.zk, f"/aligner-kip890-{uuid.uuid4().hex[:8]}")
    create_subject(led, info.kafka, "s", 2)
    caplog.set_level("INFO", logger="aligner.connectors.stamped")
    try:
        with SinkProducer(led, info.kafka, "s", "w", 0, [0, 1]) as p:
            for e in range(3):
                p.begin()
                for j in range(50):
                    p.send(json.dumps({"e": e, "j": j}).encode(), key=str(j).encode())
                if e != 1:
                    p.commit()
                    continue
                p.kp.flush(30)  # every record is on the broker: only the commit is left
                before = p.kp
                done: list[object] = []
                committer = threading.Thread(target=lambda out=done: out.append(p.commit()), name="paused-commit")
                os.kill(info.kafka_pid, signal.SIGSTOP)
                try:
                    committer.start()
                    time.sleep(4)  # the fault: a broker that stops answering for longer than a commit slice
                finally:
                    os.kill(info.kafka_pid, signal.SIGCONT)
                    committer.join(LIVE)
                assert done, "the commit did not return after the broker came back"
                assert p.kp is before and p.kp.stale, "the commit that timed out did not mark its producer"
            assert p.kp is not before, "the producer was not recreated before the next transaction"
        assert any("timed out before the broker answered" in r.getMessage() for r in caplog.records)
        with EpochReader(led, info.kafka) as reader:
            got = [json_value(r.value) for r in reader.read("s", 0, 2)]
        assert sorted((v["e"], v["j"]) for v in got) == [(e, j) for e in range(3) for j in range(50)]
    finally:
        led.close()
