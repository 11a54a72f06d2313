"""Hot-swap v1 -> v2 of a running job under continuous input: every result exactly once."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest

from aligner.connectors.reader import EpochReader
from aligner.connectors.runtime import JobSpec
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.coordinator.gc import collect
from aligner.coordinator.hotswap import HotSwap, HotSwapRefused
from aligner.coordinator.verify import shadow_span, verify_before_swap, verify_outputs
from aligner.errors import AlignerError
from tests.conftest import run_cli
from tests.helpers import json_value, wait_for
from tests.jobs import count_key, count_v1, count_v2, tag_v1, tag_v2, tag_v3
from tests.streams import assert_exactly_once, read_all
from tests.swaps import assert_s_before_s_plus_1, committed, finish, following, precommit_acked, start_versions

LIVE = 180
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""


def _verify(ledger, stack, target, gen, swap_epoch):
    """Every input's result exactly once; v1's up to S, v2's after; S+1 committed no earlier than S.
    Returns how far apart S and S+1 committed (seconds), for the log: a figure, not a check."""
    outputs = read_all(ledger, stack.kafka, target)
    assert_exactly_once(outputs, gen.sent)
    for epoch, value in outputs:
        assert value["v"] == (1 if epoch <= swap_epoch else 2), f"epoch {epoch} has a v{value['v']} result"
    epochs = ledger.subjects.epoch_numbers(target)
    assert ledger.epochs.frontier(target) == epochs[-1]
    assert any(e > swap_epoch for e, _ in outputs) and any(e <= swap_epoch for e, _ in outputs)
    return assert_s_before_s_plus_1(ledger, target, swap_epoch)


def test_hotswap_under_continuous_input_is_exactly_once(stack, ledger, subject_name, spawn):
    target, more, gen, old, new, v1, v2 = start_versions(stack, ledger, spawn, subject_name)
    swapper = HotSwap(ledger)
    following(swapper, new)
    before = max(swapper.committed(old.job, old.inputs), swapper.committed(new.job, new.inputs))
    swap = swapper.run(old.job, new.job, target, timeout=LIVE)
    assert swap.phase == "done"
    # S is a future epoch: after everything either job had committed when the swap was accepted. How
    # many epochs later it lands is a timing figure (printed below; measured by the hotswap experiment).
    assert swap.epoch > before, f"swap at {swap.epoch}, but the jobs had committed {before} when accepted"
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 5, LIVE, "v2 output after the swap")
    finish(more, gen, v1, v2)
    gap = _verify(ledger, stack, target, gen, swap.epoch)
    print(f"hot-swap accepted with the jobs at epoch {before}, S = {swap.epoch}, epochs S and S+1 {gap:.3f}s apart")
    # The swapped-out job's state goes; the epoch history lineage needs stays.
    report = collect(ledger, keep_epochs=1000)
    assert report["jobs"][old.job]["swapped_out"] and not report["jobs"][new.job]["swapped_out"]
    assert not ledger.zk.exists(f"{ledger.layout.job(old.job)}/workers")
    assert HotSwap(ledger).jobs.job_epoch_numbers(old.job)


def test_new_version_inheriting_the_old_state_continues_it_exactly(stack, ledger, subject_name, spawn):
    """State hand-off: v2 starts from v1's keyed state and input positions as of the epoch before its
    first (read exactly from v1's changelog) instead of replaying the input; after the swap its running
    counts continue v1's without a gap or a repeat, and its first epoch records where its state came from."""
    def some_state(target: str) -> None:
        wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= 5, LIVE, "v1 to build up some state")

    target, more, gen, old, new, v1, v2 = start_versions(stack, ledger, spawn, subject_name, count_v1, count_v2,
                                                 inherit_state=True, before_v2=some_state)
    swap = HotSwap(ledger).run(old.job, new.job, target, timeout=LIVE)
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "v2 output after the swap")
    finish(more, gen, v1, v2)
    outputs = read_all(ledger, stack.kafka, target)
    assert_exactly_once(outputs, gen.sent)
    by_partition: dict[int, list[tuple[int, int, int]]] = {}
    for epoch, value in outputs:
        assert value["v"] == (1 if epoch <= swap.epoch else 2)
        by_partition.setdefault(value["p"], []).append((value["o"], value["count"], value["v"]))
    for p, rows in by_partition.items():
        counts = [c for _, c, _ in sorted(rows)]
        assert counts == list(range(1, len(counts) + 1)), f"partition {p}: counts do not run on across the swap"
    jobs = HotSwap(ledger).jobs
    first = min(jobs.worker_epoch_numbers(new.job, 0))
    assert jobs.worker_epoch(new.job, 0, first).state_from == f"{old.job}@{first - 1}"
    assert v2.worker.records_in < gen.sent, "v2 replayed the input from its start instead of taking v1's state"


