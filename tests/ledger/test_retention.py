"""Retention by policy: the pure policy's properties, a policy pass on the real stack, and
the long-running ``aligner retention run`` collecting a running chain by itself under leader election."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.coordinator.gc import collect
from aligner.embedded.stack import ZOOKEEPER, EmbeddedStack, StackInfo, free_port
from aligner.ledger import Lease, Ledger
from aligner.lineage import SparkLineageLedger
from aligner.lineage_models import SparkSinkEpochNode, SparkSourceBatchNode
from aligner.models import ConsumerNode, JobNode, Phase, Range, SubjectNode, SwapNode, WorkerEpochNode
from aligner.retention_policy import RetentionPolicy, first_young, retention_floor, victims
from experiments.bench_status import build_ledger
from tests.conftest import run_cli
from tests.helpers import wait_for

LIVE = 180
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""
STOPS_WITHIN = 5.0
"""SIGTERM stops a long-running component within this many seconds (house rule)."""

# ---- (a) the pure policy -------------------------------------------------------------------------------


@st.composite
def ledgers(draw: st.DrawFn) -> dict:
    n = draw(st.integers(0, 80))
    start = draw(st.integers(0, 20))
    numbers = list(range(start, start + n))
    frontier = draw(st.one_of(st.none(), st.integers(start - 1, start + n - 1))) if n else None
    gaps = draw(st.lists(st.integers(0, 5_000), min_size=n, max_size=n))
    times, t = {}, 1_000_000
    for e, gap in zip(numbers, gaps, strict=True):
        t += gap
        times[e] = t
    policy = RetentionPolicy(enabled=draw(st.booleans()), min_epochs=draw(st.integers(1, 40)),
                             hours=draw(st.one_of(st.none(), st.floats(0, 0.05))))
    return {"numbers": numbers, "frontier": None if frontier is not None and frontier < start else frontier,
            "times": times, "now": t + draw(st.integers(0, 100_000)), "policy": policy,
            "needed": draw(st.lists(st.integers(0, start + n + 5), max_size=4)),
            "previous": draw(st.integers(0, start + n + 1))}


def _floor(c: dict) -> int:
    return retention_floor(c["numbers"], c["frontier"], c["times"].get, c["now"], c["policy"], c["needed"],
                           c["previous"])


@settings(max_examples=400, deadline=None)
@given(ledgers())
def test_policy_never_deletes_what_a_consumer_needs_and_keeps_min_epochs(c):
    floor = _floor(c)
    gone = victims(c["numbers"], floor)
    assert floor >= c["previous"], "the floor never goes down"
    if not c["policy"].enabled or c["frontier"] is None:
        assert floor == c["previous"]
        return
    done = [e for e in c["numbers"] if e <= c["frontier"]]
    # Anything collected now that a consumer needs was already out of retention (below the old floor).
    for need in c["needed"]:
        assert all(e < c["previous"] for e in gone if e >= need)
    # Uncommitted epochs stay; at least min_epochs committed ones stay (unless an older floor said otherwise).
    assert all(e <= c["frontier"] or e < c["previous"] for e in gone)
    want = done[-c["policy"].min_epochs:]
    if want and c["previous"] <= want[0]:
        assert all(e not in gone for e in want)
    # An epoch younger than the time bound stays.
    if c["policy"].keep_ms is not None:
        young = [e for e in done if c["times"][e] >= c["now"] - c["policy"].keep_ms]
        assert all(e not in gone for e in young if e >= c["previous"])


@settings(max_examples=200, deadline=None)
@given(ledgers(), st.integers(0, 50), st.integers(0, 200_000))
def test_floors_only_rise_as_time_passes_and_consumers_move(c, moved, later):
    first = _floor(c)
    again = _floor({**c, "previous": first, "now": c["now"] + later,
                    "needed": [n + moved for n in c["needed"]]})
    assert again >= first


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 1_000), max_size=60), st.integers(0, 70_000))
def test_first_young_is_the_linear_answer_on_rising_times(gaps, since):
    times, t = [], 0
    for g in gaps:
        t += g
        times.append(t)
    done = list(range(len(times)))
    expected = next((i for i, at in enumerate(times) if at >= since), len(times))
    assert first_young(done, lambda e: times[e], since) == expected


def test_gc_flags_override_the_policy_bounds():
    base = RetentionPolicy(hours=24, min_epochs=1000)
    assert base.with_bounds(None, None) == base
    assert base.with_bounds(2, None).model_dump() == {"enabled": True, "hours": None, "min_epochs": 2}
    assert base.with_bounds(None, 3600).model_dump() == {"enabled": True, "hours": 1.0, "min_epochs": 1000}


# ---- (b) a policy pass on the real stack ----------------------------------------------------------------


def _write_epochs(ledger: Ledger, subject: str, sink: str, partition: int, count: int) -> Lease:
    """``count`` empty epochs of one producer through the ledger's commit path (a sink's two round trips)."""
    lease = ledger.claims.claim(subject, sink, "0", [partition], lambda: {partition: 0})
    writers = None
    for _ in range(count):
        epoch = lease.next_epoch
        writers = ledger.commits.ensure_epoch(subject, epoch, writers)
        lease = ledger.commits.commit(lease, epoch, lease.node.incarnation, {partition: Range(start=0, end=0)})
    return lease


def test_policy_pass_keeps_min_epochs_and_what_a_consumer_needs(stack, ledger, cli_env, subject_name):

    raw, out = subject_name, f"{subject_name}-out"
    create_subject(ledger, stack.kafka, raw, 2)
    ledger.subjects.register_subject(SubjectNode(name=out, topic=out, partitions=1))
    early = _write_epochs(ledger, raw, "early", 0, 100)
    ledger.commits.finish(early)  # a writer that finished long ago (not a swapped-out job: a restart re-opens it)
    _write_epochs(ledger, raw, "gen", 1, 2400)
    assert ledger.epochs.frontier(raw) == 2499
    jobs = ledger.jobs
    jobs.register(JobNode(job=f"{raw}-j", inputs=(raw,), output=out, parallelism=1))
    jobs.report(f"{raw}-j", raw, 0, ConsumerNode(subject_epoch=700))  # a consumer holding an old floor
    lineage = SparkLineageLedger(ledger)
    lay = ledger.layout
    for e in (5, 700, 701, 2000):
        ledger.zk.create(lay.spark_sink_epoch(raw, "gen", e), SparkSinkEpochNode(query="q", batch=e, epoch=e).dump(),
                         makepath=True)
    for b, (first, last) in enumerate([(0, 10), (11, 700), (701, 2000), (2001, 2499)]):
        lineage.record_source_batch(SparkSourceBatchNode(query="q", batch=b, subject=raw, first=first, last=last))

    young = collect(ledger, policy=RetentionPolicy())  # the default policy: 24 h, all of these are young
    assert young["subjects"][raw] == {"first_retained": 0, "deleted_epochs": 0}

    report = collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=1000))
    assert report["subjects"][raw] == {"first_retained": 701, "deleted_epochs": 701}
    assert ledger.subjects.first_retained(raw) == 701 and ledger.subjects.epoch_numbers(raw) == list(range(701, 2500))
    assert lineage.sink_epoch_numbers(raw, "gen") == [701, 2000]
    assert ledger.numbers(lay.query_batches("q")) == [2, 3]
    assert ledger.zk.exists(lay.producer(raw, "early", "0")) and ledger.zk.exists(lay.producer(raw, "gen", "0"))
    r = run_cli(cli_env, "read", raw, "--epoch", "5")
    assert r.returncode == 1 and "out of retention" in r.stderr and "earliest retained epoch is 701" in r.stderr

    jobs.report(f"{raw}-j", raw, 0, ConsumerNode(subject_epoch=2400))  # it moved on: the count bound rules
    again = collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=1000))
    assert again["subjects"][raw]["first_retained"] == 1500 and ledger.subjects.epoch_numbers(raw)[0] == 1500
    assert ledger.epochs.committed(raw, 1500).epoch == 1500  # the first retained epoch reads as ever


def test_a_retained_output_epoch_keeps_its_lineage_when_retention_removed_its_inputs(stack, ledger, subject_name):
    """Each subject keeps by its own policy: an input with more epochs loses them first. The lineage of an output
    epoch still retained names the inputs retention removed (``collected``) instead of failing on them, and says
    so when the micro-batch's read record went with them."""
    from aligner.errors import EpochCollectedError
    from aligner.lineage import flatten, subject_epoch_lineage

    raw, out = subject_name, f"{subject_name}-out"
    create_subject(ledger, stack.kafka, raw, 1)
    ledger.subjects.register_subject(SubjectNode(name=out, topic=out, partitions=1))
    _write_epochs(ledger, raw, "gen", 0, 40)  # in: 40 epochs; out: 4, each of a micro-batch reading 10
    _write_epochs(ledger, out, "sq", 0, 4)
    lay, lineage = ledger.layout, SparkLineageLedger(ledger)
    for b in range(4):
        ledger.zk.create(lay.spark_sink_epoch(out, "sq", b), SparkSinkEpochNode(query="q", batch=b, epoch=b).dump(),
                         makepath=True)
        lineage.record_source_batch(SparkSourceBatchNode(query="q", batch=b, subject=raw, first=10 * b,
                                                         last=10 * b + 9))
    before = flatten(subject_epoch_lineage(ledger, out, 1))
    assert before == {raw: list(range(10, 20)), out: [1]}

    collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=5))  # in keeps 35..39, out keeps all 4
    assert ledger.subjects.first_retained(raw) == 35 and ledger.subjects.first_retained(out) == 0
    assert ledger.numbers(lay.query_batches("q")) == [3]  # batches 0..2 read only removed epochs

    tree = subject_epoch_lineage(ledger, out, 1)
    (producer,) = tree["producers"]
    assert producer["aligned"] is None and "micro-batch 1 of query q" in producer["inputs_collected"]
    assert flatten(tree) == {out: [1]}
    last = subject_epoch_lineage(ledger, out, 3)  # its batch record stays; of its inputs, 30..34 are gone
    (producer,) = last["producers"]
    assert producer["aligned"] is True and flatten(last) == {raw: list(range(30, 40)), out: [3]}
    assert [i["epoch"] for i in producer["inputs"] if i.get("collected")] == list(range(30, 35))
    with pytest.raises(EpochCollectedError, match="earliest retained epoch is 35"):
        subject_epoch_lineage(ledger, raw, 12)  # asked for directly, a removed epoch is an error


