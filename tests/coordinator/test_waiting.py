"""The coordinator's waits are woken by ZooKeeper watches (JobLedger's), not by re-reading on a timer.

The waiter's backstop tick is made longer than the test's bound, so a wait that ends in time was
woken by a watch: a consumer report, a consumer joining, a swap node written. Real ZooKeeper.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from aligner.coordinator import waiting
from aligner.coordinator.waiting import Waiter
from aligner.errors import StoppedError
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from aligner.models import ConsumerNode, JobNode, SubjectNode, SwapNode

WOKEN_WITHIN = 5.0
"""A watch must wake the wait well within this; the backstop tick is set far beyond it."""


@pytest.fixture
def jobs(ledger: Ledger, subject_name: str, monkeypatch: pytest.MonkeyPatch) -> JobLedger:
    monkeypatch.setattr(waiting, "TICK", 60.0)
    for name in (subject_name, f"{subject_name}-out"):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
    led = ledger.jobs
    led.register(JobNode(job="j", inputs=(subject_name,), output=f"{subject_name}-out", parallelism=2))
    return led


@pytest.fixture
def later() -> Iterator[list[threading.Timer]]:
    """Timers that write to ZooKeeper while the test waits; cancelled and joined on every path."""
    timers: list[threading.Timer] = []
    yield timers
    for t in timers:
        t.cancel()
        t.join(5.0)


def _in(later: list[threading.Timer], seconds: float, action: Callable[[], object]) -> None:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    later.append(timer)
    timer.start()


def test_consumer_reports_and_joins_wake_the_wait(ledger: Ledger, jobs: JobLedger, subject_name: str,
                                                  later: list[threading.Timer]) -> None:
    waiter = Waiter(ledger)
    waiter.watch_job("j", [subject_name])
    _in(later, 0.3, lambda: jobs.report("j", subject_name, 0, ConsumerNode(job_epoch=1)))
    started = time.monotonic()
    waiter.until(lambda: 0 in jobs.consumers("j", subject_name), "worker 0 to join", timeout=WOKEN_WITHIN)
    _in(later, 0.3, lambda: jobs.report("j", subject_name, 0, ConsumerNode(job_epoch=2)))
    waiter.until(lambda: jobs.consumers("j", subject_name)[0].job_epoch == 2, "worker 0's report",
                 timeout=WOKEN_WITHIN)
    assert time.monotonic() - started < 2 * WOKEN_WITHIN


def test_swap_node_wakes_the_wait(ledger: Ledger, jobs: JobLedger, subject_name: str,
                                  later: list[threading.Timer]) -> None:
    waiter = Waiter(ledger)
    waiter.watch_swap("j")
    node = SwapNode(old="j", new="j2", target=f"{subject_name}-out", epoch=3, phase="precommit")
    _in(later, 0.3, lambda: jobs.write_swap(node, -1))
    waiter.until(lambda: jobs.swap("j")[0] is not None, "the swap node", timeout=WOKEN_WITHIN)


def test_a_wait_without_progress_times_out_and_stops(ledger: Ledger, jobs: JobLedger, subject_name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "TICK", 0.2)
    waiter = Waiter(ledger)
    waiter.watch_job("j", [subject_name])
    with pytest.raises(TimeoutError):
        waiter.until(lambda: False, "nothing", timeout=0.5)
    stop = threading.Event()
    stop.set()
    with pytest.raises(StoppedError):
        Waiter(ledger, stop).until(lambda: False, "nothing")


def test_a_commands_timeout_bounds_all_its_waits_not_each(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """An alignment that starts again, or a hot-swap that aligns first, waits several times: the command's
    timeout is one deadline over all of them (a run of steps each under the timeout never ends otherwise)."""
    monkeypatch.setattr(waiting, "TICK", 0.05)
    waiter = Waiter(ledger)

    def after(seconds: float) -> Callable[[], bool]:
        due = time.monotonic() + seconds
        return lambda: time.monotonic() >= due

    with waiter.within(2.0):
        for _ in range(3):  # each step takes 0.3 s, well under the 2 s: fine
            waiter.until(after(0.3), "a step", timeout=2.0)
        with pytest.raises(TimeoutError, match="gave up after 2s"):
            for _ in range(20):  # 20 more would take 6 s in all
                waiter.until(after(0.3), "a step", timeout=2.0)
    waiter.until(after(0.3), "a step after the command", timeout=2.0)  # the deadline ended with it


def test_align_settles_when_the_sources_are_aligned_already(ledger: Ledger, jobs: JobLedger,
                                                            subject_name: str) -> None:
    """A worker killed after reporting an abort and before its next commit restarts aligned (its last
    committed alignment) and rejects every new Align. The coordinator sees the sources aligned and records
    that alignment, instead of choosing (k, J) again for every rejection (10,000 seqs in one chaos run)."""
    from aligner.alignment import ConsumerAlignment, State
    from aligner.coordinator.alignment import Coordinator
    from aligner.models import AlignmentDecision, DecisionPhase

    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
    job = f"{subject_name}-j"
    jobs.register(JobNode(job=job, inputs=(subject_name,), output=subject_name, parallelism=1))
    jobs.decide(AlignmentDecision(job=job, subjects=(subject_name,), phase=DecisionPhase.ALIGNING, seq=7,
                                  subject_epochs={subject_name: 90}, job_epoch=100), -1)
    restarted = ConsumerAlignment(state=State.ALIGNED, applied_seq=7, subject_epoch=30, job_epoch=44)
    jobs.report(job, subject_name, 0, ConsumerNode(alignment=restarted, rejected_seq=7))
    decision = Coordinator(ledger).align(job, timeout=10)
    assert (decision.phase, decision.seq, decision.job_epoch) == (DecisionPhase.ALIGNED, 7, 44)
    assert decision.subject_epochs == {subject_name: 30}
    assert jobs.decision(job)[0] == decision


def test_a_hotswap_that_waits_for_acknowledgements_names_who_has_not_given_one(
        ledger: Ledger, jobs: JobLedger, subject_name: str) -> None:
    """A swap held at pre-commit says which workers have not acknowledged S and what they reported last (a
    rehearsal's rescale test gave up after 180 s saying only "both jobs to acknowledge S=124")."""
    from aligner.coordinator.hotswap import HotSwap

    out = f"{subject_name}-out"  # the fixture registered both subjects
    old = jobs.register(JobNode(job=f"{subject_name}-v1", inputs=(subject_name,), output=out, parallelism=2))
    new = jobs.register(JobNode(job=f"{subject_name}-v2", inputs=(subject_name,), output=out, parallelism=1,
                                follows=old.job))
    swap = SwapNode(old=old.job, new=new.job, target=out, epoch=12, phase="precommit")
    jobs.report(old.job, subject_name, 0, ConsumerNode(job_epoch=10, swap_seen=(12, 11)))
    jobs.report(old.job, subject_name, 1, ConsumerNode(job_epoch=9, swap_seen=(7, 5)))
    assert HotSwap(ledger)._unacked(old, new, swap) == (
        f"not acknowledged by {old.job}:1 acknowledged (7, 5) at job epoch 9, {new.job}:0 has not reported")
