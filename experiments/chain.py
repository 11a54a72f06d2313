"""One run of the two-job hotness chain on the job runtime, instrumented per operator and epoch.

    generator --> issues, issue-comments, pull-requests, pr-comments   (one subject epoch per interval)
    issues + issue-comments --(job 1, hot issues)--> hot-issues
    hot-issues + pr-comments --(job 2, PR hotness)--> pr-hotness

Everything runs on threads of this process against one stack (embedded, or the one named by
``ALIGNER_ZK``/``ALIGNER_KAFKA``). Subjects have ``parallelism`` partitions (thesis 6.1: one per
parallel instance); hot-issues has twice as many so a second version of job 1 can write the other
half during a hot-swap. The run ends by finishing the generator's subjects: the jobs drain and stop,
and the outputs of both jobs are checked record by record against the workload's expected result.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.connectors.runtime import JobFunction, JobSpec
from aligner.connectors.runtime.latency import EpochLatency, LatencyLog, LatencyProbe, json_field
from aligner.connectors.runtime.worker import WorkerThread
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.coordinator.hotswap import HotSwap
from aligner.embedded.stack import EmbeddedStack, StackInfo, wait_for
from aligner.ledger import Ledger
from aligner.models import Mode
from experiments.common import json_value
from experiments.hotness import hot_issues, pr_hotness
from experiments.workload import (
    HOT_ISSUES,
    ISSUE_COMMENTS,
    ISSUES,
    PR_COMMENTS,
    PR_HOTNESS,
    STREAMS,
    Pacer,
    Workload,
)

log = logging.getLogger("experiments.chain")
RunMode = Mode
JOB1, JOB2 = "job1", "job2"


@contextlib.contextmanager
def open_stack(external: bool, zk_servers: int = 1) -> Iterator[StackInfo]:
    """A fresh embedded stack (``zk_servers`` > 1: with a ZooKeeper ensemble), or (``external``) the one named
    by ``ALIGNER_ZK``/``ALIGNER_KAFKA``."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if external:
        from aligner.settings import Settings

        s = Settings()
        yield StackInfo(zk=s.zk, kafka=s.kafka, workdir="", zk_pid=0, kafka_pid=0)
        return
    with EmbeddedStack(zk_servers=zk_servers) as info:
        yield info


class Generator(threading.Thread):
    """Writes the four workload streams at their rates; commits one epoch of each per ``interval``."""

    def __init__(self, info: StackInfo, root: str, names: dict[str, str], workload: Workload,
                 interval: float) -> None:
        super().__init__(daemon=True, name="generator")
        self.info, self.root, self.names, self.workload, self.interval = info, root, names, workload, interval
        self.stop = threading.Event()
        self.sent: Counter[str] = Counter()
        self.error: list[BaseException] = []

    def run(self) -> None:
        led = Ledger.connect(self.info.zk, self.root)
        sinks: dict[str, SinkProducer] = {}
        try:
            for stream in STREAMS:
                subject = self.names[stream]
                parts = list(range(led.subjects.subject(subject).partitions))
                sinks[stream] = SinkProducer(led, self.info.kafka, subject, "generator", 0, parts).open()
            pacers = {s: Pacer(self.workload.rate(s)) for s in STREAMS}
            boundary = time.time()
            while not self.stop.is_set():
                boundary += self.interval
                for sink in sinks.values():
                    sink.begin()
                while (now := time.time()) < boundary:
                    for stream, sink in sinks.items():
                        due = pacers[stream].due(now)
                        while self.sent[stream] < due:
                            key, value = self.workload.record(stream, self.sent[stream])
                            sink.send(json.dumps({**value, "ts": time.time()}).encode(), key.encode())
                            self.sent[stream] += 1
                    time.sleep(min(0.002, max(0.0, boundary - now)))
                for sink in sinks.values():
                    sink.commit()
            for sink in sinks.values():
                sink.finish()
        except BaseException as exc:
            self.error.append(exc)
        finally:
            for sink in sinks.values():
                sink.close()
            led.close()


class Worker(WorkerThread):
    """One job worker on its thread, its function measured by a latency probe; started at once."""

    def __init__(self, info: StackInfo, root: str, spec: JobSpec, index: int, fn: JobFunction,
                 latency: LatencyLog, operator: str, run: str = "") -> None:
        probe = LatencyProbe(operator, index, json_field("ts"), latency, run=run)
        super().__init__(info.zk, root, info.kafka, spec, index, probe.wrap(fn), on_commit=probe.checkpoint)
        self.start()


@dataclass
class ChainConfig:
    mode: RunMode = "aligned"
    """``aligned`` starts exactly-once and is aligned by the coordinator at ``align_at``."""
    interval: float = 1.0
    parallelism: int = 1
    duration: float = 30.0
    """Seconds of generated input."""
    align_at: float = 5.0
    """Seconds into the run when the coordinator aligns job 1, then job 2 (mode ``aligned``)."""
    swap_at: float | None = None
    """Seconds into the run when job 1 is hot-swapped for version 2 (implies ``aligned``)."""
    workload: Workload = field(default_factory=Workload)


