"""Aligned sources, the coordinator and lineage on the embedded stack."""

from __future__ import annotations

import itertools
import threading

import pytest

from aligner.alignment import Command, State
from aligner.connectors.runtime import JobSpec, JobWorker
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator, leadership
from aligner.errors import AlignerError, AlignmentSplitError
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from aligner.lineage import flatten, job_epoch_lineage
from aligner.models import AlignmentDecision, DecisionPhase, JobEpochNode, Span, WorkerEpochNode
from tests.helpers import wait_for
from tests.jobs import tag_v1
from tests.streams import assert_exactly_once, read_all

LIVE = 180
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""


def _subjects(ledger, stack, *names, partitions=2):
    for n in names:
        create_subject(ledger, stack.kafka, n, partitions)


def _job_epoch(jobs: JobLedger, job: str, epoch: int) -> JobEpochNode:
    """A committed job epoch's record (one listed by ``job_epoch_numbers``: present)."""
    node = jobs.job_epoch(job, epoch)
    assert node is not None, f"no record of job epoch {epoch} of {job}"
    return node


def _covered(node: WorkerEpochNode, subject: str) -> Span:
    """The subject epochs an aligned worker epoch covered of ``subject`` (present: the test aligned it)."""
    assert node.covered is not None, f"worker epoch {node.epoch} is not aligned"
    span = node.covered[subject]
    assert span is not None, f"worker epoch {node.epoch} covered nothing of {subject}"
    return span


def _aligned_epochs(jobs: JobLedger, job: str) -> dict[int, int]:
    """subject epoch -> job epoch, for single-subject aligned job epochs."""
    out = {}
    for e in jobs.job_epoch_numbers(job):
        node = _job_epoch(jobs, job, e)
        for span in node.covered.values():
            if span is None:
                continue  # the drained end of a finished subject
            assert span.first == span.last
            out[span.first] = e
    return out


def test_two_independent_jobs_align_on_identical_epochs(stack, ledger, subject_name, spawn):
    raw, x1, x2 = subject_name, f"{subject_name}-x1", f"{subject_name}-x2"
    _subjects(ledger, stack, raw, x1, x2)
    aligned = threading.Event()
    gen = spawn.generator(raw, epochs=40, pace=0.04, hold=aligned)
    a = spawn.job(JobSpec(job=f"{raw}-a", inputs=(raw,), output=x1, interval=0.15), tag_v1)
    wait_for(lambda: (ledger.epochs.frontier(raw) or 0) >= 5, LIVE, "upstream epochs before the second job starts")
    b = spawn.job(JobSpec(job=f"{raw}-b", inputs=(raw,), output=x2, interval=0.35), tag_v1)
    coord = Coordinator(ledger)
    coord.align(f"{raw}-a", timeout=LIVE)
    coord.align(f"{raw}-b", timeout=LIVE)
    aligned.set()  # 40 more upstream epochs, which both aligned jobs cover
    gen.finished()
    a.join()
    b.join()

    jobs = ledger.jobs
    map_a, map_b = _aligned_epochs(jobs, f"{raw}-a"), _aligned_epochs(jobs, f"{raw}-b")
    common = sorted(set(map_a) & set(map_b))
    assert len(common) >= 20, f"only {len(common)} subject epochs covered by both aligned jobs"
    assert common == list(range(common[0], common[-1] + 1))
    for s in common:
        wa = jobs.worker_epoch(f"{raw}-a", 0, map_a[s])
        wb = jobs.worker_epoch(f"{raw}-b", 0, map_b[s])
        assert wa.offsets == wb.offsets, f"subject epoch {s}: offsets differ"
        assert wa.offsets[raw] == {p: e for p, (_s, e) in ledger.epochs.committed(raw, s).offsets.items()}
    for out in (x1, x2):
        assert_exactly_once(read_all(ledger, stack.kafka, out), gen.sent)


