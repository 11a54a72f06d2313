"""The pure protocol machines: command receipt, epoch coverage and the hot-swap gate (no I/O)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner import coverage, decision, swap
from aligner.alignment import Command, ConsumerAlignment, Receipt, State, aggregate, aligned_together
from aligner.errors import AlignerError, AlignmentSplitError, IllegalTransition
from aligner.models import AlignmentDecision, DecisionPhase, Span, SwapNode

CATCH_UP = Command(seq=1, kind="catch_up")


def ready() -> ConsumerAlignment:
    return ConsumerAlignment().apply(CATCH_UP).caught_up(ahead=True)


# ---- command receipt ---------------------------------------------------------------------------

def test_align_is_applied_when_ready_and_in_time():
    new, receipt = ready().receive(Command(seq=2, kind="align", subject_epoch=10, job_epoch=7), 5, 9, False)
    assert receipt is Receipt.APPLIED and new.state is State.ALIGNING and new.load_limit == 9


@pytest.mark.parametrize(("open_epoch", "next_load"), [(7, 9), (8, 9), (5, 11), (5, 10 + 1)])
def test_align_is_rejected_once_j_started_or_k_loaded(open_epoch, next_load):
    new, receipt = ready().receive(Command(seq=2, kind="align", subject_epoch=10, job_epoch=7),
                                   open_epoch, next_load, True)
    assert receipt is Receipt.REJECTED and new.state is State.READY and new.applied_seq == 2


def test_a_later_align_replaces_one_whose_j_has_not_started():
    """The coordinator chose again because another consumer rejected (k, J): a consumer that took the
    first must take the new one too, or every new choice would be rejected forever."""
    first, _ = ready().receive(Command(seq=2, kind="align", subject_epoch=54, job_epoch=63), 60, 50, False)
    again, receipt = first.receive(Command(seq=3, kind="align", subject_epoch=63, job_epoch=66), 61, 54, False)
    assert receipt is Receipt.APPLIED and (again.subject_epoch, again.job_epoch, again.load_limit) == (63, 66, 62)
    started = first.started(63)
    late, receipt = started.receive(Command(seq=3, kind="align", subject_epoch=70, job_epoch=70), 63, 60, False)
    assert receipt is Receipt.REJECTED and (late.subject_epoch, late.job_epoch) == (54, 63)


def test_a_split_alignment_is_its_own_error():
    a = ConsumerAlignment(state=State.ALIGNED, subject_epoch=54, job_epoch=63)
    b = ConsumerAlignment(state=State.ALIGNING, subject_epoch=63, job_epoch=66)
    with pytest.raises(AlignmentSplitError, match="disagree"):
        aggregate([a, b])


def test_align_when_not_ready_is_rejected():
    new, receipt = ConsumerAlignment().receive(Command(seq=1, kind="align", subject_epoch=10, job_epoch=7), 1, 0,
                                               True)
    assert receipt is Receipt.REJECTED and new.state is State.UNALIGNED


def test_abort_waits_for_a_boundary():
    aligned = ready().apply(Command(seq=2, kind="align", subject_epoch=10, job_epoch=7)).started(7)
    abort = Command(seq=3, kind="abort")
    assert aligned.receive(abort, 8, 12, boundary=False) == (aligned, Receipt.DEFERRED)
    new, receipt = aligned.receive(abort, 8, 12, boundary=True)
    assert receipt is Receipt.APPLIED and new.state is State.UNALIGNED and new.load_limit is None


def test_old_and_empty_commands_are_ignored_and_misfits_rejected():
    c = ready()
    assert c.receive(CATCH_UP, 3, 3, True) == (c, Receipt.IGNORED)
    assert c.receive(Command(), 3, 3, True) == (c, Receipt.IGNORED)
    new, receipt = c.receive(Command(seq=5, kind="catch_up"), 3, 3, True)  # CatchUp while Ready
    assert receipt is Receipt.REJECTED and new.state is State.READY and new.applied_seq == 5


# ---- epoch coverage ----------------------------------------------------------------------------

def test_the_first_job_epoch_of_a_run_starts_at_k():
    aligning = {"a": ConsumerAlignment(state=State.ALIGNED, subject_epoch=10, job_epoch=7),
                "b": ConsumerAlignment(state=State.ALIGNED, subject_epoch=3, job_epoch=7)}
    assert coverage.starts(7, aligning, None) == {"a": 10, "b": 3}
    assert coverage.starts(8, aligning, {"a": 11, "b": 4}) == {"a": 11, "b": 4}
    assert coverage.starts(7, aligning, {"a": 1, "b": 1}, follows=True) == {"a": 1, "b": 1}
    with pytest.raises(AlignerError, match="no record"):
        coverage.starts(8, aligning, None)


def test_a_job_epoch_waits_for_k_epochs_of_one_subject():
    assert coverage.decide({"a": 10}, 2, {"a": 10}, {"a": None}) is None
    got = coverage.decide({"a": 10}, 2, {"a": 15}, {"a": None})
    assert got is not None and got.covered == {"a": Span(first=10, last=11)} and got.next == {"a": 12}


def test_an_epoch_vector_takes_what_the_other_subjects_have():
    got = coverage.decide({"a": 10, "b": 4}, 2, {"a": 11, "b": 4}, {"a": None, "b": None})
    assert got is not None
    assert got.covered == {"a": Span(first=10, last=11), "b": Span(first=4, last=4)}
    assert got.next == {"a": 12, "b": 5}
    quiet = coverage.decide({"a": 10, "b": 4}, 2, {"a": 11, "b": 3}, {"a": None, "b": None})
    assert quiet is not None and quiet.covered["b"] is None and quiet.next["b"] == 4


def test_finished_subjects_end_the_tiling():
    got = coverage.decide({"a": 10}, 3, {"a": 11}, {"a": 11})
    assert got is not None and got.covered == {"a": Span(first=10, last=11)}
    done = coverage.decide({"a": 12}, 3, {"a": 11}, {"a": 11})
    assert done is not None and done.covered == {"a": None} and done.next == {"a": 12}
    with pytest.raises(AlignerError):
        coverage.decide({"a": 12}, 0, {"a": 11}, {"a": None})


@settings(max_examples=200, deadline=None)
@given(per=st.integers(1, 4), k=st.lists(st.integers(0, 20), min_size=1, max_size=3),
       growth=st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=1, max_size=40),
       finish_at=st.lists(st.one_of(st.none(), st.integers(0, 60)), min_size=3, max_size=3))
def test_consecutive_job_epochs_tile_the_subject_epochs(per, k, growth, finish_at):
    """Whatever the commit order and pace: no gap, no overlap, at most ``per`` epochs each, and a
    decision only once some subject has all its epochs (or every subject finished)."""
    subjects = [f"s{i}" for i in range(len(k))]
    frontier = {s: k[i] - 1 for i, s in enumerate(subjects)}
    finished = {s: (None if finish_at[i] is None else max(finish_at[i], k[i] - 1)) for i, s in enumerate(subjects)}
    start = {s: k[i] for i, s in enumerate(subjects)}
    spans: dict[str, list[Span]] = {s: [] for s in subjects}
    for step in growth:
        for i, s in enumerate(subjects):
            cap = finished[s] if finished[s] is not None else 10**6
            frontier[s] = min(cap, frontier[s] + step[i])
        decided = coverage.decide(start, per, frontier, finished)
        if decided is None:
            continue
        for s in subjects:
            span = decided.covered[s]
            if span is not None:
                assert span.first == start[s] and span.last - span.first < per and span.last <= frontier[s]
                spans[s].append(span)
            assert decided.next[s] == (span.last + 1 if span else start[s])
        full = [s for s in subjects if (got := decided.covered[s]) is not None
                and got.last - got.first + 1 == coverage.wanted(start[s], per, finished[s])]
        assert full or all(coverage.wanted(start[s], per, finished[s]) == 0 for s in subjects)
        start = dict(decided.next)
    for i, s in enumerate(subjects):
        covered = [e for span in spans[s] for e in range(span.first, span.last + 1)]
        assert covered == list(range(k[i], k[i] + len(covered)))  # contiguous from k, no overlap


# ---- hot-swap ----------------------------------------------------------------------------------

def _swap(phase: str, epoch: int = 10) -> SwapNode:
    return SwapNode(old="a", new="b", target="t", epoch=epoch, phase=phase)


@pytest.mark.parametrize(("phase", "epoch", "old", "new"), [
    (None, 50, swap.Gate.WRITE, swap.Gate.VOID),
    ("aborted", 11, swap.Gate.WRITE, swap.Gate.VOID),
    ("precommit", 10, swap.Gate.WRITE, swap.Gate.VOID),
    ("precommit", 11, swap.Gate.WAIT, swap.Gate.WAIT),
    ("commit", 10, swap.Gate.WRITE, swap.Gate.VOID),
    ("commit", 11, swap.Gate.STOP, swap.Gate.WRITE),
    ("done", 12, swap.Gate.STOP, swap.Gate.WRITE),
])
def test_gate_per_phase_and_epoch(phase, epoch, old, new):
    node = None if phase is None else _swap(phase)
    assert swap.gate(node, epoch, new_version=False) is old
    assert swap.gate(node, epoch, new_version=True) is new


def test_the_new_version_awaits_s_at_the_target_only_at_s_plus_one():
    assert swap.awaits_target(_swap("commit"), 11, True)
    assert not swap.awaits_target(_swap("commit"), 11, False)
    assert not swap.awaits_target(_swap("commit"), 12, True)
    assert not swap.awaits_target(_swap("precommit"), 11, True)


def test_acks_in_time_late_and_waiting():
    assert swap.acks([(10, 5), (10, 11)], 10) is swap.Acks.ALL  # seen at the start of S+1 is in time
    assert swap.acks([(10, 5), (10, 12)], 10) is swap.Acks.LATE
    assert swap.acks([(10, 5), None], 10) is swap.Acks.WAITING
    assert swap.acks([(10, 5), (8, 3)], 10) is swap.Acks.WAITING  # one still acknowledges an older S
    assert swap.acks([], 10) is swap.Acks.WAITING


def test_two_phase_transitions():
    first = swap.precommit(None, "a", "b", "t", swap.choose(now=7, margin=2, at_epoch=None), 7)
    assert first.epoch - first.accepted == 2  # type: ignore[operator]
    assert (first.phase, first.epoch, first.seq) == ("precommit", 9, 1)
    again = swap.precommit(first, "a", "b", "t", swap.choose(now=12, margin=2, at_epoch=20))
    assert (again.epoch, again.seq) == (20, 2)
    done = swap.finish(swap.commit(again))
    assert done.phase == "done"
    assert swap.abort(again).phase == "aborted"
    with pytest.raises(AlignerError, match="cannot be aborted"):
        swap.abort(swap.commit(again))
    with pytest.raises(IllegalTransition):
        swap.commit(done)
    with pytest.raises(IllegalTransition):
        swap.finish(again)
    with pytest.raises(IllegalTransition):
        swap.precommit(swap.commit(again), "a", "b", "t", 30)


# ---- the coordinator's hot-swap step -----------------------------------------------------------

@pytest.mark.parametrize(("seen", "expected"), [
    (swap.Observed(None, old_aligned=False, new_follows=False), swap.Next.ALIGN),
    (swap.Observed(None, old_aligned=True, new_follows=False), swap.Next.AWAIT_FOLLOWER),
    (swap.Observed(None, old_aligned=True, new_follows=True), swap.Next.PRECOMMIT),
    (swap.Observed(_swap("aborted"), old_aligned=True, new_follows=True), swap.Next.PRECOMMIT),
    (swap.Observed(_swap("precommit"), acks=swap.Acks.WAITING), swap.Next.AWAIT_ACKS),
    (swap.Observed(_swap("precommit"), acks=swap.Acks.LATE), swap.Next.PRECOMMIT),
    (swap.Observed(_swap("precommit"), acks=swap.Acks.ALL), swap.Next.COMMIT),
    (swap.Observed(_swap("commit"), target_frontier=10), swap.Next.AWAIT_TARGET),
    (swap.Observed(_swap("commit"), target_frontier=11), swap.Next.FINISH),
    (swap.Observed(_swap("done")), swap.Next.DONE),
])
def test_the_coordinators_swap_step(seen, expected):
    assert swap.coordinate(seen) is expected
    assert swap.needs(seen.swap) <= {"old_aligned", "new_follows", "acks", "target_frontier"}


@settings(max_examples=200, deadline=None)
@given(acks=st.lists(st.sampled_from(list(swap.Acks)), min_size=1, max_size=8), frontier=st.integers(0, 30))
def test_the_coordinators_swap_loop_ends_done_once_acked(acks, frontier):
    """Observe -> step -> persist from nothing: S is pre-committed again after each late acknowledgement,
    committed once all acknowledged, finished once the target is past S."""
    node = None
    for i in range(50):
        seen = swap.Observed(node, old_aligned=True, new_follows=True,
                             acks=acks[min(i, len(acks) - 1)] if i < len(acks) else swap.Acks.ALL,
                             target_frontier=frontier + 20)
        step = swap.coordinate(seen)
        if step is swap.Next.DONE:
            break
        if step is swap.Next.PRECOMMIT:
            node = swap.precommit(node, "a", "b", "t", swap.choose(frontier, 2, None))
        elif step is swap.Next.COMMIT:
            assert node is not None, "commit before a pre-commit"
            node = swap.commit(node)
        elif step is swap.Next.FINISH:
            assert node is not None, "finish before a pre-commit"
            node = swap.finish(node)
    assert node is not None and node.phase == "done"


# ---- the coordinator's alignment step ----------------------------------------------------------

def _decision(phase: str, subjects: tuple[str, ...] = ("x",)) -> AlignmentDecision:
    return AlignmentDecision(job="j", subjects=subjects, phase=phase, seq=3)


@pytest.mark.parametrize(("seen", "expected"), [
    (decision.Observed(None, ("x",), from_start=False), decision.Next.START),
    (decision.Observed(None, ("x",), from_start=True), decision.Next.FROM_START),
    (decision.Observed(_decision("aligned"), ("x",), sources_aligned=True), decision.Next.DONE),
    (decision.Observed(_decision("aligned"), ("x",), sources_aligned=False, from_start=False), decision.Next.START),
    (decision.Observed(_decision("catching_up", ("y",)), ("x",), from_start=False), decision.Next.START),
    (decision.Observed(_decision("aborting"), ("x",)), decision.Next.BLOCKED),
    (decision.Observed(_decision("aborting").model_copy(update={"realign": True}), ("x",)),
     decision.Next.FINISH_ABORT),
    (decision.Observed(_decision("catching_up"), ("x",), ready=False), decision.Next.AWAIT_READY),
    (decision.Observed(_decision("catching_up"), ("x",), ready=True, from_start=False), decision.Next.CHOOSE),
    (decision.Observed(_decision("catching_up"), ("x",), ready=True, from_start=True), decision.Next.FROM_START),
    (decision.Observed(_decision("aligning"), ("x",)), decision.Next.AWAIT_ALIGNED),
    (decision.Observed(_decision("aligning"), ("x",), settled=decision.Settled.REJECTED), decision.Next.CHOOSE),
    (decision.Observed(_decision("aligning"), ("x",), settled=decision.Settled.ALIGNED),
     decision.Next.RECORD_ALIGNED),
    (decision.Observed(_decision("aligning"), ("x",), settled=decision.Settled.SPLIT), decision.Next.REALIGN),
])
def test_the_coordinators_alignment_step(seen, expected):
    assert decision.step(seen) is expected
    needed = decision.needs(seen.decision, seen.subjects)
    for name in ("sources_aligned", "from_start", "ready", "settled"):  # the step reads only what it needs
        if name not in needed:
            assert decision.step(replace(seen, **{name: None})) is expected


def _at(state: State, j: int | None) -> ConsumerAlignment:
    return ConsumerAlignment(state=state, applied_seq=3, subject_epoch=None if j is None else 10, job_epoch=j)


@pytest.mark.parametrize(("sources", "rejected", "expected"), [
    ([_at(State.ALIGNING, 7), _at(State.ALIGNING, 7)], False, None),
    ([_at(State.ALIGNED, 7), _at(State.ALIGNING, 7)], False, None),  # the other's worker starts J later
    ([_at(State.ALIGNED, 7), _at(State.ALIGNED, 7)], False, decision.Settled.ALIGNED),
    ([_at(State.ALIGNED, 5), _at(State.ALIGNED, 5)], True, decision.Settled.ALIGNED),  # restarted aligned
    ([_at(State.ALIGNING, 7), _at(State.READY, None)], True, decision.Settled.REJECTED),
    ([_at(State.ALIGNED, 7), _at(State.READY, None)], True, decision.Settled.SPLIT),
    ([_at(State.ALIGNED, 5), _at(State.ALIGNING, 7)], False, decision.Settled.SPLIT),  # took an older Align
    ([_at(State.ALIGNED, 5), _at(State.ALIGNED, 7)], False, decision.Settled.SPLIT),
])
def test_how_the_sources_answered_an_align(sources, rejected, expected):
    assert decision.settle(_decision("aligning").model_copy(update={"job_epoch": 7}), sources, rejected) == expected
    assert aligned_together(sources) is (expected is decision.Settled.ALIGNED)


@settings(max_examples=400, deadline=None)
@given(events=st.lists(st.sampled_from(["tick", "deliver-l", "deliver-r", "load-l", "load-r", "coordinator"]),
                       max_size=60))
def test_the_coordinator_never_chooses_again_once_a_source_started_its_run(events):
    """One worker reading two subjects; the coordinator's commands reach each source whenever they do.
    A source that started J under an older Align rejects every later one: choosing again there never
    ends (it did, under load, in CI), so the coordinator must see the split and abort instead."""
    subjects = ("l", "r")
    states = {s: ConsumerAlignment(state=State.READY, applied_seq=1) for s in subjects}
    commands = {s: Command(seq=1, kind="catch_up") for s in subjects}
    rejected = {s: 0 for s in subjects}
    loaded = {s: 0 for s in subjects}  # the next subject epoch each source loads
    open_epoch = 0
    dec = AlignmentDecision(job="j", subjects=subjects, phase=DecisionPhase.CATCHING_UP, seq=1)
    for event in events:
        kind, _, s = event.partition("-")
        if kind == "tick":
            open_epoch += 1
            states = {x: a.started(open_epoch) for x, a in states.items()}
        elif kind == "load":
            limit = states[s].load_limit
            loaded[s] += limit is None or loaded[s] <= limit
        elif kind == "deliver":
            states[s], receipt = states[s].receive(commands[s], open_epoch, loaded[s], boundary=True)
            if receipt is Receipt.REJECTED:
                rejected[s] = commands[s].seq
        else:
            settled = decision.settle(dec, list(states.values()), dec.seq in rejected.values()) \
                if dec.phase == DecisionPhase.ALIGNING else None
            step = decision.step(decision.Observed(dec, subjects, ready=True, from_start=False, settled=settled))
            if step is decision.Next.CHOOSE:
                assert not any(a.aligned for a in states.values()), "a source that started its run rejects this"
                dec = dec.model_copy(update={"phase": DecisionPhase.ALIGNING, "seq": dec.seq + 1,
                                             "job_epoch": open_epoch + 1,
                                             "subject_epochs": {x: loaded[x] + 1 for x in subjects}})
                commands = {x: Command(seq=dec.seq, kind="align", subject_epoch=dec.subject_epochs[x],
                                       job_epoch=dec.job_epoch) for x in subjects}
            elif step is decision.Next.RECORD_ALIGNED:
                assert aligned_together(states.values())
                return
            elif step is decision.Next.REALIGN:
                assert any(a.aligned for a in states.values()) and not aligned_together(states.values())
                return
            else:
                assert step is decision.Next.AWAIT_ALIGNED


# ---- the coverage step -------------------------------------------------------------------------

def test_coverage_step_uses_a_record_follows_the_old_version_or_decides():
    recorded = coverage.Coverage(covered={"x": Span(first=3, last=3)}, next={"x": 4})
    assert coverage.step(recorded, True, None, 1, {}, {}) == coverage.Step(coverage.Next.DECIDED, recorded)
    assert coverage.step(None, True, None, 1, {}, {}).next is coverage.Next.FOLLOW
    assert coverage.step(None, False, {"x": 4}, 2, {"x": 4}, {"x": None}).next is coverage.Next.WAIT
    decided = coverage.step(None, False, {"x": 4}, 2, {"x": 5}, {"x": None})
    assert decided.next is coverage.Next.DECIDE and decided.coverage is not None and decided.coverage.next == {"x": 6}
    with pytest.raises(AlignerError):
        coverage.step(None, False, None, 1, {}, {})
    assert coverage.catch_up_per({"x": 4, "y": 0}, {"x": 9, "y": None}, None) == 6
    assert coverage.catch_up_per({"x": 4}, {"x": 9}, 2) == 2