@dataclass
class ChainResult:
    config: ChainConfig
    tag: str
    started: float
    latency: list[EpochLatency]
    sent: dict[str, int]
    events: dict[str, float]
    """Wall-clock times: align/swap requested and decided."""
    check: dict[str, int]
    swap_epoch: int | None = None
    job_epochs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    input_seconds: float | None = None
    """Seconds of generated input as run: longer than planned where a step ended late."""

    @property
    def input_end(self) -> float:
        """Seconds into the run when the input ended."""
        return self.config.duration if self.input_seconds is None else self.input_seconds

    def operator(self, name: str) -> list[EpochLatency]:
        return [r for r in self.latency if r.operator == name]


def run_chain(info: StackInfo, root: str, config: ChainConfig, tag: str,
              progress: Callable[[str], None] = lambda _m: None, latency_file: Path | None = None) -> ChainResult:
    """Run the chain once on fresh subjects named ``<stream>-<tag>``; returns its measurements."""
    led = Ledger.connect(info.zk, root)
    try:
        return _run(led, info, root, config, tag, progress, latency_file)
    finally:
        led.close()


def _run(led: Ledger, info: StackInfo, root: str, config: ChainConfig, tag: str, progress: Callable[[str], None],
         latency_file: Path | None) -> ChainResult:
    p, w = config.parallelism, config.workload
    names = {s: f"{s}-{tag}" for s in (*STREAMS, HOT_ISSUES, PR_HOTNESS)}
    for s in STREAMS:
        create_subject(led, info.kafka, names[s], p)
    create_subject(led, info.kafka, names[HOT_ISSUES], 2 * p)
    create_subject(led, info.kafka, names[PR_HOTNESS], p)
    mode: RunMode = "at_least_once" if config.mode == "at_least_once" else "exactly_once"
    job1, job2 = f"{JOB1}-{tag}", f"{JOB2}-{tag}"
    spec1 = JobSpec(job=job1, inputs=(names[ISSUES], names[ISSUE_COMMENTS]), output=names[HOT_ISSUES],
                    parallelism=p, interval=config.interval, mode=mode, output_partitions=tuple(range(p)))
    spec2 = JobSpec(job=job2, inputs=(names[HOT_ISSUES], names[PR_COMMENTS]), output=names[PR_HOTNESS],
                    parallelism=p, interval=config.interval, mode=mode)
    latency = LatencyLog(latency_file)
    gen = Generator(info, root, names, w, config.interval)
    started = time.time()
    gen.start()
    workers: list[Worker] = []
    events: dict[str, float] = {}
    swap_epoch = None
    # Random start phases: unaligned timers started in lockstep stay phase-locked to each other and
    # to the generator, which would fix the exactly-once latency at one arbitrary value per run.
    phase = random.Random(f"{w.seed}/{tag}")
    try:
        for spec, fn, operator in ((spec1, hot_issues(w), JOB1), (spec2, pr_hotness, JOB2)):
            time.sleep(phase.uniform(0, config.interval))
            for i in range(p):  # one at a time: a failing start leaves the others in the list to close
                workers.append(Worker(info, root, spec, i, fn, latency, operator, tag))
        jobs = led.jobs
        coord = Coordinator(led)
        plan: list[tuple[float, str]] = []
        input_until = started + config.duration
        if config.mode == "aligned" or config.swap_at is not None:
            plan.append((config.align_at, "align"))
        if config.swap_at is not None:
            plan.append((config.swap_at, "swap"))
        for at, action in plan:
            _sleep_until(started + at, gen)
            if action == "align":
                for job in (job1, job2):
                    events[f"align {job.split('-')[0]} requested"] = time.time()
                    decision = coord.align(job, timeout=120)
                    events[f"align {job.split('-')[0]} decided"] = time.time()
                    progress(f"{job} aligned from job epoch {decision.job_epoch}")
            else:
                spec1v2 = JobSpec(job=f"{job1}-v2", version="2", inputs=spec1.inputs, output=spec1.output,
                                  parallelism=p, interval=config.interval, follows=job1,
                                  output_partitions=tuple(range(p, 2 * p)))
                for i in range(p):
                    workers.append(Worker(info, root, spec1v2, i, hot_issues(w, version=2), latency, f"{JOB1}-v2",
                                          tag))
                wait_for(lambda: all(c.job_epoch is not None for c in jobs.consumers(f"{job1}-v2", names[ISSUES])
                                     .values()) and len(jobs.consumers(f"{job1}-v2", names[ISSUES])) == p,
                         120, "job 1 v2 to follow v1")
                events["swap requested"] = time.time()
                swap = HotSwap(led).run(job1, f"{job1}-v2", names[HOT_ISSUES], timeout=120)
                events["swap decided"] = time.time()
                swap_epoch = swap.epoch
                progress(f"{job1} swapped for v2 at hot-issues epoch {swap.epoch}")
            # A step that ended late (a loaded machine) still leaves at least half the time planned after it,
            # so aligned epochs follow an alignment that took longer than planned.
            input_until = max(input_until, time.time() + (config.duration - at) / 2)
        _sleep_until(input_until, gen)
    finally:
        gen.stop.set()
        gen.join(60)
        for wk in workers:
            wk.finish(120)
        latency.close()
    errors = gen.error + [e for wk in workers for e in wk.error]
    if errors:
        raise errors[0]
    sent = {s: gen.sent[s] for s in STREAMS}
    check = verify(led, info.kafka, names, w, sent)
    result = ChainResult(config, tag, started, sorted(latency.records, key=lambda r: r.committed_at), sent,
                         events, check, swap_epoch, input_seconds=input_until - started)
    if swap_epoch is not None:
        result.job_epochs = {"hot-issues": _commit_times(led, names[HOT_ISSUES])}
    return result