def test_a_job_whose_workers_have_not_reported_holds_retention(ledger, subject_name):
    """A worker that has not started yet reads from the start of retention: nothing moves until it reports."""
    out = f"{subject_name}-out"
    for name in (subject_name, out):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
    _write_epochs(ledger, subject_name, "gen", 0, 30)
    jobs = ledger.jobs
    jobs.register(JobNode(job=f"{subject_name}-j", inputs=(subject_name,), output=out, parallelism=2))
    tight = RetentionPolicy(hours=0, min_epochs=5)
    assert collect(ledger, policy=tight)["subjects"][subject_name]["deleted_epochs"] == 0
    jobs.report(f"{subject_name}-j", subject_name, 0, ConsumerNode(subject_epoch=20))
    assert collect(ledger, policy=tight)["subjects"][subject_name]["deleted_epochs"] == 0  # worker 1 still missing
    jobs.report(f"{subject_name}-j", subject_name, 1, ConsumerNode(subject_epoch=22))
    assert collect(ledger, policy=tight)["subjects"][subject_name]["first_retained"] == 21
    assert ledger.subjects.epoch_numbers(subject_name) == list(range(21, 30))


def test_status_of_a_consumer_that_read_nothing_after_retention_took_the_first_epochs(ledger, subject_name):
    """A worker started after retention removed a subject's first epochs (a hot-swap's new version) reports
    no consumed epoch yet: `aligner status` counts its lag from the earliest retained epoch (it failed with
    "epoch 0 ... is out of retention" for as long as such a worker had not read, in a soak)."""
    out = f"{subject_name}-out"
    for name in (subject_name, out):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
    _write_epochs(ledger, subject_name, "gen", 0, 30)
    jobs = ledger.jobs
    jobs.register(JobNode(job=f"{subject_name}-j", inputs=(subject_name,), output=out, parallelism=1))
    jobs.report(f"{subject_name}-j", subject_name, 0, ConsumerNode(subject_epoch=25))
    assert collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=5))["subjects"][subject_name][
        "first_retained"] == 25
    late = f"{subject_name}-late"
    jobs.register(JobNode(job=late, inputs=(subject_name,), output=out, parallelism=1))
    jobs.report(late, subject_name, 0, ConsumerNode())
    row = Coordinator(ledger).source_status(late, subject_name)
    assert row["lag_epochs"] == 5 and row["lag_seconds"] >= 0 and row["last_committed"] == 29