@pytest.mark.long  # make test keeps the Spark query's shadow (test_spark_swap)
def test_shadow_is_verified_before_the_swap(stack, ledger, subject_name, spawn, cli_env):
    """v2 runs in shadow mode: what it voids at the target goes to its shadow subject, epoch for epoch.
    A verified swap refuses while v2's results differ from v1's, and goes ahead when the difference
    (the version field) is declared intended; the shadow then equals v1's output on every epoch both wrote."""
    target, more, gen, old, new, v1, v2 = start_versions(stack, ledger, spawn, subject_name, shadow=True)
    with pytest.raises(HotSwapRefused, match=r"differs from .* at epoch \d+"):
        verify_before_swap(ledger, stack.kafka, old.job, new.job, 3, timeout=LIVE)
    assert HotSwap(ledger).jobs.swap(old.job)[0] is None, "a refused swap changed nothing"
    differ = run_cli(cli_env, "verify", "--job", old.job, "--job", new.job, "--json")
    assert differ.returncode == 3, differ.stderr
    assert json.loads(differ.stdout)["read"] == [target, new.shadow_subject]
    report = verify_before_swap(ledger, stack.kafka, old.job, new.job, 3, ignore=["v"], timeout=LIVE)
    assert report is not None and report["first_difference"] is None and report["epochs"] == 3
    swap = HotSwap(ledger).run(old.job, new.job, target, timeout=LIVE)
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "v2 output after the swap")
    finish(more, gen, v1, v2)
    _verify(ledger, stack, target, gen, swap.epoch)
    span = shadow_span(ledger, old.job, new.job)
    assert span is not None and span[1] == swap.epoch
    whole = verify_outputs(ledger, stack.kafka, [old.job, new.job], *span, by_job=True, ignore=["v"])
    assert whole["first_difference"] is None and whole["records"] > 0
    shadow = new.shadow_subject
    assert shadow is not None
    assert all(epoch <= swap.epoch for epoch, _ in read_all(ledger, stack.kafka, shadow))
    ended = ledger.subjects.writers(shadow)[0].writers
    assert ended and all(e.finished_after == swap.epoch for e in ended.values()), f"the shadow lives on: {ended}"


def test_a_job_upgraded_twice_is_exactly_once(stack, ledger, subject_name, spawn):
    """v1 -> v2 -> v3 under continuous input: v3 follows v2, which took over v1's job epochs; each
    version's results land in its own epochs, every input exactly once. The second swap is refused
    while v2 is still only following v1."""
    target, more, gen, old, new, v1, v2 = start_versions(stack, ledger, spawn, subject_name, target_partitions=6)
    newest = JobSpec(job=f"{subject_name}-v3", inputs=(subject_name,), output=target, interval=0.2,
                     output_partitions=(4, 5), version="3", follows=new.job)
    swapper = HotSwap(ledger)
    swapper.jobs.register(newest.node())
    with pytest.raises(HotSwapRefused, match="is still the new version of"):
        swapper.check(new.job, newest.job, target)
    first = swapper.run(old.job, new.job, target, timeout=LIVE)
    v3 = spawn.job(newest, tag_v3)
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= first.epoch + 2, LIVE, "v2 output after the first swap")
    second = HotSwap(ledger).run(new.job, newest.job, target, timeout=LIVE)
    assert second.phase == "done" and second.epoch > first.epoch
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= second.epoch + 3, LIVE, "v3 output after the second swap")
    finish(more, gen, v1, v2)
    v3.join()
    outputs = read_all(ledger, stack.kafka, target)
    assert_exactly_once(outputs, gen.sent)
    for epoch, value in outputs:
        expected = 1 if epoch <= first.epoch else 2 if epoch <= second.epoch else 3
        assert value["v"] == expected, f"epoch {epoch} holds a v{value['v']} result, not v{expected}"
    assert {value["v"] for _, value in outputs} == {1, 2, 3}
    for swap in (first, second):
        assert_s_before_s_plus_1(ledger, target, swap.epoch)


