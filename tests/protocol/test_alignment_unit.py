"""Every transition of the alignment state machine, the illegal ones included."""

from __future__ import annotations

import pytest

from aligner.alignment import Command, ConsumerAlignment, IllegalTransition, State, aggregate
from aligner.errors import AlignerError

CATCH_UP = Command(seq=1, kind="catch_up")
ALIGN = Command(seq=2, kind="align", subject_epoch=10, job_epoch=7)
ABORT = Command(seq=3, kind="abort")


def ready() -> ConsumerAlignment:
    return ConsumerAlignment().apply(CATCH_UP).caught_up(ahead=True)


def test_catch_up_then_ready_only_when_ahead():
    c = ConsumerAlignment().apply(CATCH_UP)
    assert c.state is State.CATCHING_UP and c.applied_seq == 1
    assert c.caught_up(ahead=False).state is State.CATCHING_UP
    assert c.caught_up(ahead=True).state is State.READY


def test_align_then_aligned_at_the_agreed_job_epoch():
    c = ready().apply(ALIGN)
    assert (c.state, c.subject_epoch, c.job_epoch) == (State.ALIGNING, 10, 7)
    assert c.started(6).state is State.ALIGNING
    assert c.started(7).state is State.ALIGNED and c.started(7).aligned
    # A restart after J committed resumes aligned.
    assert c.started(9).state is State.ALIGNED


@pytest.mark.parametrize("make", [ConsumerAlignment, lambda: ConsumerAlignment().apply(CATCH_UP), ready,
                                  lambda: ready().apply(ALIGN), lambda: ready().apply(ALIGN).started(7)])
def test_abort_returns_to_unaligned_from_every_state(make):
    c = make().apply(ABORT)
    assert c.state is State.UNALIGNED and c.applied_seq == 3 and c.subject_epoch is None


@pytest.mark.parametrize("make,event", [
    (ConsumerAlignment, ALIGN),
    (lambda: ConsumerAlignment().apply(CATCH_UP), ALIGN),
    (ready, Command(seq=5, kind="catch_up")),
    (lambda: ready().apply(ALIGN), Command(seq=5, kind="align", subject_epoch=11, job_epoch=8)),
    (lambda: ready().apply(ALIGN).started(7), Command(seq=5, kind="catch_up")),
])
def test_illegal_transitions_are_refused(make, event):
    with pytest.raises(IllegalTransition, match=r"illegal transition: (CatchUp|Align) in state"):
        make().apply(event)


def test_align_needs_both_epochs():
    with pytest.raises(AlignerError, match="needs a subject epoch k and a job epoch J"):
        ready().apply(Command(seq=2, kind="align", subject_epoch=3))


def test_commands_apply_once():
    c = ready()
    assert c.apply(CATCH_UP) == c  # an old command is a no-op
    assert c.apply(Command()) == c


def test_late_align_is_rejected_not_applied():
    c = ready()
    assert not c.accepts(ALIGN, open_epoch=7) and c.accepts(ALIGN, open_epoch=6)
    rejected = c.reject(ALIGN)
    assert rejected.state is State.READY and rejected.applied_seq == 2


def test_aggregate_is_the_slowest_consumer():
    assert aggregate([ready(), ConsumerAlignment().apply(CATCH_UP)]).state is State.CATCHING_UP
    assert aggregate([ready().apply(ALIGN).started(7)] * 2).state is State.ALIGNED
    assert aggregate([]).state is State.UNALIGNED
    other = ready().apply(Command(seq=2, kind="align", subject_epoch=11, job_epoch=7)).started(7)
    with pytest.raises(AlignerError, match="disagree"):
        aggregate([ready().apply(ALIGN).started(7), other])



def test_only_aligning_limits_loading_to_the_epoch_before_k():
    c = ready().apply(ALIGN)
    assert c.load_limit == 9
    # Restored from a committed job epoch, the state alone carries the limit.
    assert ConsumerAlignment.model_validate(c.model_dump()).load_limit == 9
    assert c.started(7).load_limit is None  # aligned epochs bound themselves by their covered span
    assert ready().load_limit is None and c.apply(ABORT).load_limit is None
