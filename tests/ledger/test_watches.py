"""One watch per path: a quiet waiter that re-arms on every pass holds a bounded number of watchers.

kazoo keeps every one-shot watch callback it is given until the node changes; a Spark planner asked
every half second and a wait re-armed every second used to add a fresh one each time, all night.
The ledger layer (aligner.zk.Watches) registers one kazoo watcher per (kind, path) and keeps one
pending callback per waiter. Counted here on the session's own registries (kazoo's
``_data_watchers`` / ``_child_watchers``, where the callbacks piled up) and the ledger's pending
callbacks; real ZooKeeper and broker, no mocks.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import pytest

from aligner.connectors.runtime.job_spec import JobSpec
from aligner.connectors.subjects import create_subject
from aligner.ledger import Ledger
from aligner.models import JobNode

FIRES_WITHIN = 10.0
"""A watch must wake its waiter well within this once its node changes."""


def kazoo_watchers(ledger: Ledger) -> int:
    """Callbacks the session's kazoo client holds for one-shot watches, over all paths."""
    kazoo = ledger.zk.kazoo
    return sum(len(w) for w in kazoo._data_watchers.values()) + sum(len(w) for w in kazoo._child_watchers.values())


def _all_saw(seen: dict[str, list[bytes | None]], value: bytes) -> bool:
    return all(s and s[-1] == value for s in seen.values())


def _more_trips(ledger: Ledger, than: int) -> bool:
    return ledger.round_trips > than


def wait_for(cond: Callable[[], bool], what: str, timeout: float = FIRES_WITHIN) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_rearming_with_fresh_callbacks_keeps_one_watcher_and_the_last_fires(ledger: Ledger, root: str) -> None:
    path = f"{root}/quiet-node"
    ledger.zk.ensure_path(root)
    before = kazoo_watchers(ledger)
    events: list[threading.Event] = []

    def pause() -> None:  # the planner's pattern: a new event and a new lambda on every pass
        woken = threading.Event()
        events.append(woken)
        assert not ledger.watches.watch_node(path, lambda _e: woken.set())

    for _ in range(200):
        pause()
    assert len(ledger.zk.kazoo._data_watchers[path]) == 1
    assert kazoo_watchers(ledger) == before + 1
    assert ledger.zk.watches.pending() == 1
    ledger.zk.create(path, b"x")
    assert events[-1].wait(FIRES_WITHIN), "the waiter's last callback fires when the node appears"
    assert not any(e.is_set() for e in events[:-1]), "superseded callbacks are dropped, not called"
    wait_for(lambda: ledger.zk.watches.pending() == 0, "the fired watch to be forgotten")
    assert path not in ledger.zk.kazoo._data_watchers


def test_distinct_waiters_on_one_path_share_one_watcher_and_all_wake(ledger: Ledger, root: str) -> None:
    path = f"{root}/shared-node"
    ledger.zk.ensure_path(root)
    woken = [threading.Event() for _ in range(3)]
    armed = threading.Barrier(len(woken) + 1)

    def waiter(event: threading.Event) -> None:
        for _ in range(20):  # each waiter re-arms too: still one pending callback each
            ledger.watches.watch_node(path, lambda _e: event.set())
        armed.wait(FIRES_WITHIN)

    threads = [threading.Thread(target=waiter, args=(e,), daemon=True) for e in woken]
    try:
        for t in threads:
            t.start()
        armed.wait(FIRES_WITHIN)
        assert len(ledger.zk.kazoo._data_watchers[path]) == 1
        assert ledger.zk.watches.pending() == len(woken)
        ledger.zk.create(path, b"x")
        assert all(e.wait(FIRES_WITHIN) for e in woken), "every waiter is woken by the one watch"
    finally:
        armed.abort()
        for t in threads:
            t.join(FIRES_WITHIN)


def test_wait_committed_rearms_every_second_without_piling_up(ledger: Ledger, subject_name: str) -> None:
    from aligner.models import SubjectNode

    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
    before = kazoo_watchers(ledger)
    assert not ledger.watches.wait_committed(subject_name, 0, timeout=3.5)  # about four wake-ups, nothing commits
    assert kazoo_watchers(ledger) - before <= 2  # the epoch node's data (and children, once it exists)
    assert ledger.zk.watches.pending() <= 2