def test_chain_lineage_reads_a_consistent_cut(stack, ledger, subject_name, spawn):
    raw, x, y = subject_name, f"{subject_name}-x", f"{subject_name}-y"
    _subjects(ledger, stack, raw, x, y)
    aligned = threading.Event()
    gen = spawn.generator(raw, epochs=40, pace=0.04, hold=aligned)
    a = spawn.job(JobSpec(job=f"{raw}-A", inputs=(raw,), output=x, interval=0.2), tag_v1)
    b = spawn.job(JobSpec(job=f"{raw}-B", inputs=(x,), output=y, interval=0.3), tag_v1)
    coord = Coordinator(ledger)
    coord.align(f"{raw}-A", timeout=LIVE)
    coord.align(f"{raw}-B", timeout=LIVE)
    aligned.set()  # 40 more upstream epochs through the aligned chain
    gen.finished()
    a.join()
    b.join()

    jobs = ledger.jobs
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
    from aligner.connectors.reader import EpochReader

    with EpochReader(ledger, bootstrap) as reader:
        for e in epochs:
            yield from ((r.epoch, r.value) for r in reader.read(subject, e))


def test_abort_in_every_state_loses_and_duplicates_nothing(stack, ledger, subject_name, spawn):
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    job = f"{raw}-j"
    walked = threading.Event()
    gen = spawn.generator(raw, epochs=10, pace=0.04, hold=walked)
    t = spawn.job(JobSpec(job=job, inputs=(raw,), output=x, interval=0.15), tag_v1)
    jobs, coord = ledger.jobs, Coordinator(ledger)

    def state() -> State:
        return jobs.source_state(job, raw).state

    def command(kind: str, **kw) -> None:
        cmd, version = jobs.command(job, raw)
        jobs.send(job, raw, Command(seq=cmd.seq + 1, kind=kind, **kw), version)

    wait_for(lambda: bool(jobs.consumers(job, raw)), LIVE, "the consumer to report")
    seen = []
    command("catch_up")
    wait_for(lambda: state() in (State.CATCHING_UP, State.READY), LIVE, "catching up")
    seen.append(state())
    coord.abort(job, timeout=LIVE)
    assert state() is State.UNALIGNED
    command("catch_up")
    wait_for(lambda: state() is State.READY, LIVE, "ready")
    coord.abort(job, timeout=LIVE)
    assert state() is State.UNALIGNED
    command("catch_up")
    wait_for(lambda: state() is State.READY, LIVE, "ready again")
    command("align", subject_epoch=10**6, job_epoch=10**6)  # a far future point: stays Aligning
    wait_for(lambda: state() is State.ALIGNING, LIVE, "aligning")
    coord.abort(job, timeout=LIVE)
    assert state() is State.UNALIGNED
    coord.align(job, timeout=LIVE)
    assert state() is State.ALIGNED
    coord.abort(job, timeout=LIVE)
    assert state() is State.UNALIGNED
    walked.set()
    gen.finished()
    t.join()
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


def test_variable_interval_spans_k_subject_epochs(stack, ledger, subject_name, spawn):
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    job = f"{raw}-k3"
    aligned = threading.Event()
    gen = spawn.generator(raw, epochs=30, pace=0.03, hold=aligned)
    t = spawn.job(JobSpec(job=job, inputs=(raw,), output=x, interval=0.2, epochs_per_checkpoint=3), tag_v1)
    Coordinator(ledger).align(job, timeout=LIVE)
    aligned.set()  # 30 more subject epochs: at least 9 full job epochs of 3
    gen.finished()
    t.join()
    jobs = ledger.jobs
    spans = [_job_epoch(jobs, job, e).covered[raw] for e in jobs.job_epoch_numbers(job)]
    full = [s for s in spans[:-1] if s is not None]
    assert len(full) >= 5 and all(s.last - s.first + 1 == 3 for s in full)
    assert all(b.first == a.last + 1 for a, b in itertools.pairwise(full))
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)


def test_multi_subject_job_aligns_on_an_epoch_vector(stack, ledger, subject_name, spawn):
    left, right, x = f"{subject_name}-l", f"{subject_name}-r", f"{subject_name}-x"
    _subjects(ledger, stack, left, right, x)
    job = f"{subject_name}-m"
    aligned = threading.Event()
    gl = spawn.generator(left, epochs=40, pace=0.03, hold=aligned)
    gr = spawn.generator(right, epochs=3, pace=0.09, hold=aligned)
    t = spawn.job(JobSpec(job=job, inputs=(left, right), output=x, interval=0.2), tag_v1)
    decision = Coordinator(ledger).align(job, timeout=LIVE)
    assert set(decision.subject_epochs) == {left, right}
    aligned.set()  # the right subject finishes after 3 more epochs, the left one goes on for 40
    gl.finished()
    gr.finished()
    t.join()
    jobs = ledger.jobs
    vectors = [_job_epoch(jobs, job, e) for e in jobs.job_epoch_numbers(job)]
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


