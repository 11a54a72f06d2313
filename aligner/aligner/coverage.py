"""Epoch coverage (thesis 5.6-5.7): which subject epochs one aligned job epoch covers.

Aligned job epochs tile their input subjects' epochs: job epoch J (the first of an alignment
run) starts at subject epoch k, and every later job epoch starts where the previous one ended.
A job epoch covers up to ``per`` (k in the thesis) committed epochs of each subject, and ends as
soon as one subject has all of its ``per`` epochs committed (the others contribute what they have
by then, possibly nothing: an epoch vector). A finished subject contributes what is left of it.

The first worker to decide a job epoch records its coverage in ZooKeeper and every other worker
(and a new version following the job in a hot-swap) uses that record, so this decision is made
once per job epoch; these functions are the whole of it, without I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from aligner.alignment import ConsumerAlignment
from aligner.errors import AlignerError
from aligner.models import Span


@dataclass(frozen=True, slots=True)
class Coverage:
    """The subject epochs one job epoch covers (None: none of that subject) and where the next starts."""

    covered: Mapping[str, Span | None]
    next: Mapping[str, int]


def starts(epoch: int, alignments: Mapping[str, ConsumerAlignment], previous_next: Mapping[str, int] | None,
           follows: bool = False) -> dict[str, int]:
    """Where job epoch ``epoch`` starts on each subject.

    At the agreed job epoch J of an alignment run, at subject epoch k; later, where the previous
    job epoch ended (``previous_next``, from its record). A new version of a hot-swap never starts
    a run: it follows the old version's records.
    """
    if not follows and alignments and all(a.job_epoch == epoch for a in alignments.values()):
        return {s: a.subject_epoch or 0 for s, a in alignments.items()}
    if previous_next is None:
        raise AlignerError(f"aligned job epoch {epoch - 1} has no record: job epoch {epoch} cannot know its start")
    return dict(previous_next)


def wanted(start: int, per: int, finished: int | None) -> int:
    """How many of the next ``per`` epochs a subject will still have (fewer once it finished at ``finished``)."""
    return per if finished is None else max(0, min(per, finished - start + 1))


def decide(start: Mapping[str, int], per: int, frontier: Mapping[str, int | None],
           finished: Mapping[str, int | None]) -> Coverage | None:
    """The coverage of a job epoch starting at ``start``, or None while it must wait for more commits.

    ``frontier``: each subject's last committed epoch (epochs commit in order, so every epoch up to
    it is committed); ``finished``: each subject's last epoch once its producers finished.
    """
    if per < 1:
        raise AlignerError(f"epochs per job epoch must be at least 1, not {per}")
    want = {s: wanted(first, per, finished.get(s)) for s, first in start.items()}
    ready = {s: max(0, min(want[s], _committed_after(frontier.get(s), first))) for s, first in start.items()}
    if not any(0 < n == want[s] for s, n in ready.items()) and any(want.values()):
        return None
    return Coverage(covered={s: Span(first=start[s], last=start[s] + n - 1) if n else None for s, n in ready.items()},
                    next={s: start[s] + n for s, n in ready.items()})


def _committed_after(frontier: int | None, first: int) -> int:
    return 0 if frontier is None else frontier - first + 1


class Next(StrEnum):
    """What a worker does next to learn the coverage of the job epoch it starts."""

    DECIDED = "decided"
    """The job epoch is recorded (by any worker, or the old version): use the record."""
    FOLLOW = "follow"
    """A new version while the old one still decides its job epochs: wait for the old one's record."""
    DECIDE = "decide"
    """Enough subject epochs committed: record ``coverage`` (create-if-absent; the first record wins)."""
    WAIT = "wait"
    """Wait for more subject epochs to commit."""


@dataclass(frozen=True, slots=True)
class Step:
    next: Next
    coverage: Coverage | None = None


def step(recorded: Coverage | None, follow: bool, start: Mapping[str, int] | None, per: int,
         frontier: Mapping[str, int | None], finished: Mapping[str, int | None]) -> Step:
    """The coverage step of a job epoch: a record stands; a follower waits for the old version's
    record; otherwise decide from the committed epochs (``start``: where the epoch starts)."""
    if recorded is not None:
        return Step(Next.DECIDED, recorded)
    if follow:
        return Step(Next.FOLLOW)
    if start is None:
        raise AlignerError("a job epoch without a record and not followed needs its start to be decided")
    decided = decide(start, per, frontier, finished)
    return Step(Next.WAIT) if decided is None else Step(Next.DECIDE, decided)


def catch_up_per(start: Mapping[str, int], frontier: Mapping[str, int | None], cap: int | None) -> int:
    """A catching-up batch covers every committed epoch from ``start`` (at most ``cap`` per subject)."""
    available = max((f - start[s] + 1 for s, f in frontier.items() if f is not None), default=0)
    return min(cap, available) if cap is not None else available