def test_followers_of_one_node_share_one_recipe_and_see_every_change_in_order(ledger: Ledger, root: str) -> None:
    path = f"{root}/followed"
    ledger.zk.ensure_path(root)
    jobs = ledger.jobs
    seen: dict[str, list[bytes | None]] = {"a": [], "b": []}
    followers = {name: (lambda data, _stat, name=name: seen[name].append(data)) for name in seen}
    for _ in range(5):  # e.g. a coordinator's waiter and a worker's swap follower on one session, subscribing again
        for follow in followers.values():
            ledger.zk.DataWatch(path, follow)
    jobs.on_data_change(path, lambda: None)
    assert ledger.zk.shared.recipes() == 1
    assert len(ledger.zk.kazoo._data_watchers[path]) == 1
    for value in (b"1", b"2", b"3"):
        ledger.zk.create(path, value) if value == b"1" else ledger.zk.set(path, value)
        wait_for(functools.partial(_all_saw, seen, value), f"both followers to see {value!r}")
    for name, values in seen.items():
        assert values[0] is None and [v for v in values if v is not None] == [b"1", b"2", b"3"], (name, values)
    assert len(ledger.zk.kazoo._data_watchers[path]) == 1


@pytest.fixture
def quiet_job(stack, ledger: Ledger, subject_name: str) -> tuple[str, str, str]:
    """A registered aligned job on an input nobody writes: (job, input, output)."""
    out = f"{subject_name}-out"
    create_subject(ledger, stack.kafka, subject_name, 1)
    create_subject(ledger, stack.kafka, out, 1)
    job = f"{subject_name}-job"
    ledger.jobs.register(JobNode(job=job, inputs=(subject_name,), output=out, parallelism=1, mode="aligned"))
    return job, subject_name, out


def test_a_quiet_aligned_spark_query_holds_a_bounded_number_of_watchers(stack, ledger: Ledger,
                                                                        quiet_job: tuple[str, str, str]) -> None:
    pytest.importorskip("pyspark")
    from aligner.connectors.spark.job import JobPlanner

    job, src, _out = quiet_job
    planner = JobPlanner(ledger, stack.kafka, job, [src])
    before = kazoo_watchers(ledger)
    counts = []
    for _ in range(12):  # every call finds nothing committed, pauses on watches and returns no batch
        assert planner.plan({src: 0}, None, None) is None
        counts.append(kazoo_watchers(ledger) - before)
    assert max(counts) <= 4, counts
    assert counts[-1] == counts[1], f"watchers grow with wake-ups: {counts}"
    assert ledger.zk.watches.pending() <= 4


def test_a_quiet_runtime_worker_holds_a_bounded_number_of_watchers(spawn, quiet_job: tuple[str, str, str]) -> None:
    job, src, out = quiet_job

    def fn(record, state):  # never called: nothing arrives
        yield record.key, record.value

    worker = spawn.job(JobSpec(job=job, inputs=(src,), output=out, mode="aligned"), fn)
    led = worker.ledger
    wait_for(lambda: led.zk.watches.pending() > 0, "the worker to wait on a watch")
    counts = []
    for _ in range(6):  # each wake-up reads the ledger again (the worker wakes at least once a second)
        seen = led.round_trips
        wait_for(functools.partial(_more_trips, led, seen), "the worker to wake up")
        assert worker.thread.is_alive() and not worker.error, worker.error
        counts.append((kazoo_watchers(led), led.zk.watches.pending()))
    assert max(c for c, _ in counts) <= 20, counts
    assert counts[-1] == counts[1], f"watchers grow with wake-ups: {counts}"