def _send(jobs: JobLedger, job: str, subject: str, command: Command) -> None:
    """Write the next command to a source, as the coordinator would."""
    current, version = jobs.command(job, subject)
    jobs.send(job, subject, command.model_copy(update={"seq": current.seq + 1}), version)


def _ends(ledger: Ledger, subject: str, epoch: int, partitions: list[int]) -> dict[int, int]:
    slices = ledger.epochs.committed(subject, epoch).slices
    return {p: slices[p].end for p in partitions if p in slices}


def _step_into(worker: JobWorker, stop: threading.Event, subject: str, state: State) -> bool:
    """Run one job epoch; whether the worker's consumer of ``subject`` is now in ``state`` (a wait_for condition)."""
    worker.step(stop)
    return worker.sources.states[subject].state is state


def test_align_arriving_during_the_epoch_before_j_extends_it_to_k(stack, ledger, subject_name, spawn):
    """Align(k, J) accepted while job epoch J - 1 already runs on its timer: that epoch must still end
    exactly at the end of subject epoch k - 1 (however long that takes), or J would start short of k."""
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    spawn.generator(raw, epochs=100_000, per_epoch=5, pace=0.02)
    spec = JobSpec(job=f"{raw}-m", inputs=(raw,), output=x, interval=3.0)  # long: the Align lands within it
    jobs = ledger.jobs
    stop = threading.Event()
    worker = spawn(JobWorker(ledger, stack.kafka, spec, 0, tag_v1)).open()
    wait_for(lambda: ledger.epochs.frontier(raw) is not None, LIVE, "the input's first epoch")
    _send(jobs, spec.job, raw, Command(kind="catch_up"))
    wait_for(lambda: worker.step(stop) and worker.sources.states[raw].state is State.READY, LIVE, "Ready")
    before_j = worker.io.sink.next_epoch
    seen = worker.records_in
    done = threading.Event()

    def step_then_done() -> None:
        worker.step(stop)
        done.set()

    stepping = threading.Thread(target=step_then_done, daemon=True)
    stepping.start()
    try:
        wait_for(lambda: worker.records_in > seen, LIVE, "epoch J - 1 to be under way")
        k = (ledger.epochs.frontier(raw) or 0) + 60  # further than one 3 s timer's worth of input epochs (0.1 s each)
        _send(jobs, spec.job, raw, Command(kind="align", subject_epoch=k, job_epoch=before_j + 1))
        wait_for(done.is_set, LIVE, "epoch J - 1 to end")
    finally:
        stop.set()
        stepping.join(30)
    stop.clear()
    assert worker.sources.states[raw].state is State.ALIGNING, "the Align was not taken during J - 1"
    node = jobs.worker_epoch(spec.job, 0, before_j)
    assert node.offsets[raw] == _ends(ledger, raw, k - 1, [0, 1]), f"epoch {before_j} did not end at k - 1 = {k - 1}"
    worker.step(stop)
    assert _covered(jobs.worker_epoch(spec.job, 0, before_j + 1), raw).first == k


def test_worker_restarted_while_aligning_ends_its_first_aligned_epoch_on_k(stack, ledger, subject_name, spawn):
    """A consumer that accepted Align(k, J) and restarts before J must still load nothing past k - 1
    (the limit belongs to the Aligning state, not to the command's arrival), or job epoch J would start
    past subject epoch k and its record would name offsets k never ended at."""
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    spawn.generator(raw, epochs=100_000, per_epoch=5, pace=0.02)  # epochs commit faster than job epochs
    spec = JobSpec(job=f"{raw}-r", inputs=(raw,), output=x, interval=0.3)
    jobs = ledger.jobs
    stop = threading.Event()
    worker = spawn(JobWorker(ledger, stack.kafka, spec, 0, tag_v1)).open()
    wait_for(lambda: ledger.epochs.frontier(raw) is not None, LIVE, "the input's first epoch")

    def send(command: Command) -> None:
        _send(jobs, spec.job, raw, command)

    send(Command(kind="catch_up"))
    wait_for(lambda: _step_into(worker, stop, raw, State.READY), LIVE, "the consumer to be Ready")
    k, j = (ledger.epochs.frontier(raw) or 0) + 3, worker.io.sink.next_epoch + 6
    send(Command(kind="align", subject_epoch=k, job_epoch=j))
    wait_for(lambda: _step_into(worker, stop, raw, State.ALIGNING), LIVE, "the consumer to accept Align")

    worker.close()  # a restart: the accepted Align comes back from the committed job epoch
    worker = spawn(JobWorker(ledger, stack.kafka, spec, 0, tag_v1)).open()
    assert worker.sources.states[raw].state is State.ALIGNING
    wait_for(lambda: _step_into(worker, stop, raw, State.ALIGNED) and worker.io.sink.lease.node.committed_epoch >= j,
             LIVE, "job epoch J to commit")

    node = jobs.worker_epoch(spec.job, 0, j)
    assert node.covered is not None
    span = node.covered[raw]
    assert span is not None and span.first == k
    assert node.offsets[raw] == _ends(ledger, raw, span.last, [0, 1]), f"job epoch {j} covers {span.first}..{span.last}"