def test_a_workers_restart_point_holds_its_epochs(ledger, subject_name):
    """A consumer report may run ahead of the worker's last committed record, from which a restart loads."""
    out = f"{subject_name}-out"
    for name in (subject_name, out):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
    _write_epochs(ledger, subject_name, "gen", 0, 30)
    jobs, job = ledger.jobs, f"{subject_name}-j"
    jobs.register(JobNode(job=job, inputs=(subject_name,), output=out, parallelism=1))
    jobs.report(job, subject_name, 0, ConsumerNode(subject_epoch=25))
    jobs.ensure_worker_path(job, 0)
    ledger.multi(jobs.worker_epoch_op(job, 0, WorkerEpochNode(epoch=3, mode="aligned", offsets={},
                                                              load_from={subject_name: 12})))
    assert collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=2))["subjects"][subject_name] == {
        "first_retained": 12, "deleted_epochs": 12}


def test_a_swap_in_flight_and_a_shadow_lane_hold_their_epochs(ledger, subject_name):
    """Nothing of a swap's target from S on goes while the swap is in flight, and a new version's shadow
    and the target it is verified against keep the same floor until the old version is swapped out."""
    raw, target, shadow = subject_name, f"{subject_name}-t", f"{subject_name}-v2.shadow"
    old, new = f"{subject_name}-v1", f"{subject_name}-v2"
    for name in (raw, shadow):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
        _write_epochs(ledger, name, "gen", 0, 30)
    ledger.subjects.register_subject(SubjectNode(name=target, topic=target, partitions=2))
    ledger.commits.finish(_write_epochs(ledger, target, old, 0, 15))  # v1 wrote 0..14 and finished
    _write_epochs(ledger, target, new, 1, 15)  # v2 writes on from 15, on partitions of its own
    jobs = ledger.jobs
    jobs.register(JobNode(job=old, inputs=(raw,), output=target, parallelism=1))
    jobs.register(JobNode(job=new, inputs=(raw,), output=target, parallelism=1, follows=old, shadow=shadow))
    for job in (old, new):
        jobs.report(job, raw, 0, ConsumerNode(subject_epoch=29))
    tight = RetentionPolicy(hours=0, min_epochs=5)
    swap = SwapNode(old=old, new=new, target=target, epoch=10, phase=Phase.PRECOMMIT)
    jobs.write_swap(swap, -1)
    shadow_floor = collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=20))["subjects"][shadow]
    assert shadow_floor["first_retained"] == 10 and ledger.subjects.first_retained(target) == 10
    assert collect(ledger, policy=tight)["subjects"][raw]["first_retained"] == 25
    assert ledger.subjects.first_retained(target) == 10 and ledger.subjects.first_retained(shadow) == 10
    jobs.write_swap(swap.model_copy(update={"phase": Phase.DONE}), 0)
    report = collect(ledger, policy=tight)
    assert ledger.subjects.first_retained(target) == 25 and ledger.subjects.first_retained(shadow) == 25
    assert report["jobs"][old]["swapped_out"] and not ledger.zk.exists(ledger.layout.sources(old))
    lay = ledger.layout  # the swapped-out version's producer goes once its epochs have
    assert not ledger.zk.exists(lay.producer(target, old, "0")) and ledger.zk.exists(lay.producer(target, new, "0"))
    again = collect(ledger, policy=tight)  # a second pass over a swapped-out job is uneventful
    assert again["jobs"][old] == {"deleted_nodes": 0, "swapped_out": True}
    row = Coordinator(ledger).status(old)  # status and the exporter still show it (they failed on it)
    assert row["swapped_to"] == new and [s["state"] for s in row["sources"]] == ["swapped out"]


