"""Aligned sources, the coordinator and lineage on the embedded stack."""

from __future__ import annotations

import itertools
import threading

import pytest

from aligner.alignment import Command, State
from aligner.errors import AlignerError
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from connectors.runtime import JobSpec
from connectors.subjects import create_subject
from coordinator.alignment import Coordinator, leadership
from coordinator.lineage import flatten, job_epoch_lineage
from coordinator.stack import wait_for
from tests.jobs import tag_v1
from tests.streams import Generator, JobThread, assert_exactly_once, read_all


def _subjects(ledger, stack, *names, partitions=2):
    for n in names:
        create_subject(ledger, stack.kafka, n, partitions)


def _aligned_epochs(jobs: JobLedger, job: str) -> dict[int, int]:
    """subject epoch -> job epoch, for single-subject aligned job epochs."""
    out = {}
    for e in jobs.job_epoch_numbers(job):
        node = jobs.job_epoch(job, e)
        for span in node.covered.values():
            if span is None:
                continue  # the drained end of a finished subject
            assert span.first == span.last
            out[span.first] = e
    return out


def test_two_independent_jobs_align_on_identical_epochs(stack, root, ledger, subject_name):
    raw, x1, x2 = subject_name, f"{subject_name}-x1", f"{subject_name}-x2"
    _subjects(ledger, stack, raw, x1, x2)
    aligned = threading.Event()
    gen = Generator(stack, root, raw, epochs=90, pace=0.04, hold=aligned).start()
    a = JobThread(stack, root, JobSpec(job=f"{raw}-a", inputs=(raw,), output=x1, interval=0.15), tag_v1)
    wait_for(lambda: (ledger.frontier(raw) or 0) >= 5, 30, "upstream epochs before the second job starts")
    b = JobThread(stack, root, JobSpec(job=f"{raw}-b", inputs=(raw,), output=x2, interval=0.35), tag_v1)
    coord = Coordinator(ledger)
    coord.align(f"{raw}-a", timeout=60)
    coord.align(f"{raw}-b", timeout=60)
    aligned.set()
    gen.done.wait(60)
    assert not gen.error
    a.join(60)
    b.join(60)

    jobs = JobLedger(ledger)
    map_a, map_b = _aligned_epochs(jobs, f"{raw}-a"), _aligned_epochs(jobs, f"{raw}-b")
    common = sorted(set(map_a) & set(map_b))
    assert len(common) >= 20, f"only {len(common)} subject epochs covered by both aligned jobs"
    assert common == list(range(common[0], common[-1] + 1))
    for s in common:
        wa = jobs.worker_epoch(f"{raw}-a", 0, map_a[s])
        wb = jobs.worker_epoch(f"{raw}-b", 0, map_b[s])
        assert wa.offsets == wb.offsets, f"subject epoch {s}: offsets differ"
        assert wa.offsets[raw] == {p: e for p, (_s, e) in ledger.committed(raw, s).offsets.items()}
    for out in (x1, x2):
        assert_exactly_once(read_all(ledger, stack.kafka, out), gen.sent)


def test_chain_lineage_reads_a_consistent_cut(stack, root, ledger, subject_name):
    raw, x, y = subject_name, f"{subject_name}-x", f"{subject_name}-y"
    _subjects(ledger, stack, raw, x, y)
    aligned = threading.Event()
    gen = Generator(stack, root, raw, epochs=60, pace=0.04, hold=aligned).start()
    a = JobThread(stack, root, JobSpec(job=f"{raw}-A", inputs=(raw,), output=x, interval=0.2), tag_v1)
    b = JobThread(stack, root, JobSpec(job=f"{raw}-B", inputs=(x,), output=y, interval=0.3), tag_v1)
    coord = Coordinator(ledger)
    coord.align(f"{raw}-A", timeout=60)
    coord.align(f"{raw}-B", timeout=60)
    aligned.set()
    gen.done.wait(60)
    a.join(90)
    b.join(90)

    jobs = JobLedger(ledger)
    outputs = read_all(ledger, stack.kafka, y)
    assert_exactly_once([(e, v["in"]) for e, v in outputs], gen.sent)
    aligned_b = jobs.job_epoch_numbers(f"{raw}-B")
    checked = 0
    for epoch in aligned_b:
        tree = job_epoch_lineage(ledger, f"{raw}-B", epoch)
        cut = flatten(tree)
        x_epochs = cut.get(x, [])
        a_epochs = [n for n in x_epochs if jobs.job_epoch(f"{raw}-A", n) is not None]
        if not x_epochs or a_epochs != x_epochs:
            continue  # B covered an X epoch written before A was aligned: lineage stops at offsets
        records = [v for e, v in outputs if e == epoch]
        assert all(v["src"][0] == x and v["src"][3] in x_epochs for v in records)
        raw_cut = cut.get(raw, [])  # empty for the drained end of a finished input
        assert all(v["in"]["src"][0] == raw and v["in"]["src"][3] in raw_cut for v in records)
        raw_records = sum(1 for e, _ in read_all_epochs(ledger, stack.kafka, raw, raw_cut))
        assert raw_records == len(records), f"B epoch {epoch}: cut holds {raw_records} raw records"
        checked += 1
    assert checked >= 10, f"only {checked} fully aligned B epochs"


