"""Pydantic models of every ZooKeeper payload; each carries a schema version.

Payloads are JSON. Reading goes through :func:`parse`, which turns any validation failure into a
:class:`MalformedNodeError` naming the path, so corrupt state is reported and never overwritten.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from aligner.alignment import Command, ConsumerAlignment
from aligner.errors import MalformedNodeError

SCHEMA_VERSION: Literal[1] = 1

Ident = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,120}$")]
"""Subject, sink, producer and job ids: safe in ZooKeeper node names and in stamps."""


def now_ms() -> int:
    return int(time.time() * 1000)


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION

    def dump(self) -> bytes:
        return self.model_dump_json().encode()


M = TypeVar("M", bound=Node)


def parse(model: type[M], path: str, raw: bytes | None) -> M:
    if not raw:
        raise MalformedNodeError(path, f"empty payload, expected {model.__name__}")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        raise MalformedNodeError(path, f"{model.__name__}.{where}: {first['msg']}") from None


class FieldSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    type: Literal["string", "long", "double", "boolean", "binary", "timestamp"]
    nullable: bool = True


class SubjectNode(Node):
    """A Kafka topic plus what every job needs to agree on to read it."""

    name: Ident
    topic: str
    partitions: int = Field(ge=1)
    value_format: Literal["json", "bytes"] = "json"
    fields: tuple[FieldSpec, ...] = ()
    created_at: int = Field(default_factory=now_ms)

    def same_shape(self, other: SubjectNode) -> bool:
        keys = ("topic", "partitions", "value_format", "fields")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


class WriterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    partitions: tuple[int, ...]
    first_epoch: int = Field(ge=0)
    finished_after: int | None = None
    """Last epoch this writer contributes to, once its sink has finished."""
    holds_from: int | None = None
    """First epoch it writes ``partitions`` when it took them over at a hot-swap (before, from
    ``first_epoch`` on, it was a writer of no partition: a new version following the old one)."""

    def writes(self, epoch: int) -> bool:
        return self.first_epoch <= epoch and (self.finished_after is None or epoch <= self.finished_after)

    @property
    def since(self) -> int:
        """First epoch it writes its partitions."""
        return self.first_epoch if self.holds_from is None else self.holds_from

    def holds(self, partition: int, epoch: int) -> bool:
        return partition in self.partitions and self.since <= epoch and (
            self.finished_after is None or epoch <= self.finished_after)


class WritersNode(Node):
    """Partition ownership of a subject: the one document every claim is compared-and-set against.

    A partition has one writer at a time; successive writers (versions of a job handing the partition
    over at a hot-swap, or a writer claiming a finished one's partitions) hold it over disjoint epochs."""

    writers: dict[str, WriterEntry] = {}

    def owner_of(self, partition: int, epoch: int | None = None) -> str | None:
        """The writer of ``partition`` at ``epoch``; without an epoch, its latest writer (the one writing
        it now, else the one that held it last)."""
        holders = [(e.since, w) for w, e in self.writers.items() if partition in e.partitions
                   and (epoch is None or e.holds(partition, epoch))]
        return max(holders)[1] if holders else None

    def holder(self, partition: int) -> str | None:
        """The writer that holds ``partition`` and has not finished (None: free to claim)."""
        return next((w for w, e in self.writers.items() if partition in e.partitions and e.finished_after is None),
                    None)

    def expected(self, epoch: int) -> tuple[str, ...]:
        return tuple(sorted(w for w, e in self.writers.items() if e.writes(epoch)))


class SinkNode(Node):
    sink: Ident
    created_at: int = Field(default_factory=now_ms)


class ProducerNode(Node):
    """One parallel producer of a sink; its version fences zombies in the commit transaction."""

    sink: Ident
    producer: Ident
    partitions: tuple[int, ...]
    incarnation: int = Field(ge=1)
    committed_epoch: int | None = None
    next_offsets: dict[int, int]
    """Where this producer's next epoch starts in each of its partitions."""
    owner: str = ""
    """Random token of the incarnation: a write retried after a lost reply recognises itself."""

    @model_validator(mode="after")
    def _offsets_cover_partitions(self) -> ProducerNode:
        if set(self.next_offsets) != set(self.partitions):
            raise ValueError("next_offsets must name exactly the producer's partitions")
        return self


class Range(BaseModel):
    """Half-open offset range [start, end): end is the position after the epoch's last record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: int = Field(ge=0)
    end: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.end < self.start:
            raise ValueError(f"end {self.end} before start {self.start}")
        return self

    @property
    def empty(self) -> bool:
        return self.start == self.end


class EpochNode(Node):
    """An epoch of a subject, created before anyone commits to it; lists who must contribute."""

    epoch: int = Field(ge=0)
    writers: tuple[str, ...]
    created_at: int = Field(default_factory=now_ms)


class ContributionNode(Node):
    """One producer's part of a subject epoch; its creation is that producer's ZooKeeper commit."""

    sink: Ident
    producer: Ident
    attempt: int | None
    """The stamp attempt that counts; None for epochs cut by the marker over unstamped data."""
    ranges: dict[int, Range]
    committed_at: int = Field(default_factory=now_ms)
    counts: dict[int, int] = {}
    """Records the committed attempt wrote per partition, when the writer knows (sinks do; the marker
    and older payloads do not). A reader whose range holds exactly that many records knows they are
    all that attempt's and may skip their stamps."""

    @model_validator(mode="after")
    def _counts_fit_ranges(self) -> ContributionNode:
        for p, n in self.counts.items():
            rng = self.ranges.get(p)
            if rng is None:
                raise ValueError(f"count for partition {p}, which has no range")
            if not 0 <= n <= rng.end - rng.start:
                raise ValueError(f"partition {p}: {n} records cannot lie in [{rng.start}, {rng.end})")
        return self

    def dump(self) -> bytes:
        # Without counts the payload stays byte-for-byte what earlier versions wrote.
        return self.model_dump_json(exclude=None if self.counts else {"counts"}).encode()


# ---- jobs -----------------------------------------------------------------------------------------

Mode = Literal["at_least_once", "exactly_once", "aligned"]
Engine = Literal["runtime", "spark", "faust"]


class JobNode(Node):
    """A registered job version: what it reads and writes, and what the coordinator may assume."""

    job: Ident
    version: str = "1"
    inputs: tuple[Ident, ...]
    output: Ident
    parallelism: int = Field(ge=1)
    deterministic: bool = True
    """False for jobs with async I/O or cycles (thesis 4.6): they cannot be hot-swapped exactly-once."""
    per_key_order: bool = False
    mode: Mode = "exactly_once"
    follows: Ident | None = None
    """A new version running beside ``follows``: it reads that job's aligned epochs and voids its
    output until a hot-swap hands the target over to it."""
    output_partitions: tuple[int, ...] | None = None
    shadow: Ident | None = None
    """A new version's private subject: what it would have written, epoch for epoch, while its output
    is voided, so ``aligner verify`` can compare it with the old version's before the swap."""
    engine: Engine = "runtime"
    """What runs the job, for operators (``aligner console``, ``status``); the protocol is the same for all."""
    created_at: int = Field(default_factory=now_ms)

    @property
    def hands_over(self) -> bool:
        """A new version without partitions of its own: its hot-swap hands it the old version's partitions
        of the target from S+1 (:mod:`aligner.handover`); until then its producers hold none."""
        return self.follows is not None and self.output_partitions is None

    def same_shape(self, other: JobNode) -> bool:
        keys = ("version", "inputs", "output", "parallelism", "deterministic", "per_key_order")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


class Span(BaseModel):
    """Inclusive span of subject epochs [first, last] covered by one job epoch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    first: int = Field(ge=0)
    last: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.last < self.first:
            raise ValueError(f"span last {self.last} before first {self.first}")
        return self


class JobEpochNode(Node):
    """An aligned job epoch: the subject epochs it covers, decided once for every worker."""

    epoch: int = Field(ge=0)
    covered: dict[str, Span | None]
    next: dict[str, int]
    """Per subject: the first subject epoch the next job epoch covers."""
    created_at: int = Field(default_factory=now_ms)


class WorkerEpochNode(Node):
    """A worker's committed job epoch: where its inputs restart and its keyed state snapshot."""

    epoch: int = Field(ge=0)
    mode: Mode
    offsets: dict[str, dict[int, int]]
    """Per input subject and partition: the next offset to process."""
    load_from: dict[str, int]
    """Per input subject: the first subject epoch not yet fully consumed."""
    covered: dict[str, Span | None] | None = None
    """Aligned epochs only: the subject epochs this job epoch covered."""
    state: str = ""
    """Unused since keyed state lives in the job's changelog subject (kept so older records parse)."""
    state_base: int | None = None
    """The changelog epoch this worker's state is rebuilt from: one whose changelog records of the worker's
    partition hold its whole state (this epoch or an earlier one). None (older records): from the
    changelog writer's first epoch. Retention collects a changelog only below every worker's base."""
    state_from: str | None = None
    """"job@epoch": this epoch's state was taken over from that job's state as of that epoch (a hot-swap's
    new version starting from the old version's state)."""
    alignment: dict[str, ConsumerAlignment] = {}
    """Alignment state per input subject, committed with the epoch so a restart resumes it exactly."""
    committed_at: int = Field(default_factory=now_ms)


class ConsumerNode(Node):
    """A consumer's reported alignment state and progress, written by the worker only."""

    alignment: ConsumerAlignment = ConsumerAlignment()
    mode: Mode = "exactly_once"
    job_epoch: int | None = None
    """Last committed job epoch."""
    subject_epoch: int | None = None
    """Last subject epoch fully consumed."""
    rejected_seq: int = 0
    """Seq of an Align command that came too late for this consumer; the coordinator re-issues it."""
    swap_seen: tuple[int, int] | None = None
    """(swap epoch S, job epoch at whose start the worker first saw the pre-commit of S)."""
    waiting_since: int | None = None
    """Wall-clock ms since which the worker has had no input to read (None while it reads)."""
    updated_at: int = Field(default_factory=now_ms)


class CommandNode(Node):
    command: Command = Command()
    written_at: int = Field(default_factory=now_ms)


class DecisionPhase(StrEnum):
    """Where the coordinator's alignment of a job stands (recorded before it takes effect)."""

    CATCHING_UP = "catching_up"
    ALIGNING = "aligning"
    ALIGNED = "aligned"
    ABORTING = "aborting"
    ABORTED = "aborted"


class Phase(StrEnum):
    """Where a hot-swap stands: its two-phase commit (see :mod:`aligner.swap`)."""

    PRECOMMIT = "precommit"
    COMMIT = "commit"
    DONE = "done"
    ABORTED = "aborted"


class AlignmentDecision(Node):
    """The coordinator's decision for a job, written before it takes effect so a new leader resumes it."""

    job: Ident
    subjects: tuple[Ident, ...]
    phase: DecisionPhase
    seq: int
    subject_epochs: dict[str, int] = {}
    job_epoch: int | None = None
    realign: bool = False
    """An abort the coordinator started itself, on a split alignment: whoever aligns next finishes it and
    aligns again (an operator's abort is finished by ``aligner abort`` only)."""
    updated_at: int = Field(default_factory=now_ms)


class SwapNode(Node):
    """A hot-swap of ``old`` by ``new`` on ``target`` at epoch S, committed in two phases.

    precommit: both jobs learn S before either starts epoch S+1 (they acknowledge it);
    commit: the old job's sink finishes after S, the new job writes from S+1 on;
    aborted: before commit only; the old job goes on writing as if nothing happened.
    """

    old: Ident
    new: Ident
    target: Ident
    epoch: int = Field(ge=0)
    phase: Phase
    seq: int = 1
    accepted: int | None = None
    """The furthest epoch either version or the target had committed when S was chosen: S - accepted is how
    far ahead of the jobs the swap lands (its margin, or more for a requested or re-chosen S)."""
    updated_at: int = Field(default_factory=now_ms)