def test_a_new_version_that_may_still_inherit_keeps_the_old_versions_worker_records(ledger, subject_name):
    """A new version's worker takes the old version's state as of the epoch before its first, from the old
    worker's record of that epoch: retention keeps every record of the old version until each worker of the
    new one has committed (a slow-starting worker waited forever for a record a pass had removed: the chain
    stalled in a soak with one epoch kept)."""
    raw, out = subject_name, f"{subject_name}-out"
    for name in (raw, out):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
    old, new = f"{subject_name}-v1", f"{subject_name}-v2"
    jobs = ledger.jobs
    jobs.register(JobNode(job=old, inputs=(raw,), output=out, parallelism=1))
    jobs.register(JobNode(job=new, inputs=(raw,), output=out, parallelism=2, follows=old))

    def record(job: str, worker: int, epoch: int) -> None:
        jobs.ensure_worker_path(job, worker)
        ledger.multi(jobs.worker_epoch_op(job, worker, WorkerEpochNode(epoch=epoch, mode="aligned", offsets={},
                                                                     load_from={raw: 0})))

    for e in range(10):
        record(old, 0, e)
    record(new, 0, 9)  # worker 1 of the new version has not committed yet
    tight = RetentionPolicy(hours=0, min_epochs=1)
    collect(ledger, policy=tight)
    assert jobs.worker_epoch_numbers(old, 0) == list(range(10))
    record(new, 1, 9)
    collect(ledger, policy=tight)
    assert jobs.worker_epoch_numbers(old, 0) == [9]