AHEAD = 20
"""How far in the input's future a test's hand-sent Align puts k (the generator commits ~10 epochs/s)."""


def test_split_alignment_is_aborted_and_aligned_again(stack, ledger, subject_name, spawn):
    """One consumer started J under an Align the other rejected as late, and the other took a later
    Align: the job is split. ``Coordinator.align`` aborts (nothing lost) and aligns it again."""
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    enough = threading.Event()
    gen = spawn.generator(raw, epochs=100_000, per_epoch=5, pace=0.02, until=enough)
    spec = JobSpec(job=f"{raw}-s", inputs=(raw,), output=x, parallelism=2, interval=0.3)
    jobs = ledger.jobs
    stop = threading.Event()
    w0, w1 = (spawn(JobWorker(ledger, stack.kafka, spec, i, tag_v1)).open() for i in range(2))
    wait_for(lambda: ledger.epochs.frontier(raw) is not None, LIVE, "the input's first epoch")

    def state(w: JobWorker) -> State:
        return w.sources.states[raw].state

    _send(jobs, spec.job, raw, Command(kind="catch_up"))
    wait_for(lambda: (w0.step(stop), w1.step(stop)) and state(w0) is state(w1) is State.READY, LIVE, "Ready")
    for _ in range(3):
        w1.step(stop)  # w1 runs ahead: it will have started J when the Align comes
    j = w0.io.sink.next_epoch + 1
    # k well in the future (AHEAD input epochs, ~2 s of input): w0 takes the Align whenever its watch
    # delivers it within that time, rather than racing the generator to k (w1 rejects it for J alone).
    _send(jobs, spec.job, raw, Command(kind="align", subject_epoch=(ledger.epochs.frontier(raw) or 0) + AHEAD,
                                       job_epoch=j))
    wait_for(lambda: (w0.step(stop), w1.step(stop)) and state(w0) is State.ALIGNED, LIVE, "w0 to start J")
    assert state(w1) is State.READY  # rejected: too late
    later = max(w0.io.sink.next_epoch, w1.io.sink.next_epoch) + 3
    _send(jobs, spec.job, raw, Command(kind="align", subject_epoch=(ledger.epochs.frontier(raw) or 0) + AHEAD,
                                       job_epoch=later))
    wait_for(lambda: w1.step(stop) and state(w1) is State.ALIGNING, LIVE, "w1 to take the later Align")
    with pytest.raises(AlignmentSplitError):
        jobs.source_state(spec.job, raw)
    # The repairing coordinator died right after it recorded its abort (chaos seed 1907): the next `align`
    # finishes that abort and aligns, where it used to refuse ("being aborted; run `aligner abort`").
    _, version = jobs.decision(spec.job)
    jobs.decide(AlignmentDecision(job=spec.job, subjects=(raw,), phase=DecisionPhase.ABORTING,
                                  seq=jobs.command(spec.job, raw)[0].seq + 1, realign=True), version)

    result: list[object] = []
    coordinator = threading.Thread(target=lambda: result.append(Coordinator(ledger).align(spec.job, timeout=LIVE)),
                                   daemon=True)
    coordinator.start()
    try:
        wait_for(lambda: (w0.step(stop), w1.step(stop)) and not coordinator.is_alive(), LIVE, "the repair")
    finally:
        stop.set()
        coordinator.join(30)
    assert result and jobs.source_state(spec.job, raw).state is State.ALIGNED
    assert w0.sources.states[raw] == w1.sources.states[raw]
    stop.clear()
    enough.set()
    gen.finished()
    running = {0: w0, 1: w1}

    def drained() -> bool:
        for i, w in list(running.items()):
            if not w.step(stop):
                del running[i]
        return not running

    wait_for(drained, LIVE, "both workers to drain")
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)  # across the split and the repair