def test_an_idle_frontier_costs_no_round_trip_and_follows_every_commit(stack, ledger: Ledger, root: str,
                                                                       subject_name: str) -> None:
    """A Spark query asks for the frontier every 10 ms while idle (about 4 reads each, 400 a second): kept
    by a watch on the next epoch, the answer costs nothing until that epoch changes, then follows it."""
    from aligner.connectors.sink import SinkProducer

    create_subject(ledger, stack.kafka, subject_name, 2)
    writer = Ledger.connect(stack.zk, root)  # the commits come from another session, as a producer's do
    try:
        with SinkProducer(writer, stack.kafka, subject_name, "gen", 0, [0, 1]) as sink:
            for want in range(3):
                sink.begin()
                sink.send(b"v", partition=want % 2)
                assert sink.commit().epoch == want

                def reached(want: int = want) -> bool:
                    return ledger.watches.frontier_watched(subject_name) == want

                wait_for(reached, f"the kept frontier to reach epoch {want}")
                idle = ledger.round_trips
                for _ in range(200):
                    assert ledger.watches.frontier_watched(subject_name) == want
                assert ledger.round_trips == idle, "an idle frontier read ZooKeeper"
            sink.begin()  # epoch 3 exists but is open: the watch fires, the frontier stays
            sink.send(b"v", partition=0)
            wait_for(lambda: ledger.watches.frontier_watched(subject_name) == 2 and ledger.round_trips > idle,
                     "the kept frontier to look again at the open epoch")
            pending = ledger.zk.watches.pending()
            for _ in range(3):  # read again and again (as after FRONTIER_REREAD): one waiter, re-armed
                ledger._frontiers[subject_name].moved.set()
                assert ledger.watches.frontier_watched(subject_name) == ledger.epochs.frontier(subject_name) == 2
            assert 0 < ledger.zk.watches.pending() <= pending, "re-reading the frontier piles up watch callbacks"
            sink.commit()
            wait_for(lambda: ledger.watches.frontier_watched(subject_name) == 3, "the kept frontier to reach epoch 3")
    finally:
        writer.close()


def test_a_prefetched_epoch_is_read_from_memory_and_an_open_one_is_not_kept(stack, ledger: Ledger, root: str,
                                                                             subject_name: str) -> None:
    """A worker prefetches the subject epoch its next job epoch starts from: once the background reads land,
    that epoch costs no round trip; an epoch still open is not cached, so it is read again once committed."""
    from aligner.connectors.sink import SinkProducer

    create_subject(ledger, stack.kafka, subject_name, 2)
    writer = Ledger.connect(stack.zk, root)
    try:
        with SinkProducer(writer, stack.kafka, subject_name, "gen", 0, [0, 1]) as sink:
            sink.begin()
            sink.send(b"v", partition=0)
            sink.commit()
            sink.begin()  # epoch 1: open
            sink.send(b"w", partition=1)
            ledger.epochs.prefetch_committed(subject_name, 0)
            ledger.epochs.prefetch_committed(subject_name, 1)
            wait_for(lambda: ledger.cached(subject_name, 0) is not None, "the prefetch of epoch 0 to land")
            before = ledger.round_trips
            prefetched = ledger.epochs.committed_if(subject_name, 0)
            assert prefetched is not None and prefetched.slices[0].count == 1
            assert ledger.round_trips == before, "a prefetched epoch was read again"
            assert ledger.epochs.committed_if(subject_name, 1) is None and ledger.cached(subject_name, 1) is None
            sink.commit()
            committed = ledger.epochs.committed_if(subject_name, 1)
            assert committed is not None and committed.slices[1].count == 1
    finally:
        writer.close()


def test_pipelined_reports_arrive_in_order_and_recreate_a_removed_node(stack, ledger: Ledger) -> None:
    from aligner.jobs import PipelinedReports
    from aligner.models import ConsumerNode

    jobs = ledger.jobs
    reports = PipelinedReports(jobs, "job", 0)
    path = ledger.layout.consumer("job", "s", 0)
    for epoch in range(5):
        reports.send("s", ConsumerNode(job_epoch=epoch))
    reports.flush()
    assert jobs.consumers("job", "s")[0].job_epoch == 4
    ledger.zk.delete(path)  # removed meanwhile (a rescale's clean-up): the next report but one creates it
    reports.send("s", ConsumerNode(job_epoch=5))
    reports.send("s", ConsumerNode(job_epoch=6))
    reports.flush()
    assert jobs.consumers("job", "s")[0].job_epoch == 6