def test_batched_deletes_fall_back_one_by_one_when_a_node_changed_meanwhile(ledger, subject_name):
    """A multi-op of deletes fails as a whole when a node is gone or gained a child since it was listed;
    its nodes are then deleted one by one, recursively, and only those that existed are counted."""
    from aligner.retention import Retention

    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
    _write_epochs(ledger, subject_name, "gen", 0, 6)
    lay = ledger.layout
    paths = [lay.epoch(subject_name, e) for e in range(6)] + [lay.epoch(subject_name, 99)]  # 99: none
    assert Retention(ledger).delete(paths, depth=0) == 6  # depth 0: the contributions were not listed
    assert ledger.subjects.epoch_numbers(subject_name) == []


def test_retention_switched_off_removes_nothing(ledger, subject_name):
    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
    _write_epochs(ledger, subject_name, "gen", 0, 30)
    report = collect(ledger, policy=RetentionPolicy(enabled=False, hours=0, min_epochs=1))
    assert report["subjects"] == {} and ledger.subjects.epoch_numbers(subject_name) == list(range(30))


def test_a_changelog_goes_only_below_every_workers_state_base(ledger, subject_name):
    """A job's changelog is collected like a subject, but never below the state base of a worker's oldest
    retained record (a restore replays from there); a record without a base holds all of it."""
    inp, out, job = subject_name, f"{subject_name}-out", f"{subject_name}-j"
    changelog = f"{job}.state"
    for name, parts in ((inp, 1), (out, 1), (changelog, 2)):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=parts))
    _write_epochs(ledger, changelog, "job", 0, 30)
    jobs = ledger.jobs
    jobs.register(JobNode(job=job, inputs=(inp,), output=out, parallelism=2))
    tight = RetentionPolicy(hours=0, min_epochs=2)

    def record(worker: int, epoch: int, base: int | None) -> None:
        jobs.ensure_worker_path(job, worker)
        ledger.multi(jobs.worker_epoch_op(job, worker, WorkerEpochNode(
            epoch=epoch, mode="aligned", offsets={}, load_from={}, state_base=base)))

    record(0, 20, 10)
    assert collect(ledger, policy=tight, subjects=[changelog])["subjects"][changelog]["deleted_epochs"] == 0
    record(1, 20, None)  # an older worker record: its restore replays the whole changelog
    assert collect(ledger, policy=tight, subjects=[changelog])["subjects"][changelog]["deleted_epochs"] == 0
    record(1, 21, 15)  # worker 1's oldest record still has no base
    assert collect(ledger, policy=tight, subjects=[changelog])["subjects"][changelog]["deleted_epochs"] == 0
    jobs_pruned = collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=1))  # worker records but the last
    assert jobs_pruned["jobs"][job]["deleted_nodes"] >= 1
    report = collect(ledger, policy=tight, subjects=[changelog])["subjects"][changelog]
    assert report == {"first_retained": 10, "deleted_epochs": 10}  # worker 0's base 10 < worker 1's 15
    assert ledger.subjects.epoch_numbers(changelog) == list(range(10, 30))


def test_a_swapped_out_versions_changelog_goes_once_the_new_version_has_its_own_state(ledger, subject_name):
    """Found by the 2-hour soak: every hot-swap left the old version's changelog, kept at the policy's 1,000
    epochs for ever, so ZooKeeper grew with each swap. Once the old version is swapped out, its sink finished
    and each version following it committed a record for every worker (they restore from their own
    changelog), all of the old changelog's epochs go; not before."""
    raw, target = subject_name, f"{subject_name}-t"
    old, new = f"{subject_name}-v1", f"{subject_name}-v2"
    changelog = f"{old}.state"
    for name, parts in ((raw, 1), (target, 1), (changelog, 1)):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=parts))
    _write_epochs(ledger, changelog, old, 0, 30)
    ledger.commits.finish(_write_epochs(ledger, target, old, 0, 15))
    jobs = ledger.jobs
    jobs.register(JobNode(job=old, inputs=(raw,), output=target, parallelism=1))
    jobs.register(JobNode(job=new, inputs=(raw,), output=target, parallelism=1, follows=old))
    jobs.write_swap(SwapNode(old=old, new=new, target=target, epoch=14, phase=Phase.DONE), -1)
    policy = RetentionPolicy(hours=0, min_epochs=1000)
    collect(ledger, policy=policy)
    assert ledger.subjects.epoch_numbers(changelog) == list(range(30))  # v2 has no record yet: it may inherit again
    jobs.ensure_worker_path(new, 0)
    ledger.multi(jobs.worker_epoch_op(new, 0, WorkerEpochNode(epoch=15, mode="aligned", offsets={}, load_from={},
                                                                state_base=15)))
    report = collect(ledger, policy=policy)
    assert report["subjects"][changelog] == {"first_retained": 30, "deleted_epochs": 30}
    assert ledger.subjects.epoch_numbers(changelog) == [] and ledger.subjects.first_retained(changelog) == 30
    assert collect(ledger, policy=policy)["subjects"][changelog]["deleted_epochs"] == 0  # and stays so


