"""Faust jobs on aligned subjects: a real ``faust`` worker process, SIGKILLed, restarted and aligned.

The worker is ``python -m experiments.faust_job worker`` (Faust's own CLI). Its input subject is
written live by a stamped SinkProducer in this process; its output is read back by epoch.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections import Counter, defaultdict

from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from connectors.faust.job import _sync_function
from connectors.reader import EpochReader
from connectors.runtime import KeyedState
from connectors.sink import SinkProducer
from connectors.source import SourceRecord
from connectors.subjects import create_subject
from coordinator.alignment import Coordinator
from coordinator.hotswap import HotSwap
from coordinator.stack import wait_for
from tests.helpers import Worker, raw_count

RECORDS = 20
"""Input records per input epoch."""


class Feeder(threading.Thread):
    """Writes one input epoch every ``pace`` seconds until told to finish, then marks the sink finished."""

    def __init__(self, zk: str, root: str, kafka: str, subject: str, pace: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.args = (zk, root, kafka, subject)
        self.pace = pace
        self.finish = threading.Event()
        self.last = -1
        self.error: BaseException | None = None

    def run(self) -> None:
        zk, root, kafka, subject = self.args
        ledger = Ledger.connect(zk, root)
        try:
            with SinkProducer(ledger, kafka, subject, "feeder", 0, [0, 1, 2, 3]) as producer:
                while not self.finish.is_set():
                    epoch = producer.begin()
                    for j in range(RECORDS):
                        producer.send(json.dumps({"e": epoch, "j": j}).encode(), key=f"k{j % 7}".encode())
                    producer.commit()
                    self.last = epoch
                    self.finish.wait(self.pace)
                producer.finish()
        except BaseException as exc:
            self.error = exc
        finally:
            ledger.close()


def _start(stack, root: str, home: str, job: str, src: str, out: str, pause: str = "", **extra: str) -> Worker:
    env = {"ALIGNER_ZK": stack.zk, "ALIGNER_KAFKA": stack.kafka, "ALIGNER_ROOT": root, "ALIGNER_HOME": home,
           "FAUST_JOB_ID": job, "FAUST_JOB_INPUT": src, "FAUST_JOB_OUTPUT": out, "FAUST_JOB_INTERVAL": "0.3",
           "FAUST_JOB_PAUSE": pause, **{f"FAUST_JOB_{k.upper()}": v for k, v in extra.items()}}
    return Worker("experiments.faust_job", "worker", "-l", "warn", "--without-web", env=env)


def _committed(line: str) -> int | None:
    return int(line.split()[1]) if line.startswith("committed ") else None


def test_faust_worker_killed_restarted_and_aligned_exactly_once(stack, root, ledger, subject_name, tmp_path):
    home = str(tmp_path / "home")
    src, out, job = f"{subject_name}-in", f"{subject_name}-out", f"faust-{subject_name}"
    create_subject(ledger, stack.kafka, src, 4)
    create_subject(ledger, stack.kafka, out, 4)
    feeder = Feeder(stack.zk, root, stack.kafka, src)
    feeder.start()
    worker = _start(stack, root, home, job, src, out, pause="2:after_kafka_commit")
    try:
        # 1. Killed between the Kafka commit and the ZooKeeper commit of epoch 2: that attempt never counts.
        worker.wait_line(lambda line: line == "paused 2 after_kafka_commit", timeout=60)
        worker.kill()
        worker = _start(stack, root, home, job, src, out)
        opened = worker.wait_line(lambda line: line.startswith("open"), timeout=60)
        assert "next=2 " in opened and "attempt=2" in opened, opened
        # 2. Killed at an arbitrary point of a running epoch (its transaction open, records flushed or not).
        worker.wait_line(lambda line: (_committed(line) or 0) >= 4, timeout=60)
        worker.kill()
        worker = _start(stack, root, home, job, src, out)
        worker.wait_line(lambda line: line.startswith("open"), timeout=60)

        # 3. The coordinator aligns the running Faust job like any other job.
        decision = Coordinator(ledger).align(job, timeout=60)
        aligned_from = decision.job_epoch
        assert aligned_from is not None
        worker.wait_line(lambda line: (_committed(line) or -1) >= aligned_from + 2, timeout=60)
        assert "aligned=True" in worker.lines[-1]

        # 4. Killed while aligned: it restarts aligned, from the alignment state of its last epoch.
        worker.kill()
        worker = _start(stack, root, home, job, src, out)
        worker.wait_line(lambda line: line.startswith("open"), timeout=60)
        line = worker.wait_line(lambda line: _committed(line) is not None, timeout=60)
        assert "aligned=True" in line, line

        # 5. Finite input: the job drains the last input epoch, finishes its output and Faust stops on SIGTERM.
        feeder.finish.set()
        feeder.join(30)
        assert feeder.error is None, feeder.error
        worker.wait_line(lambda line: line.startswith("finished"), timeout=60)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(60) == 0
    finally:
        feeder.finish.set()
        worker.stop()

    jobs = JobLedger(ledger)
    in_epochs = ledger.epoch_numbers(src)
    out_epochs = ledger.epoch_numbers(out)
    assert ledger.finished(src) == in_epochs[-1] == feeder.last
    assert ledger.finished(out) == out_epochs[-1]
    with EpochReader(ledger, stack.kafka) as reader:
        inputs = {(r.partition, r.offset): r for r in reader.read(src, 0, in_epochs[-1])}
        by_epoch = {e: [json.loads(r.value) for r in reader.read(out, e)] for e in out_epochs}

    # Every input's result exactly once, across three kills.
    results = Counter((v["src"][1], v["src"][2]) for rs in by_epoch.values() for v in rs)
    assert len(inputs) == len(in_epochs) * RECORDS
    assert set(results) == set(inputs), "lost or invented results"
    assert max(results.values()) == 1, [k for k, n in results.items() if n > 1][:5]
    for rs in by_epoch.values():
        for v in rs:
            assert json.loads(inputs[(v["src"][1], v["src"][2])].value) == v["in"]

    # The broker holds more than that (the attempt killed after its Kafka commit); the stamps drop it.
    assert raw_count(stack.kafka, ledger.subject(out).topic, 4) > len(results)

    # Keyed state consistent with the last committed epoch after every crash: per key, "seen" is 1..n.
    seen = defaultdict(list)
    for e in out_epochs:
        for v in by_epoch[e]:
            seen[f"k{v['in']['j'] % 7}"].append(v["seen"])
    for key, counts in seen.items():
        assert sorted(counts) == list(range(1, len(counts) + 1)), key

    # Aligned epochs map onto input epochs: job epoch e holds exactly the results of the input epochs it covers.
    assert out_epochs[-1] >= aligned_from + 2
    expected_first = None
    for e in range(aligned_from, out_epochs[-1] + 1):
        span = jobs.job_epoch(job, e).covered[src]
        assert jobs.worker_epoch(job, 0, e).mode == "aligned"
        if span is None:
            assert by_epoch[e] == []
            continue
        if expected_first is not None:
            assert span.first == expected_first, f"job epoch {e} skips or repeats input epochs"
        expected_first = span.last + 1
        got = Counter(v["src"][3] for v in by_epoch[e])
        assert got == {i: RECORDS for i in range(span.first, span.last + 1)}, f"job epoch {e}: {got} vs {span}"
    assert expected_first == in_epochs[-1] + 1


def _terminate(worker: Worker) -> None:
    """Faust stops cleanly on SIGTERM once its aligned job finished."""
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(60) == 0, "".join(worker._stderr)[-3000:]


def test_faust_workers_hot_swapped_v1_to_v2_exactly_once(stack, root, ledger, subject_name, tmp_path):
    """Two real Faust workers, v1 aligned and v2 following it, swapped under continuous input."""
    home = str(tmp_path / "home")
    src, target = f"{subject_name}-in", f"{subject_name}-t"
    v1, v2 = f"faust-{subject_name}-v1", f"faust-{subject_name}-v2"
    create_subject(ledger, stack.kafka, src, 4)
    create_subject(ledger, stack.kafka, target, 4)
    feeder = Feeder(stack.zk, root, stack.kafka, src)
    feeder.start()
    old = _start(stack, root, home, v1, src, target, output_partitions="0,1")
    new: Worker | None = None
    try:
        old.wait_line(lambda line: _committed(line) is not None, timeout=60)
        Coordinator(ledger).align(v1, timeout=60)
        new = _start(stack, root, home, v2, src, target, version="2", follows=v1, output_partitions="2,3")
        new.wait_line(lambda line: line.startswith("open"), timeout=60)
        # v2 follows v1's aligned epochs with its output voided: nothing of it reaches the target yet.
        line = new.wait_line(lambda line: _committed(line) is not None, timeout=60)
        assert "aligned=True" in line, line

        fed_before, frontier_before = feeder.last, ledger.frontier(target)
        accepted = max(c.job_epoch or 0 for j in (v1, v2) for c in JobLedger(ledger).consumers(j, src).values())
        swap = HotSwap(ledger).run(v1, v2, target, timeout=60)
        fed_after = feeder.last
        assert swap.phase == "done" and swap.old == v1 and swap.new == v2
        # S is picked a margin (2) ahead of both jobs, a few epochs more if they moved on meanwhile.
        assert accepted < swap.epoch <= accepted + 6, f"swap at {swap.epoch}, job epoch {accepted} when accepted"
        # v1 writes its last epoch S and finishes; the input kept flowing during the swap.
        done = old.wait_line(lambda line: line.startswith("finished"), timeout=60)
        assert done.endswith(f"last={swap.epoch}"), done
        assert fed_after > fed_before, "no input epoch was written during the swap"
        _terminate(old)
        wait_for(lambda: (ledger.frontier(target) or 0) >= swap.epoch + 3, 60, "v2 output after the swap")

        # Finite input: v2 drains the last input epoch and finishes the target.
        feeder.finish.set()
        feeder.join(30)
        assert feeder.error is None, feeder.error
        new.wait_line(lambda line: line.startswith("finished"), timeout=60)
        _terminate(new)
    finally:
        feeder.finish.set()
        old.stop()
        if new is not None:
            new.stop()

    in_epochs = ledger.epoch_numbers(src)
    out_epochs = ledger.epoch_numbers(target)
    assert ledger.finished(src) == in_epochs[-1] == feeder.last
    assert ledger.finished(target) == out_epochs[-1] == ledger.frontier(target)
    with EpochReader(ledger, stack.kafka) as reader:
        inputs = {(r.partition, r.offset): r for r in reader.read(src, 0, in_epochs[-1])}
        outputs = [(e, r.partition, json.loads(r.value)) for e in out_epochs for r in reader.read(target, e)]

    # Every input's result exactly once at the target.
    results = Counter((v["src"][1], v["src"][2]) for _, _, v in outputs)
    assert len(inputs) == len(in_epochs) * RECORDS
    assert set(results) == set(inputs), "lost or invented results"
    assert max(results.values()) == 1, [k for k, n in results.items() if n > 1][:5]
    # Target epochs <= S hold v1's results (in v1's partitions), later ones v2's (in v2's partitions).
    for epoch, partition, v in outputs:
        assert json.loads(inputs[(v["src"][1], v["src"][2])].value) == v["in"]
        version = 1 if epoch <= swap.epoch else 2
        assert v["v"] == version, f"target epoch {epoch} (S = {swap.epoch}) has a v{v['v']} result"
        assert partition in ((0, 1) if version == 1 else (2, 3)), (epoch, partition, v)
    assert any(e <= swap.epoch for e, _, _ in outputs) and any(e > swap.epoch for e, _, _ in outputs)
    # v2's keyed state advanced through its voided epochs before S: per key, "seen" goes on from there
    # without gaps or repeats (and not from 1).
    seen = defaultdict(list)
    for _, _, v in outputs:
        if v["v"] == 2:
            seen[f"k{v['in']['j'] % 7}"].append(v["seen"])
    for key, counts in seen.items():
        assert min(counts) > 1 and sorted(counts) == list(range(min(counts), min(counts) + len(counts))), key
    print(f"faust hot-swap: accepted at job epoch {accepted} (target frontier {frontier_before}), S = {swap.epoch}, "
          f"{fed_after - fed_before} input epochs written meanwhile")


def test_async_generator_job_functions_run_on_the_faust_loop():
    """``async def`` generator jobs (agent style) are awaited on the app's loop, one record at a time."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        async def fn(record: SourceRecord, state: KeyedState):
            await asyncio.sleep(0)
            assert asyncio.get_running_loop() is loop
            state.put("n", state.get("n", 0) + 1)
            yield record.key, record.value
            yield None, b"second"

        call = _sync_function(fn, loop)
        state = KeyedState()
        rec = SourceRecord("s", 0, 5, 1, b"k", b"v", 0)
        assert list(call(rec, state)) == [(b"k", b"v"), (None, b"second")]
        assert list(call(rec, state)) == [(b"k", b"v"), (None, b"second")]
        assert state.get("n") == 2
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