def test_sources_aligned_at_different_job_epochs_are_aborted_and_aligned_again(stack, ledger, subject_name, spawn):
    """One worker, two subjects: the left source started J under an Align the right one rejected (J had
    begun when it arrived), and the right one took a later Align and started it too. The worker runs on
    unaligned (it used to die: the later J had no previous record), and ``Coordinator.align``, which used
    to choose again forever (the left source rejects every new Align), aborts and aligns again."""
    left, right, x = f"{subject_name}-l", f"{subject_name}-r", f"{subject_name}-x"
    _subjects(ledger, stack, left, right, x)
    enough = threading.Event()
    gens = [spawn.generator(s, epochs=100_000, per_epoch=5, pace=0.02, until=enough) for s in (left, right)]
    spec = JobSpec(job=f"{subject_name}-v", inputs=(left, right), output=x, interval=0.3)
    jobs = ledger.jobs
    stop = threading.Event()
    w = spawn(JobWorker(ledger, stack.kafka, spec, 0, tag_v1)).open()
    wait_for(lambda: ledger.epochs.frontier(left) is not None and ledger.epochs.frontier(right) is not None, LIVE,
             "input")

    def state(s: str) -> State:
        return w.sources.states[s].state

    for s in (left, right):
        _send(jobs, spec.job, s, Command(kind="catch_up"))
    wait_for(lambda: w.step(stop) and state(left) is state(right) is State.READY, LIVE, "Ready")
    j = w.io.sink.next_epoch + 1
    _send(jobs, spec.job, left, Command(kind="align", subject_epoch=(ledger.epochs.frontier(left) or 0) + AHEAD,
                                        job_epoch=j))
    _send(jobs, spec.job, right, Command(kind="align", subject_epoch=0, job_epoch=j))  # k already read: rejected
    wait_for(lambda: w.step(stop) and state(left) is State.ALIGNED, LIVE, "the left source to start J")
    assert state(right) is State.READY
    later = w.io.sink.next_epoch + 2
    k = (ledger.epochs.frontier(right) or 0) + AHEAD
    _send(jobs, spec.job, right, Command(kind="align", subject_epoch=k, job_epoch=later))
    wait_for(lambda: w.step(stop) and state(right) is State.ALIGNED, LIVE, "the right source to start its J")
    for _ in range(3):
        assert w.step(stop) and not w.sources.aligned  # split: unaligned epochs, no error
    # As the coordinator left it: its last choice, which the right source took and the left one rejects.
    _, version = jobs.decision(spec.job)
    jobs.decide(AlignmentDecision(job=spec.job, subjects=(left, right), phase=DecisionPhase.ALIGNING,
                                  seq=jobs.command(spec.job, right)[0].seq, job_epoch=later,
                                  subject_epochs={left: (ledger.epochs.frontier(left) or 0) + AHEAD,
                                                  right: k}), version)

    result: list[AlignmentDecision] = []
    coordinator = threading.Thread(target=lambda: result.append(Coordinator(ledger).align(spec.job, timeout=LIVE)),
                                   daemon=True)
    coordinator.start()
    try:
        wait_for(lambda: w.step(stop) and not coordinator.is_alive(), LIVE, "the repair")
    finally:
        stop.set()
        coordinator.join(30)
    assert result and w.sources.aligned and jobs.source_state(spec.job, left).job_epoch == result[0].job_epoch
    stop.clear()
    enough.set()
    for g in gens:
        g.finished()
    wait_for(lambda: not w.step(stop), LIVE, "the worker to drain")
    outputs = read_all(ledger, stack.kafka, x)
    for g in gens:  # each subject's records once, across the split, the abort and the new alignment
        assert sorted(v["in"]["n"] for _, v in outputs if v["src"][0] == g.subject) == list(range(g.sent))
    assert len(outputs) == sum(g.sent for g in gens)