def test_a_changelog_no_job_owns_is_never_collected(ledger, subject_name):
    changelog = f"{subject_name}.state"
    ledger.subjects.register_subject(SubjectNode(name=changelog, topic=changelog, partitions=1))
    _write_epochs(ledger, changelog, "job", 0, 30)
    collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=1))
    assert ledger.subjects.epoch_numbers(changelog) == list(range(30))
    assert ledger.subjects.first_retained(changelog) == 0


# ---- (c) the long-running command ------------------------------------------------------------------------


def _retention_env(cli_env: dict[str, str], min_epochs: int) -> dict[str, str]:
    return {**cli_env, "ALIGNER_RETENTION_HOURS": "0", "ALIGNER_RETENTION_MIN_EPOCHS": str(min_epochs)}


def _metrics(port: int) -> dict[str, float]:
    """The unlabelled samples the process serves on ``port``."""
    from urllib.request import urlopen

    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {k: float(v) for k, v in (line.split(" ", 1) for line in text.splitlines()
                                     if line and not line.startswith("#") and "{" not in line)}


def _sigterm(worker) -> float:
    """SIGTERM the worker; the seconds it took to exit (it must exit 0)."""
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    code = worker.proc.wait(30)
    took = time.monotonic() - began
    assert code == 0, worker.stderr
    return took


def test_retention_run_collects_a_running_chain_and_stops_on_sigterm(stack, ledger, cli_env, subject_name, spawn):
    from aligner.connectors.runtime import JobSpec
    from tests.jobs import tag_v1

    raw, out = subject_name, f"{subject_name}-out"
    for name in (raw, out):
        create_subject(ledger, stack.kafka, name, 2)
    running = threading.Event()
    spawn.generator(raw, epochs=100_000, per_epoch=4, pace=0.02, until=running)
    spawn.job(JobSpec(job=f"{raw}-a", inputs=(raw,), output=out, interval=0.1), tag_v1)
    wait_for(lambda: (ledger.epochs.frontier(out) or 0) >= 40, LIVE, "the chain to commit 40 output epochs")
    port = free_port()
    keeper = spawn.worker("aligner.coordinator", "retention", "run", "--every", "0.5", "--metrics-port", str(port),
                          env=_retention_env(cli_env, 20))
    wait_for(lambda: ledger.subjects.first_retained(raw) > 0 and ledger.subjects.first_retained(out) > 0, LIVE,
             "retention to collect both subjects by itself", interval=0.2)
    moved_from = ledger.epochs.frontier(out) or 0
    wait_for(lambda: (ledger.epochs.frontier(out) or 0) >= moved_from + 10
             and ledger.subjects.first_retained(out) > moved_from - 20,
             LIVE, "the chain to go on and retention to follow it", interval=0.2)
    consumed = ledger.jobs.consumers(f"{raw}-a", raw)[0].subject_epoch or 0
    assert ledger.subjects.first_retained(raw) <= consumed + 1, "an epoch the job had not consumed was collected"
    assert "retention pass: removed" in keeper.stderr
    metrics = _metrics(port)
    assert metrics["aligner_retention_leader"] == 1 and metrics["aligner_retention_deleted_epochs_total"] > 0
    assert _sigterm(keeper) < STOPS_WITHIN
    running.set()


