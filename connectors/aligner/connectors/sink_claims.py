"""How a sink producer claims its subjects in the ledger: every subject it writes (the output first) in one
claim, as a new incarnation of the same producer, so its output and its ``also`` subjects start on one epoch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from aligner.connectors.kafka import end_offsets
from aligner.connectors.lane import Lane
from aligner.errors import SubjectConflictError
from aligner.ledger import Claim, Lease, Ledger


def claim_lanes(ledger: Ledger, sink: str, producer: str, bootstrap: str, lanes: Sequence[Lane],
                topics: Mapping[str, str]) -> dict[str, Lease]:
    """Every lane's lease, the output's (``lanes[0]``) first. A further subject is closed empty up to the
    output's next epoch (epochs written without it); one that another sink wrote past it is refused."""

    def starts(lane: Lane) -> Callable[[], dict[int, int]]:
        return lambda: end_offsets(bootstrap, topics[lane.subject], lane.partitions,
                                   committed_only=False) if lane.partitions else {}

    claimed = ledger.claims.claim_together(sink, producer, [Claim(lane.subject, lane.partitions, starts(lane))
                                                            for lane in lanes])
    main = claimed[0]
    leases = {main.subject: main}
    for lease in claimed[1:]:
        if lease.next_epoch > main.next_epoch:  # a subject added to this sink that others wrote on
            raise SubjectConflictError(
                f"producer {lease.writer} of {lease.subject!r} is at epoch {lease.next_epoch}, past epoch "
                f"{main.next_epoch} of {main.subject!r}: another sink writes {lease.subject!r}; it cannot "
                f"commit together with {main.subject!r}"
            )
        leases[lease.subject] = ledger.commits.close_empty(lease, main.next_epoch)  # epochs written without it
    return leases