def test_align_a_job_aligned_by_construction_records_it_and_returns(stack, ledger, subject_name, cli_env):
    """A Spark query's sources report Aligned from its first batch (epoch-vector offsets): `aligner align`
    sends it no command it would ignore and waits for nothing; it records where its first job epoch
    starts."""
    from aligner.connectors.spark.job import register_query, report
    from tests.conftest import run_cli

    raw, out = subject_name, f"{subject_name}-out"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, out, 2)
    node = register_query(ledger, f"{raw}-q", [raw], out)
    jobs = ledger.jobs
    jobs.fix_job_epoch(node.job, 4, {raw: None}, {raw: 9})  # its first batch: nothing new, stands at epoch 9
    report(ledger, node, job_epoch=4)
    done = run_cli(cli_env, "align", node.job, "--json")
    assert done.returncode == 0, done.stderr
    decision, _ = jobs.decision(node.job)
    assert decision is not None and decision.phase == "aligned"
    assert decision.job_epoch == 4 and decision.subject_epochs == {raw: 9}
    assert jobs.command(node.job, raw)[0].seq == 0, "no command was sent"


def test_a_query_batch_reading_one_of_two_subjects_keeps_the_others_position(stack, ledger, subject_name):
    """A Spark job's micro-batch that read nothing new of one input reports no change there: the
    consumer node keeps the epoch it stood at (status and waits on it must not see it fall back)."""
    from aligner.connectors.spark.job import register_query, report

    a, b, out = subject_name, f"{subject_name}-b", f"{subject_name}-out"
    for name in (a, b, out):
        create_subject(ledger, stack.kafka, name, 1)
    node = register_query(ledger, f"{a}-q", [a, b], out)
    report(ledger, node, job_epoch=1, subject_epoch={a: 5, b: 7})
    report(ledger, node, job_epoch=2, subject_epoch={a: 6})
    jobs = ledger.jobs
    assert jobs.consumers(node.job, a)[0].subject_epoch == 6
    assert jobs.consumers(node.job, b)[0].subject_epoch == 7
    assert jobs.consumers(node.job, b)[0].job_epoch == 2


def test_a_coverage_record_that_differs_from_the_workers_own_aborts_the_epoch_and_is_followed(
        stack, ledger, subject_name, spawn):
    """A worker of a one-subject job reads an aligned job epoch on its own coverage while the record of it
    travels to ZooKeeper (no other worker can decide differently). If another record stands after all (here
    made by hand: one subject epoch where the worker covers two), the epoch is aborted before its Kafka
    commit and read again on the record that stands: the committed epoch matches it, nothing is lost or
    duplicated."""
    raw, x = subject_name, f"{subject_name}-x"
    _subjects(ledger, stack, raw, x)
    aligned = threading.Event()
    gen = spawn.generator(raw, epochs=20, per_epoch=5, pace=0.02, hold=aligned)
    spec = JobSpec(job=f"{raw}-c", inputs=(raw,), output=x, interval=0.3, epochs_per_checkpoint=2)
    jobs = ledger.jobs
    stop = threading.Event()
    worker = spawn(JobWorker(ledger, stack.kafka, spec, 0, tag_v1)).open()
    wait_for(lambda: ledger.epochs.frontier(raw) is not None, LIVE, "the input's first epoch")

    _send(jobs, spec.job, raw, Command(kind="catch_up"))
    wait_for(lambda: _step_into(worker, stop, raw, State.READY), LIVE, "the consumer to be Ready")
    _send(jobs, spec.job, raw, Command(kind="align", subject_epoch=(ledger.epochs.frontier(raw) or 0) + 3,
                                       job_epoch=worker.io.sink.next_epoch + 2))
    wait_for(lambda: _step_into(worker, stop, raw, State.ALIGNED), LIVE, "the consumer to be Aligned")
    aligned.set()
    e = worker.io.sink.next_epoch
    start = _job_epoch(jobs, spec.job, e - 1).next[raw]
    wait_for(lambda: (ledger.epochs.frontier(raw) or 0) >= start + 1, LIVE, "both subject epochs of the next job epoch")
    jobs.fix_job_epoch(spec.job, e, {raw: Span(first=start, last=start)}, {raw: start + 1})

    attempt = worker.io.sink.attempt
    gen.finished()
    worker.run(stop)  # the contested attempt is aborted and retried inside run, as a broker failure would be
    assert worker.io.sink.attempt > attempt, "the epoch was not aborted"
    node = jobs.worker_epoch(spec.job, 0, e)
    assert node.covered == {raw: Span(first=start, last=start)}
    assert node.offsets[raw] == _ends(ledger, raw, start, [0, 1])
    assert _covered(jobs.worker_epoch(spec.job, 0, e + 1), raw).first == start + 1
    assert_exactly_once(read_all(ledger, stack.kafka, x), gen.sent)