def test_align_runs_beside_the_retention_loop_and_its_passes_wait_for_it(stack, ledger, cli_env, subject_name,
                                                                          spawn):
    """The retention loop, as ``aligner stack up`` starts it, holds the coordinators' election only during a
    pass: an ``aligner align`` run beside it gets its turn (it used to wait for the loop forever) and
    passes go on once it is done."""
    from aligner.connectors.runtime import JobSpec
    from tests.jobs import tag_v1

    raw, out = subject_name, f"{subject_name}-out"
    for name in (raw, out):
        create_subject(ledger, stack.kafka, name, 2)
    running = threading.Event()
    spawn.generator(raw, epochs=100_000, per_epoch=4, pace=0.02, until=running)
    job = f"{raw}-a"
    spawn.job(JobSpec(job=job, inputs=(raw,), output=out, interval=0.1), tag_v1)
    keeper = spawn.worker("aligner.coordinator", "retention", "run", "--every", "0.3",
                          env=_retention_env(cli_env, 20))
    wait_for(lambda: "retention: leading" in keeper.stderr and "retention pass" in keeper.stderr, LIVE,
             "the loop to lead and run a pass", on_wait=keeper.healthy)
    done = run_cli(cli_env, "align", job, "--timeout", "120", "--json", timeout=180)
    assert done.returncode == 0, done.stderr
    passes = keeper.stderr.count("retention pass")
    wait_for(lambda: keeper.stderr.count("retention pass") > passes, LIVE, "passes to go on after the align",
             on_wait=keeper.healthy)
    assert _sigterm(keeper) < STOPS_WITHIN
    running.set()


def test_only_the_leader_collects_and_a_standby_takes_over(stack, ledger, cli_env, subject_name, spawn):
    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
    env = _retention_env(cli_env, 10)
    first = spawn.worker("aligner.coordinator", "retention", "run", "--every", "0.3", env=env)
    wait_for(lambda: "retention: leading" in first.stderr, LIVE, "the first instance to lead", on_wait=first.healthy)
    second = spawn.worker("aligner.coordinator", "retention", "run", "--every", "0.3", env=env)
    wait_for(lambda: "retention: standby" in second.stderr, LIVE, "the second to wait", on_wait=second.healthy)
    lease = _write_epochs(ledger, subject_name, "gen", 0, 50)
    wait_for(lambda: ledger.subjects.first_retained(subject_name) == 40, LIVE, "the leader to collect", interval=0.1)
    assert "retention pass" not in second.stderr and "retention pass: removed" in first.stderr
    assert _sigterm(first) < STOPS_WITHIN
    wait_for(lambda: "retention: leading" in second.stderr, LIVE, "the standby to take over", on_wait=second.healthy)
    writers = None
    for _ in range(20):
        epoch = lease.next_epoch
        writers = ledger.commits.ensure_epoch(subject_name, epoch, writers)
        lease = ledger.commits.commit(lease, epoch, lease.node.incarnation, {0: Range(start=0, end=0)})
    wait_for(lambda: ledger.subjects.first_retained(subject_name) == 60, LIVE, "the new leader to collect",
             interval=0.1)
    assert _sigterm(second) < STOPS_WITHIN


@pytest.fixture
def own_stack() -> Iterator[tuple[EmbeddedStack, StackInfo]]:
    """A stack of this test's own: its ZooKeeper is killed and restarted."""
    stack = EmbeddedStack()
    info = stack.start()
    try:
        yield stack, info
    finally:
        stack.stop()


def test_retention_run_rides_out_a_zookeeper_outage_and_stops_during_one(own_stack, cli_env, subject_name, spawn):
    stack, info = own_stack
    root = cli_env["ALIGNER_ROOT"]
    env = {**_retention_env(cli_env, 10), "ALIGNER_ZK": info.zk, "ALIGNER_KAFKA": info.kafka}
    with Ledger.connect(info.zk, root) as led:
        led.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
        keeper = spawn.worker("aligner.coordinator", "retention", "run", "--every", "0.3", env=env)
        wait_for(lambda: "retention: leading" in keeper.stderr, LIVE, "it to lead", on_wait=keeper.healthy)
        lease = _write_epochs(led, subject_name, "gen", 0, 30)
        wait_for(lambda: led.subjects.first_retained(subject_name) == 20, LIVE, "a first collection", interval=0.1)
    zk = stack.pid(ZOOKEEPER)
    assert zk is not None
    os.kill(zk, signal.SIGKILL)
    wait_for(lambda: stack.pid(ZOOKEEPER) is None, 30, "ZooKeeper to die")
    wait_for(lambda: "ZooKeeper connection lost" in keeper.stderr or "retention pass failed" in keeper.stderr
             or "election unavailable" in keeper.stderr, LIVE, "it to see the outage", on_wait=keeper.healthy)
    stack.restart(ZOOKEEPER)
    with Ledger.connect(info.zk, root) as led:
        writers = None
        for _ in range(20):  # the same producer goes on after the outage
            epoch = lease.next_epoch
            writers = led.commits.ensure_epoch(subject_name, epoch, writers)
            lease = led.commits.commit(lease, epoch, lease.node.incarnation, {0: Range(start=0, end=0)})
        wait_for(lambda: led.subjects.first_retained(subject_name) == 40, LIVE, "a collection after the outage",
                 interval=0.1, on_wait=keeper.healthy)
    zk = stack.pid(ZOOKEEPER)
    assert zk is not None
    os.kill(zk, signal.SIGKILL)  # SIGTERM in the middle of an outage still stops it at once
    wait_for(lambda: stack.pid(ZOOKEEPER) is None, 30, "ZooKeeper to die again")
    assert _sigterm(keeper) < STOPS_WITHIN


