"""Errors users see: each names the subject, path or partition at fault and what to do."""

from __future__ import annotations

from enum import StrEnum


class AlignerError(Exception):
    """Base of every error the product raises on purpose."""


class MalformedNodeError(AlignerError):
    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"malformed ZooKeeper data at {path}: {detail} (nothing was overwritten)")
        self.path = path


class UnknownSubjectError(AlignerError):
    def __init__(self, subject: str) -> None:
        super().__init__(f"unknown subject {subject!r}: register it first (aligner subjects create)")
        self.subject = subject


class SubjectConflictError(AlignerError):
    """A subject is registered again with a different topic, partition count or schema."""


class PartitionClaimedError(AlignerError):
    def __init__(self, subject: str, partition: int, owner: str, claimant: str) -> None:
        super().__init__(
            f"partition {partition} of subject {subject!r} is already owned by producer {owner}; "
            f"{claimant} cannot claim it (each producer writes private partitions)"
        )
        self.partition = partition
        self.owner = owner


class EpochNotCommittedError(AlignerError):
    def __init__(self, subject: str, epoch: int, why: str) -> None:
        super().__init__(f"epoch {epoch} of subject {subject!r} is not committed: {why}")
        self.epoch = epoch


class EpochOutOfRetentionError(AlignerError):
    def __init__(self, subject: str, epoch: int, partition: int, start: int, log_start: int) -> None:
        super().__init__(
            f"epoch {epoch} of subject {subject!r} is out of retention: partition {partition} starts at "
            f"offset {start} but the log now starts at {log_start}"
        )
        self.epoch = epoch


class EpochCollectedError(EpochOutOfRetentionError):
    """The epoch's ZooKeeper record was removed by ``aligner gc`` under the retention policy."""

    def __init__(self, subject: str, epoch: int, first_retained: int) -> None:
        AlignerError.__init__(
            self, f"epoch {epoch} of subject {subject!r} is out of retention: garbage-collected, "
                  f"the earliest retained epoch is {first_retained}"
        )
        self.epoch = epoch
        self.first_retained = first_retained


class FencedError(AlignerError):
    """A newer incarnation of the same producer took over; this one must stop writing."""


class LedgerRollbackError(AlignerError):
    """ZooKeeper answered with state older than what it had acknowledged to this client: the ensemble lost
    committed transactions. Nothing is written on such a ledger."""


class TopicMissingError(AlignerError):
    """A subject's topic (or one of its partitions) is not on the broker while the ledger names it."""

    def __init__(self, topic: str, partition: int) -> None:
        super().__init__(
            f"topic {topic!r} has no partition {partition} on the broker: it was deleted, or the broker lost its "
            f"topics while ZooKeeper kept the ledger (the embedded broker keeps them in memory); recreate the topic "
            f"with the subject's partition count, or start on a fresh --root"
        )
        self.topic, self.partition = topic, partition


class DataLossError(AlignerError):
    """Kafka no longer holds offsets that a committed epoch names (e.g. the broker lost its log)."""


class StateDamagedError(AlignerError):
    """A local state store failed its checksums (a flipped byte, a truncated file): it is a cache of the
    changelog, so the worker moves it aside and restores from the changelog instead of reading it."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(f"local state {path} is damaged: {why}")


class StackError(AlignerError):
    """The embedded stack could not be started, found or stopped."""


class NoQuorumError(StackError):
    """A ZooKeeper ensemble member refuses its damaged data and the other members hold no quorum to rebuild
    it from (``aligner stack up`` tries it again once it restarted the others)."""


class UnreachableError(AlignerError):
    """ZooKeeper or Kafka did not answer; names the address tried and, when known, how to fix it."""

    def __init__(self, service: str, address: str, detail: str, hint: str = "") -> None:
        super().__init__(f"cannot reach {service} at {address}: {detail}" + (f"; {hint}" if hint else ""))
        self.service = service
        self.address = address
        self.detail = detail


class UndecodableRecordError(AlignerError):
    """A record of a json subject is not JSON (an outside producer wrote something else)."""

    def __init__(self, subject: str, epoch: int, partition: int, offset: int, detail: str) -> None:
        super().__init__(
            f"record at partition {partition} offset {offset} (epoch {epoch}) of subject {subject!r} is not JSON "
            f"({detail}); read it as text with --format bytes"
        )
        self.partition = partition
        self.offset = offset


class StoppedError(AlignerError):
    """The component was asked to stop while it waited for ZooKeeper; nothing was changed."""


class EpochFailedError(AlignerError):
    """Kafka did not take the epoch (delivery failed, the commit was refused or timed out); it was
    aborted and can be written again under a new attempt: a transient failure, not a mistake."""


class ContestedCoverageError(EpochFailedError):
    """A job epoch ran on its worker's coverage while the record of it was on its way, and another
    worker's record stood instead: the epoch is aborted and read again on the record that stands."""


class AlignedOptionError(AlignerError):
    """A data source option is missing, malformed or contradicts another."""


class LineageError(AlignerError):
    """A lineage option or lookup that cannot be resolved."""


class UnknownJobError(AlignerError):
    def __init__(self, job: str) -> None:
        super().__init__(f"unknown job {job!r}: no worker of it has registered")
        self.job = job


class IllegalTransition(AlignerError):
    """A protocol event that the state machine's current state does not allow."""

    def __init__(self, state: StrEnum, event: str) -> None:
        super().__init__(f"illegal transition: {event} in state {state.value}")
        self.state = state
        self.event = event


class HotSwapRefused(AlignerError):
    """The swap could not be exactly-once; nothing was changed."""


class AlignmentSplitError(AlignerError):
    """Consumers of one job hold different alignment points (one started J under an Align the others
    rejected); the coordinator aborts the alignment and starts it again."""


class AccessDeniedError(AlignerError):
    """ZooKeeper refused an operation under its ACLs (NoAuth): names the path, the operation and the
    identity, and how an admin grants access. Nothing was changed."""

    def __init__(self, op: str, path: str, identity: str, why: str | None = None) -> None:
        super().__init__(
            f"ZooKeeper denied {op} of {path} to {identity}: " + (why or
            "the ACL policy does not grant it (an admin grants access with `aligner acl grant`; "
            "`aligner acl show PATH` prints who may do what)")
        )
        self.op = op
        self.path = path
        self.identity = identity


class KafkaConfigError(AlignerError):
    """The Kafka client properties file (ALIGNER_KAFKA_CONFIG / --kafka-config) cannot be read or used."""