def _sleep_until(t: float, gen: Generator) -> None:
    while (left := t - time.time()) > 0:
        if gen.error or not gen.is_alive():
            raise RuntimeError(f"generator stopped: {gen.error[0] if gen.error else 'no error'}")
        time.sleep(min(left, 0.2))


def _commit_times(led: Ledger, subject: str) -> list[dict[str, Any]]:
    numbers, last = led.subjects.epoch_numbers(subject), led.epochs.frontier(subject)
    if not numbers or last is None:
        return []
    return [{"epoch": ce.epoch, "committed_at": ce.committed_at / 1000,
             "offsets": sum(s.end - s.start for s in ce.slices.values())}
            for ce in led.epochs.committed_many(subject, numbers[0], last)]


def verify(led: Ledger, kafka: str, names: dict[str, str], workload: Workload, sent: dict[str, int]) -> dict[str, int]:
    """Record-by-record check of both jobs' committed output against the workload's expected result.

    Job 1: every hot comment once, with the expected issue, pull request, window and count. Job 2:
    every input (hot comment or PR comment) once, and each pull request's last running totals equal
    to the expected ones. ``*_wrong`` counts records present once but with wrong content.
    """
    expected_hot = workload.hot_comments(sent[ISSUE_COMMENTS])
    hot = read_all(led, kafka, names[HOT_ISSUES])
    out = read_all(led, kafka, names[PR_HOTNESS])
    c1 = check_hot_issues(hot, expected_hot)
    expected_src = {("h", c) for c in expected_hot} | {("c", n) for n in range(sent[PR_COMMENTS])}
    c2 = exactly_once_counts(Counter(tuple(v["src"]) for v in out), expected_src)
    final = final_totals(out)
    expected_totals = workload.pr_totals(sent[ISSUE_COMMENTS], sent[PR_COMMENTS])
    c2["wrong"] = sum(1 for pr in set(final) | set(expected_totals) if final.get(pr) != expected_totals.get(pr))
    return {**{f"job1_{k}": v for k, v in c1.items()}, "job1_v2": sum(1 for v in hot if v.get("v") == 2),
            **{f"job2_{k}": v for k, v in c2.items()}}


def check_hot_issues(hot: list[dict[str, Any]], expected: dict[int, dict[str, Any]]) -> dict[str, int]:
    """Job 1's output: each hot comment once, and with the expected issue, pull request, window, count."""
    counts = exactly_once_counts(Counter(v["comment"] for v in hot), set(expected))
    counts["wrong"] = sum(1 for v in hot if v["comment"] in expected
                          and {k: v[k] for k in ("issue", "pr", "window", "count")} != expected[v["comment"]])
    return counts


def final_totals(rows: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """Job 2's last (comments, hot) per pull request: running totals only grow, so the largest."""
    final: dict[int, tuple[int, int]] = {}
    for v in rows:
        final[v["pr"]] = max(final.get(v["pr"], (0, 0)), (v["comments"], v["hot"]))
    return final


def exactly_once_counts(got: Counter[Any], expected: set[Any]) -> dict[str, int]:
    """Each expected id once: how many are missing, and how many copies are extra or unexpected."""
    return {"expected": len(expected), "out": sum(got.values()),
            "lost": sum(1 for k in expected if k not in got),
            "duplicated": sum(n - 1 if k in expected else n for k, n in got.items())}


def read_all(led: Ledger, kafka: str, subject: str) -> list[dict[str, Any]]:
    """Every committed record of a subject: its JSON value, with the epoch it belongs to."""
    numbers, last = led.subjects.epoch_numbers(subject), led.epochs.frontier(subject)
    if not numbers or last is None:
        return []
    with EpochReader(led, kafka) as reader:
        return [{**json_value(r.value), "epoch": r.epoch} for r in reader.read(subject, numbers[0], last)]


def exactly_once(check: dict[str, int]) -> bool:
    return not any(check[f"{job}_{k}"] for job in ("job1", "job2") for k in ("lost", "duplicated", "wrong"))


__all__ = ["JOB1", "JOB2", "ChainConfig", "ChainResult", "check_hot_issues", "exactly_once", "exactly_once_counts",
           "final_totals", "read_all", "run_chain"]