def read_all_epochs(ledger, bootstrap, subject, epochs):
    from connectors.reader import EpochReader

    with EpochReader(ledger, bootstrap) as reader:
        for e in epochs:
            yield from ((r.epoch, r.value) for r in reader.read(subject, e))


def test_abort_in_every_state_loses_and_duplicates_nothing(stack, root, ledger, subject_name):
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    job = f"{raw}-j"
    walked = threading.Event()
    gen = Generator(stack, root, raw, epochs=40, pace=0.04, hold=walked).start()
    t = JobThread(stack, root, JobSpec(job=job, inputs=(raw,), output=x, interval=0.15), tag_v1)
    jobs, coord = JobLedger(ledger), Coordinator(ledger)

    def state() -> State:
        return jobs.source_state(job, raw).state

    def command(kind: str, **kw) -> None:
        cmd, version = jobs.command(job, raw)
        jobs.send(job, raw, Command(seq=cmd.seq + 1, kind=kind, **kw), version)

    wait_for(lambda: jobs.consumers(job, raw), 30, "the consumer to report")
    seen = []
    command("catch_up")
    wait_for(lambda: state() in (State.CATCHING_UP, State.READY), 30, "catching up")
    seen.append(state())
    coord.abort(job, timeout=30)
    assert state() is State.UNALIGNED
    command("catch_up")
    wait_for(lambda: state() is State.READY, 30, "ready")
    coord.abort(job, timeout=30)
    assert state() is State.UNALIGNED
    command("catch_up")
    wait_for(lambda: state() is State.READY, 30, "ready again")
    command("align", subject_epoch=10**6, job_epoch=10**6)  # a far future point: stays Aligning
    wait_for(lambda: state() is State.ALIGNING, 30, "aligning")
    coord.abort(job, timeout=30)
    assert state() is State.UNALIGNED
    coord.align(job, timeout=60)
    assert state() is State.ALIGNED
    coord.abort(job, timeout=30)
    assert state() is State.UNALIGNED
    walked.set()
    gen.done.wait(60)
    t.join(90)
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)


def test_leader_election_admits_one_coordinator(stack, root, ledger):
    other = Ledger.connect(stack.zk, root)
    try:
        with leadership(ledger, timeout=5), pytest.raises(AlignerError, match="another coordinator"), \
                leadership(other, timeout=0.5):
            pass
        with leadership(other, timeout=5):
            pass
    finally:
        other.close()


def test_variable_interval_spans_k_subject_epochs(stack, root, ledger, subject_name):
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    job = f"{raw}-k3"
    aligned = threading.Event()
    gen = Generator(stack, root, raw, epochs=80, pace=0.03, hold=aligned).start()
    t = JobThread(stack, root, JobSpec(job=job, inputs=(raw,), output=x, interval=0.2, epochs_per_checkpoint=3),
                  tag_v1)
    Coordinator(ledger).align(job, timeout=60)
    aligned.set()
    gen.done.wait(60)
    t.join(90)
    jobs = JobLedger(ledger)
    spans = [jobs.job_epoch(job, e).covered[raw] for e in jobs.job_epoch_numbers(job)]
    full = [s for s in spans[:-1] if s is not None]
    assert len(full) >= 5 and all(s.last - s.first + 1 == 3 for s in full)
    assert all(b.first == a.last + 1 for a, b in itertools.pairwise(full))
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)


def test_multi_subject_job_aligns_on_an_epoch_vector(stack, root, ledger, subject_name):
    left, right, x = f"{subject_name}-l", f"{subject_name}-r", f"{subject_name}-x"
    _subjects(ledger, stack, left, right, x)
    job = f"{subject_name}-m"
    aligned = threading.Event()
    gl = Generator(stack, root, left, epochs=60, pace=0.03, hold=aligned).start()
    gr = Generator(stack, root, right, epochs=25, pace=0.09, hold=aligned).start()
    t = JobThread(stack, root, JobSpec(job=job, inputs=(left, right), output=x, interval=0.2), tag_v1)
    decision = Coordinator(ledger).align(job, timeout=60)
    assert set(decision.subject_epochs) == {left, right}
    aligned.set()
    gl.done.wait(60)
    gr.done.wait(60)
    t.join(90)
    jobs = JobLedger(ledger)
    vectors = [jobs.job_epoch(job, e) for e in jobs.job_epoch_numbers(job)]
    assert len(vectors) >= 10
    nxt = dict(vectors[0].next)
    for node in vectors[1:]:
        for s in (left, right):
            span = node.covered[s]
            if span is not None:
                assert span.first == nxt[s], "epoch vectors must tile each subject without gaps"
        nxt = dict(node.next)
    assert any(v.covered[right] is None for v in vectors), "the slower subject should skip some job epochs"
    outputs = read_all(ledger, stack.kafka, x)
    assert len(outputs) == gl.sent + gr.sent
    for src in (left, right):
        nums = sorted(v["in"]["n"] for _, v in outputs if v["src"][0] == src)
        assert nums == list(range(gl.sent if src == left else gr.sent))