def test_coordinator_killed_after_precommit_resumes_the_swap(stack, ledger, subject_name, cli_env, spawn):
    target, more, gen, old, new, v1, v2 = start_versions(stack, ledger, spawn, subject_name)
    wait_for(lambda: bool(all(c.job_epoch is not None for c in HotSwap(ledger).jobs.consumers(new.job, subject_name)
                              .values()) and HotSwap(ledger).jobs.consumers(new.job, subject_name)), LIVE,
             "v2 following")
    hotswap = ("hotswap", "--old", old.job, "--new", new.job, "--subject", target, "--json")
    first = spawn.worker("aligner.coordinator", *hotswap, env=cli_env)
    wait_for(lambda: HotSwap(ledger).jobs.swap(old.job)[0] is not None, LIVE, "the pre-commit to be recorded",
             on_wait=first.healthy)
    first.kill()
    recorded = HotSwap(ledger).jobs.swap(old.job)[0]
    assert recorded is not None and recorded.phase in ("precommit", "commit", "done")
    second = spawn.worker("aligner.coordinator", *hotswap, env=cli_env)
    assert second.wait(LIVE) == 0, second.stderr
    swap = HotSwap(ledger).jobs.swap(old.job)[0]
    assert swap is not None and swap.phase == "done"
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "v2 output after the swap")
    finish(more, gen, v1, v2)
    _verify(ledger, stack, target, gen, swap.epoch)


def test_hotswap_refuses_what_cannot_be_exactly_once(stack, root, ledger, subject_name):
    raw, other, target = subject_name, f"{subject_name}-o", f"{subject_name}-t"
    for name, parts in ((raw, 1), (other, 1), (target, 4)):
        create_subject(ledger, stack.kafka, name, parts)
    jobs = HotSwap(ledger).jobs
    jobs.register(JobSpec(job=f"{raw}-a", inputs=(raw,), output=target).node())
    jobs.register(JobSpec(job=f"{raw}-b", inputs=(other,), output=target, follows=f"{raw}-a",
                          deterministic=False).node())
    jobs.register(JobSpec(job=f"{raw}-c", inputs=(raw,), output=target, mode="at_least_once").node())
    with pytest.raises(HotSwapRefused) as err:
        HotSwap(ledger).check(f"{raw}-a", f"{raw}-b", target)
    assert "inputs differ" in str(err.value) and "nondeterministic" in str(err.value)
    with pytest.raises(HotSwapRefused, match=r"at-least-once.*must run as the new version"):
        HotSwap(ledger).check(f"{raw}-a", f"{raw}-c", target)


@pytest.mark.parametrize("who", ["old", "new"])
@pytest.mark.parametrize("step", ["precommit", "commit"])
def test_job_killed_at_a_swap_step_still_swaps_exactly_once(stack, root, ledger, subject_name, spawn, who, step):
    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 4)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=5000, pace=0.04, until=more)
    common = ["--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "--input", raw, "--output", target,
              "--interval", "0.2"]
    args = {"old": [*common, "--job", f"{raw}-v1", "--function", "tests.jobs:tag_v1", "--output-partitions", "0,1"],
            "new": [*common, "--job", f"{raw}-v2", "--function", "tests.jobs:tag_v2", "--output-partitions", "2,3",
                    "--version", "2", "--follows", f"{raw}-v1"]}
    procs = {"old": spawn.worker("aligner.connectors.runtime.worker", *args["old"])}
    procs["old"].wait_line(lambda line: line.startswith("committed"))
    Coordinator(ledger).align(f"{raw}-v1", timeout=LIVE)
    procs["new"] = spawn.worker("aligner.connectors.runtime.worker", *args["new"])
    procs["new"].wait_line(lambda line: line.startswith("open"))
    swapper = HotSwap(ledger)
    jobs = swapper.jobs
    o, n = swapper.check(f"{raw}-v1", f"{raw}-v2", target)

    def healthy() -> None:
        for p in procs.values():
            p.healthy()

    wait_for(lambda: bool(all(c.job_epoch is not None for c in jobs.consumers(n.job, raw).values())
                          and jobs.consumers(n.job, raw)), LIVE, "v2 following", on_wait=healthy)
    swap, version = precommit_acked(swapper, o, n, LIVE, on_wait=healthy)
    if step == "commit":
        swap = committed(swap)
        jobs.write_swap(swap, version)
    procs[who].kill()
    procs[who] = spawn.worker("aligner.connectors.runtime.worker", *args[who])
    procs[who].wait_line(lambda line: line.startswith("open"))
    done = swapper.run(o.job, n.job, target, timeout=LIVE)
    assert done.phase == "done" and done.epoch == swap.epoch
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "v2 output after the swap",
             on_wait=healthy)
    more.set()
    gen.finished()
    procs["old"].finish()
    procs["new"].finish()
    _verify(ledger, stack, target, gen, swap.epoch)