def test_gc_without_flags_applies_the_policy_and_retention_show_previews_it(ledger, cli_env, subject_name):
    import json

    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
    _write_epochs(ledger, subject_name, "gen", 0, 12)
    env = _retention_env(cli_env, 3)
    shown = run_cli(env, "retention", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    preview = json.loads(shown.stdout)
    assert preview["subjects"][subject_name] == {"first_retained": 9, "deleted_epochs": 9}
    assert preview["policy"] == {"enabled": True, "hours": 0.0, "min_epochs": 3}
    assert ledger.subjects.epoch_numbers(subject_name) == list(range(12)), "show removes nothing"
    default = run_cli(cli_env, "gc", "--json")  # the default policy: everything here is younger than 24 h
    assert json.loads(default.stdout)["subjects"][subject_name]["deleted_epochs"] == 0
    r = run_cli(env, "gc", "--json")
    assert r.returncode == 0, r.stderr
    assert ledger.subjects.first_retained(subject_name) == 9 and ledger.subjects.epoch_numbers(subject_name) == [9,
                                                                                                                 10, 11]
    off = run_cli({**env, "ALIGNER_RETENTION_ENABLED": "false"}, "gc")
    assert off.returncode == 0 and "retention is switched off" in off.stdout


def test_a_bad_retention_setting_is_one_line(cli_env):
    for command in (("gc",), ("retention", "show"), ("retention", "run")):
        r = run_cli({**cli_env, "ALIGNER_RETENTION_MIN_EPOCHS": "many"}, *command)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 1 and len(lines) == 1 and "ALIGNER_RETENTION_MIN_EPOCHS" in lines[0], r.stderr


def test_retention_run_usage_errors_exit_2(cli_env):
    for args in (["retention", "run", "--every", "0"], ["retention", "run", "--min-epochs", "0"],
                 ["retention", "run", "--metrics-port", "0"], ["retention", "nonsense"]):
        r = run_cli(cli_env, *args)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "usage error" in lines[0], (args, r.stderr)


def test_epochs_live_in_buckets_and_retention_removes_the_buckets_it_empties(stack, ledger, subject_name):
    """Numbered nodes sit in buckets of 10,000 (no listing grows with uptime); a bucket retention empties
    goes, the newest stays for the epochs to come."""
    create_subject(ledger, stack.kafka, subject_name, 2)
    build_ledger(ledger, subject_name, 30, writers=1, partitions=2, first=19_990)  # epochs 19,990 .. 20,019
    base = ledger.layout.epochs(subject_name)
    assert [name for _, name in ledger.buckets(base)] == ["0000010000", "0000020000"]
    assert ledger.subjects.epoch_numbers(subject_name) == list(range(19_990, 20_020))
    assert ledger.subjects.epoch_numbers(subject_name, since=20_005) == list(range(20_000,
                                                                                   20_020))  # the last bucket only
    assert ledger.epochs.frontier(subject_name) == 20_019 and ledger.subjects.epoch_count(subject_name) == 30
    assert ledger.subjects.first_epoch(subject_name) == 19_990
    collect(ledger, policy=RetentionPolicy(hours=0, min_epochs=10))
    assert ledger.subjects.first_retained(subject_name) == 20_010
    assert [name for _, name in ledger.buckets(base)] == ["0000020000"]
    assert ledger.subjects.epoch_numbers(subject_name) == list(range(20_010, 20_020))
    assert ledger.epochs.frontier(subject_name) == 20_019 and ledger.subjects.epoch_count(subject_name) == 10
    assert ledger.subjects.first_epoch(subject_name) == 20_010
