"""The retention policy, pure: which epochs of a subject are kept, like Kafka's ``retention.ms``.

An epoch is kept while it is within either bound: one of the last ``min_epochs`` committed epochs, or
committed less than ``hours`` ago. Below that, it is still kept while anything needs it (a consumer's
position, a swap in flight, a shadow lane: the caller names those *needed* floors). The result is a
floor: every epoch below it may go, nothing at or above it. Floors only rise, so a reader that met
the out-of-retention error never finds the epoch back. No I/O here: the coordinator reads the ledger,
:mod:`aligner.retention` deletes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from aligner.errors import AlignerError

CHANGELOG_SUFFIX = ".state"
"""A job's changelog subject (``{job}.state``): a restore replays it from a worker's state base, so
retention collects it only below the bases its owner's workers still restore from."""


class RetentionPolicy(BaseSettings):
    """``ALIGNER_RETENTION_ENABLED`` / ``_HOURS`` / ``_MIN_EPOCHS``; ``hours`` None: no time bound."""

    model_config = SettingsConfigDict(env_prefix="ALIGNER_RETENTION_", extra="ignore")

    enabled: bool = Field(True, description="False: nothing is ever collected")
    hours: float | None = Field(24.0, ge=0, description="Keep epochs committed less than this long ago")
    min_epochs: int = Field(1000, ge=1, description="Keep at least the last N committed epochs per subject")

    @property
    def keep_ms(self) -> float | None:
        return None if self.hours is None else self.hours * 3_600_000

    def with_bounds(self, min_epochs: int | None, seconds: float | None) -> RetentionPolicy:
        """The policy as ``aligner gc``'s flags override it: ``--keep-epochs`` alone keeps exactly the
        last N (no time bound, as gc always did); ``--keep-seconds`` sets the time bound."""
        if min_epochs is None and seconds is None:
            return self
        hours = None if seconds is None else seconds / 3600
        return self.model_copy(update={"min_epochs": min_epochs or self.min_epochs, "hours": hours, "enabled": True})


def policy_from_env(**overrides: object) -> RetentionPolicy:
    """The policy of ``ALIGNER_RETENTION_*`` with ``overrides`` (None values ignored); a bad value is one
    clear :class:`AlignerError` naming the variable."""
    try:
        policy = RetentionPolicy()
        return policy.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "ALIGNER_RETENTION_" + str(first["loc"][0]).upper() if first["loc"] else "ALIGNER_RETENTION_*"
        raise AlignerError(f"{name}: {first['msg']}") from None


def collectable(subject: str, owned_changelogs: Collection[str] = ()) -> bool:
    """Whether retention may collect ``subject`` at all: a changelog only when its owner's state bases
    were read (``owned_changelogs``), as needs that hold its floor."""
    return not subject.endswith(CHANGELOG_SUFFIX) or subject in owned_changelogs


def first_young(done: Sequence[int], committed_at: Callable[[int], int | None], since_ms: float) -> int:
    """Index in ``done`` of the first epoch committed at or after ``since_ms`` (len(done): none).

    Binary search: epochs commit in order, so their commit times rise with their numbers; that costs
    log2(n) reads of epoch times instead of n. An epoch without a time (gone meanwhile) counts as old."""
    lo, hi = 0, len(done)
    while lo < hi:
        mid = (lo + hi) // 2
        at = committed_at(done[mid])
        if at is not None and at >= since_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo


def retention_floor(numbers: Sequence[int], frontier: int | None, committed_at: Callable[[int], int | None],
                    now_ms: float, policy: RetentionPolicy, needed: Iterable[int] = (), previous: int = 0) -> int:
    """The subject's new first retained epoch: the lowest of the policy's bounds and every ``needed``
    floor, never below ``previous`` (floors only rise). ``numbers`` are the subject's epoch numbers in
    order, ``frontier`` its last committed epoch (epochs above it are never collected)."""
    if not policy.enabled or frontier is None:
        return previous
    done = [e for e in numbers if e <= frontier]
    if not done:
        return previous
    by_count = max(0, len(done) - policy.min_epochs)
    keep_from = by_count
    if policy.keep_ms is not None and by_count > 0:
        keep_from = first_young(done[:by_count], committed_at, now_ms - policy.keep_ms)
    floor = done[keep_from] if keep_from < len(done) else frontier + 1
    floor = min([floor, *needed])
    return max(floor, previous)


def victims(numbers: Sequence[int], floor: int) -> list[int]:
    """The epochs a floor lets go."""
    return [e for e in numbers if e < floor]


def needed_floor(subject_epoch: int | None) -> int:
    """A consumer that fully consumed ``subject_epoch`` needs every later epoch (None: all of them)."""
    return 0 if subject_epoch is None else subject_epoch + 1