def test_hotswap_refuses_a_target_with_other_producers(stack, root, ledger, subject_name):
    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 1)
    create_subject(ledger, stack.kafka, target, 4)
    jobs = HotSwap(ledger).jobs
    jobs.register(JobSpec(job=f"{raw}-a", inputs=(raw,), output=target).node())
    jobs.register(JobSpec(job=f"{raw}-b", inputs=(raw,), output=target, follows=f"{raw}-a").node())
    HotSwap(ledger).check(f"{raw}-a", f"{raw}-b", target)  # acceptable so far
    for act in (Coordinator(ledger).align, Coordinator(ledger).abort):  # a follower is aligned by following
        with pytest.raises(AlignerError, match=r"new version of .*align or abort"):
            act(f"{raw}-b")
    ledger.claims.claim(target, "someone-else", "0", [3], lambda: {3: 0})
    with pytest.raises(HotSwapRefused, match=r"other producers \['someone-else'\]"):
        HotSwap(ledger).check(f"{raw}-a", f"{raw}-b", target)
    assert HotSwap(ledger).jobs.swap(f"{raw}-a")[0] is None  # refused before anything was written


def test_verify_reports_the_first_differing_epoch(stack, ledger, subject_name, cli_env, spawn):
    from tests.conftest import run_cli

    raw, a, b = subject_name, f"{subject_name}-a", f"{subject_name}-b"
    for name in (raw, a, b):
        create_subject(ledger, stack.kafka, name, 2)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=5000, pace=0.02, until=more)
    ja = spawn.job(JobSpec(job=f"{raw}-ja", inputs=(raw,), output=a, interval=0.1), tag_v1)
    jb = spawn.job(JobSpec(job=f"{raw}-jb", inputs=(raw,), output=b, interval=0.1), tag_v1)
    coord = Coordinator(ledger)
    da, db = coord.align(f"{raw}-ja", timeout=LIVE), coord.align(f"{raw}-jb", timeout=LIVE)
    ja_epoch, jb_epoch = da.job_epoch, db.job_epoch
    assert ja_epoch is not None and jb_epoch is not None, "a done alignment names its job epoch"
    wait_for(lambda: (ledger.epochs.frontier(a) or 0) >= ja_epoch + 5, LIVE, "aligned output")
    finish(more, gen, ja, jb)
    jobs = HotSwap(ledger).jobs
    # Both are aligned on the same input: compare the job epochs covering the same subject epochs.
    by_subject: dict[int, dict[str, int]] = {}
    for job, out in ((f"{raw}-ja", a), (f"{raw}-jb", b)):
        for e in jobs.job_epoch_numbers(job):
            node = jobs.job_epoch(job, e)
            assert node is not None, f"no record of job epoch {e} of {job}"
            span = node.covered[raw]
            if span is not None:
                by_subject.setdefault(span.first, {})[out] = e
    shared = [v for _, v in sorted(by_subject.items()) if len(v) == 2 and v[a] == v[b]]
    if shared:  # identical epoch numbers on both sides: verify must call them identical
        e = shared[0][a]
        r = run_cli(cli_env, "verify", "--subject", a, "--subject", b, "--epochs", f"{e}:{e}", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
    same = run_cli(cli_env, "verify", "--job", f"{raw}-ja", "--job", f"{raw}-ja", "--epochs", "0:5", "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["records"] > 0
    # Outputs of different epochs differ, and verify says where.
    first = max(ja_epoch, jb_epoch)
    r = run_cli(cli_env, "verify", "--subject", a, "--subject", raw, "--epochs", f"{first}:{first + 3}", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 3 and report["first_difference"]["epoch"] == first


def test_coordinator_lost_after_commit_is_resumed_by_the_next(stack, ledger, subject_name, cli_env, spawn):
    """The commit phase written, then the coordinator gone: `aligner hotswap` again finishes it."""
    target, more, gen, old, new, v1, v2 = start_versions(stack, ledger, spawn, subject_name)
    swapper = HotSwap(ledger)
    o, n = swapper.check(old.job, new.job, target)
    following(swapper, new)
    swap, version = precommit_acked(swapper, o, n, LIVE)
    swapper.jobs.write_swap(committed(swap), version)  # ... and the coordinator dies
    resumed = spawn.worker("aligner.coordinator", "hotswap", "--old", old.job, "--new", new.job, "--subject", target,
                           "--json", env=cli_env)
    assert resumed.wait(LIVE) == 0, resumed.stderr
    done = swapper.jobs.swap(old.job)[0]
    assert done is not None and done.phase == "done" and done.epoch == swap.epoch
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "v2 output after the swap")
    finish(more, gen, v1, v2)
    _verify(ledger, stack, target, gen, swap.epoch)


def test_a_new_version_started_before_the_old_is_aligned_waits_to_join(stack, ledger, subject_name, spawn):
    """v2 starts while v1 runs unaligned: it does not join the target (its producers would be writers of
    epochs it can never follow, holding the target for every reader) until v1 is aligned; v1's output moves
    on meanwhile, and once aligned, v2 follows and the swap commits exactly once."""
    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 4)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=5000, pace=0.04, until=more)
    old = JobSpec(job=f"{raw}-v1", inputs=(raw,), output=target, interval=0.2, output_partitions=(0, 1))
    new = JobSpec(job=f"{raw}-v2", inputs=(raw,), output=target, interval=0.2, output_partitions=(2, 3),
                  version="2", follows=old.job)
    v1 = spawn.job(old, tag_v1)
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= 3, LIVE, "v1's unaligned epochs")
    swapper = HotSwap(ledger)
    v2 = spawn.job(new, tag_v2)
    wait_for(lambda: new.job in swapper.jobs.job_names(), LIVE, "v2 registered")
    joined = (ledger.epochs.frontier(target) or 0) + 5
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= joined, LIVE, "v1's output moving on while v2 waits")
    writers = ledger.subjects.writers(target)[0].writers
    assert not any(w.startswith(f"{new.job}:") for w in writers), "v2 joined unaligned"
    Coordinator(ledger).align(old.job, timeout=LIVE)
    following(swapper, new)
    swap = swapper.run(old.job, new.job, target, timeout=LIVE)
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 3, LIVE, "v2 output after the swap")
    finish(more, gen, v1, v2)
    _verify(ledger, stack, target, gen, swap.epoch)


def test_new_version_takes_the_old_versions_partitions_over(stack, ledger, subject_name, spawn, cli_env):
    """Partition hand-over: neither version declares output partitions. v2 follows with its output voided,
    a writer of no partition, and from S+1 writes the partitions v1 wrote up to S, starting where v1's
    ranges ended: the target keeps its two partitions, every input's result lands exactly once (v1's up
    to S, v2's after), and the writers document says who wrote which partition over which epochs."""
    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, 2)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=5000, pace=0.04, until=more)
    old = JobSpec(job=f"{raw}-v1", inputs=(raw,), output=target, interval=0.2, parallelism=2)
    new = JobSpec(job=f"{raw}-v2", inputs=(raw,), output=target, interval=0.2, parallelism=2, version="2",
                  follows=old.job)
    v1 = [spawn.job(old, tag_v1, w) for w in range(2)]
    Coordinator(ledger).align(old.job, timeout=LIVE)
    v2 = [spawn.job(new, tag_v2, w) for w in range(2)]
    swapper = HotSwap(ledger)

    def following() -> dict:
        return {w: e for w, e in ledger.subjects.writers(target)[0].writers.items() if w.startswith(f"{new.job}:")}

    wait_for(lambda: len(following()) == 2, LIVE, "both v2 workers following")  # writers of no partition
    assert not any(e.partitions for e in following().values())
    swap = swapper.run(old.job, new.job, target, timeout=LIVE)
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) >= swap.epoch + 5, LIVE, "v2 output after the swap")
    more.set()
    gen.finished()
    for thread in (*v1, *v2):
        thread.join()
    _verify(ledger, stack, target, gen, swap.epoch)
    doc, _ = ledger.subjects.writers(target)
    for p in (0, 1):
        assert doc.owner_of(p, swap.epoch) == f"{old.job}:{p}" and doc.owner_of(p, swap.epoch + 1) == f"{new.job}:{p}"
        before, after = ledger.epochs.committed(target, swap.epoch), ledger.epochs.committed(target, swap.epoch + 1)
        # the new version's first range starts where the old one's last ended, or just past the old version's
        # commit marker there (a dense epoch starts at its first record)
        assert before.slices[p].end <= after.slices[p].start <= before.slices[p].end + 1
    assert ledger.subjects.subject(target).partitions == 2
    status = json.loads(run_cli(cli_env, "status", "--json").stdout)
    (row,) = [r for r in status["subjects"] if r["subject"] == target]
    last = max(e.finished_after or 0 for w, e in doc.writers.items() if w.startswith(f"{new.job}:"))  # input done
    assert row["owners"] == [{"sink": old.job, "partitions": [0, 1], "from_epoch": 0, "to_epoch": swap.epoch},
                             {"sink": new.job, "partitions": [0, 1], "from_epoch": swap.epoch + 1, "to_epoch": last}]
    table = run_cli({**cli_env, "COLUMNS": "400"}, "status").stdout
    assert f"{new.job}: 0,1 epochs {swap.epoch + 1}-{last}; {old.job}: 0,1 epochs 0-{swap.epoch}" in table, table


def test_swaps_rescale_keyed_state_and_keep_per_key_order(stack, ledger, subject_name, spawn):
    """Rescale on a hot-swap, with state: v1 (2 workers) -> v2 (1 worker) -> v3 (2 workers), each taking the
    target's partitions over and inheriting the keyed state across the change of parallelism (every old
    changelog partition read exactly up to the hand-over, each worker keeping the keys it reads). Under
    continuous keyed input: every result exactly once from the version that owned its epoch, each key in
    one partition throughout, its running count 1, 2, 3, ... across all three versions in offset order:
    the state after the last swap is the state of a run without swaps."""
    raw, target = subject_name, f"{subject_name}-t"
    create_subject(ledger, stack.kafka, raw, 4)
    create_subject(ledger, stack.kafka, target, 4)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=5000, pace=0.04, until=more, keys=12)
    versions = [JobSpec(job=f"{raw}-v1", inputs=(raw,), output=target, interval=0.2, parallelism=2)]
    for v, workers in ((2, 1), (3, 2)):
        versions.append(JobSpec(job=f"{raw}-v{v}", inputs=(raw,), output=target, interval=0.2, parallelism=workers,
                                version=str(v), follows=versions[-1].job, inherit_state=True))
    threads = [spawn.job(versions[0], count_key(1), w) for w in range(2)]
    Coordinator(ledger).align(versions[0].job, timeout=LIVE)
    swapper = HotSwap(ledger)
    swaps = []
    for v, (old, new) in enumerate(itertools.pairwise(versions), start=2):
        threads += [spawn.job(new, count_key(v), w) for w in range(new.parallelism)]
        following(swapper, new, f"v{v} following")
        swap = swapper.run(old.job, new.job, target, timeout=LIVE)

        def swapped(s: int = swap.epoch) -> bool:
            return (ledger.epochs.frontier(target) or 0) >= s + 3

        wait_for(swapped, LIVE, f"v{v} output after the swap")
        swaps.append(swap.epoch)
    more.set()
    gen.finished()
    for thread in threads:
        thread.join()
    with EpochReader(ledger, stack.kafka) as reader:
        records = list(reader.read(target, 0, ledger.epochs.frontier(target)))
    outputs = [(r.epoch, json_value(r.value)) for r in records]
    assert_exactly_once(outputs, gen.sent)
    _assert_keys_run_on(records, outputs, swaps, keys=12)
    assert ledger.subjects.subject(target).partitions == 4
    jobs = swapper.jobs
    for new in versions[1:]:
        first = min(jobs.worker_epoch_numbers(new.job, 0))
        assert jobs.worker_epoch(new.job, 0, first).state_from == f"{new.follows}@{first - 1}"


def _assert_keys_run_on(records: list[Any], outputs: list[tuple[int, Any]], swaps: list[int], keys: int) -> None:
    """Each result from the version that owned its epoch, each key in one partition throughout, and its running
    count 1, 2, 3, ... across every version in offset order."""
    counts: dict[str, list[int]] = {}
    partition_of: dict[str, set[int]] = {}
    for r, (epoch, value) in zip(records, outputs, strict=True):
        assert value["v"] == 1 + sum(epoch > s for s in swaps), f"epoch {epoch}: a v{value['v']} result"
        counts.setdefault(value["k"], []).append(value["count"])
        partition_of.setdefault(value["k"], set()).add(r.partition)
    assert len(counts) == keys and all(len(p) == 1 for p in partition_of.values()), partition_of
    for key, seq in counts.items():
        assert seq == list(range(1, len(seq) + 1)), f"key {key}: counts {seq[:50]} do not run on across the swaps"
