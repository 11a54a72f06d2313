"""Transactional subject sink: one Kafka transaction per epoch, stamped where it must be.

A producer owns private partitions of the subject. ``commit`` flushes, takes each partition's
range from the delivery reports, commits the Kafka transaction (the pre-commit) and then commits
the epoch in ZooKeeper (the commit point for aligned readers). A crash between the two leaves
Kafka records whose attempt ZooKeeper never names; readers drop them and the epoch is written
again by the next incarnation.

A sink may write further subjects beside its output (``also``, e.g. a job's changelog subject):
their records go into the same Kafka transaction and their epochs (the same numbers as the
output's) commit in the same ZooKeeper multi-op, so they are committed together or not at all.
Each such subject gets a ledger producer of its own (same sink and producer id), claimed, fenced
and reincarnated exactly like the output's.

The Kafka half (producer settings, partition choice, held-back records, delivery reports, stamps,
retries of an unreachable broker) is :class:`aligner.connectors.stamped.StampedProducer`, which
``SinkProducer`` is composed of (its ``producer``) and the Spark writer's task attempts use as is.

A writer that can write epochs again from any committed one (a loader reading files or a plain
topic) may pipeline: ``commit(wait=False)`` returns once Kafka committed, with the ZooKeeper commit
in flight while the next epoch is written; the next ``commit`` waits for it before its own Kafka
commit. The order on each side is unchanged (Kafka before ZooKeeper per epoch, ZooKeeper epoch after
epoch), so readers see exactly what they see otherwise. What changes is where a failure shows: an
epoch whose ZooKeeper commit failed aborts the next one too, and the writer resumes from
``next_epoch`` (the epoch before the one it was writing). Where it writes a subject alone, its commit
multi-op also makes the next epoch's node, so it needs one ZooKeeper request per epoch, not two; it
is then committed to that epoch (``finish`` closes it empty). bench_sink: the commit multi-op is ~9 %
of a 10,000-record epoch's wall time, most of it waiting on ZooKeeper. The price is latency: while
the sink sends flat out, kazoo's connection thread gets the GIL only at forced switches, so the
multi-op lands during the next epoch's flush rather than at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

from aligner.connectors.kafka import end_offsets, transactional_id
from aligner.connectors.lane import Lane, Written, without_stamps
from aligner.connectors.sink_claims import claim_lanes
from aligner.connectors.sink_commits import Confirmed, SinkCommits
from aligner.connectors.stamped import ReleasingProducer, StampedProducer
from aligner.errors import AlignerError, EpochFailedError
from aligner.ledger import Contribution, Lease, Ledger
from aligner.metrics import COMMIT_SECONDS, EPOCHS_COMMITTED, EPOCHS_RESTAMPED, LAST_EPOCH, RECORDS_SENT
from aligner.models import Range
from aligner.ops import Op
from aligner.stamps import Stamp, StampChoice

log = logging.getLogger(__name__)

FaultHook = Callable[[str], None]
"""Called at named points of the commit ("before_kafka_commit", "after_kafka_commit",
"after_zk_commit"); tests use it to crash a producer exactly there."""


@dataclass(frozen=True)
class EpochCommit:
    epoch: int
    attempt: int | None
    """The attempt its records' stamps name; None: they carry none (its ranges hold only its records)."""
    ranges: dict[int, Range]
    records: int
    also: dict[str, dict[int, Range]] = field(default_factory=dict)
    """The ranges of the epoch in each further subject the sink writes."""


TRANSIENT: tuple[type[BaseException], ...] = (EpochFailedError, KafkaException, ConnectionLoss, SessionExpiredError,
                                             OperationTimeoutError, TimeoutError, ConnectionError)
"""Failures of the broker or ZooKeeper, not of the caller: the epoch is aborted and written again."""


def partitions_for(index: int, parallelism: int, partitions: int) -> list[int]:
    """Round-robin private partitions for producer ``index`` of ``parallelism``."""
    if not 0 <= index < parallelism <= partitions:
        raise AlignerError(f"producer {index} of {parallelism} needs 0 <= index < parallelism <= {partitions}")
    return list(range(index, partitions, parallelism))


class SinkProducer:
    """One parallel producer of a sink, writing exact epochs of one subject (and of the ``also`` subjects,
    {subject: private partitions}, in the same transactions and epochs: see ``send_to``).

    The Kafka half is the :class:`StampedProducer` it is composed of (``producer``; ``send``, ``send_many``,
    ``send_to`` and ``lane`` are its (or its main lane's) bound methods: no hop on the hot path); this class
    adds the ledger: claims, stamps from the leases' attempts (when ``stamping`` says), the ZooKeeper commit.
    """

    def __init__(self, ledger: Ledger, bootstrap: str, subject: str, sink: str, producer: str | int,
                 partitions: Sequence[int], *, also: Mapping[str, Sequence[int]] | None = None,
                 kafka_config: dict[str, Any] | None = None, fault: FaultHook | None = None,
                 always_stamp: bool = False) -> None:
        self.producer_id = str(producer)
        self.producer = StampedProducer(bootstrap, transactional_id(subject, sink, self.producer_id), subject,
                                        partitions, also=also, name=f"{self.producer_id} of {subject!r}",
                                        kafka_config=kafka_config, stopping=ledger.stopping)
        self.send, self.send_many = self.producer.send, self.producer.send_many
        self.send_to, self.lane = self.producer.send_to, self.producer.lane
        self.lanes: dict[str, Lane] = self.producer.lanes
        """Every subject written, the main one first (the producer's own dict)."""
        self.subject = subject
        self.bootstrap = bootstrap
        self.ledger = ledger
        self.sink = sink
        self._fault = fault or (lambda point: None)
        self._leases: dict[str, Lease] = {}
        """Per subject written (the output first): the ledger producer's lease."""
        self._zk = SinkCommits(ledger)
        self.stamping = StampChoice(always_stamp)

    # ---- the Kafka half -----------------------------------------------------------------------

    @property
    def kp(self) -> ReleasingProducer:
        return self.producer.kp

    @property
    def partitions(self) -> list[int]:
        return self.producer.partitions

    @property
    def epoch(self) -> int | None:
        """The open epoch, until ZooKeeper committed it (its Kafka transaction may have committed already)."""
        return self.producer.epoch

    @property
    def stamped(self) -> bool:
        """Whether the open epoch's records carry stamps."""
        return self.producer.open_epoch is None or self.producer.open_epoch.stamped

    # ---- lifecycle ----------------------------------------------------------------------------

    def open(self) -> SinkProducer:
        """Claim (or reclaim, as a new incarnation) the producer in every subject written, and fence
        the Kafka transaction an older incarnation left open."""
        metas = {subject: self.ledger.subjects.subject(subject) for subject in self.lanes}
        topics = {subject: meta.topic for subject, meta in metas.items()}
        self._leases = claim_lanes(self.ledger, self.sink, self.producer_id, self.bootstrap, list(self.lanes.values()),
                                   topics)  # the output first
        # Fences an older incarnation's transaction; keyed records are routed by each subject's partition count.
        self.producer.start(topics, {s: meta.partitions for s, meta in metas.items()})
        return self

    def close(self) -> None:
        """Release the producer without waiting on the broker: an open epoch's transaction is aborted
        if the broker answers at once, else left to the next incarnation, which fences it."""
        self._zk.reset()
        self.producer.close()

    def __enter__(self) -> SinkProducer:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def lease(self) -> Lease:
        """The output subject's lease (as of the last epoch ZooKeeper confirmed: see :meth:`sync`)."""
        return self.leases[self.subject]

    @property
    def leases(self) -> dict[str, Lease]:
        """Every subject's lease, the output first."""
        if not self._leases:
            raise AlignerError("producer is not open")
        return dict(self._leases)

    @property
    def next_epoch(self) -> int:
        """The epoch ``begin`` will open: one after the last epoch committed (or, with ``commit(wait=False)``,
        on its way to ZooKeeper). After a failure, the first epoch to write again."""
        confirming = self._zk.confirming
        return self.lease.next_epoch if confirming is None else confirming.epoch + 1

    @property
    def attempt(self) -> int:
        return self.lease.node.incarnation

    # ---- epochs -------------------------------------------------------------------------------

    def begin(self) -> int:
        if self.epoch is not None:
            raise AlignerError(f"epoch {self.epoch} is still open; commit or abort it first")
        epoch = self.next_epoch
        self._zk.ensure_async(epoch, self._leases)  # round trip 1, awaited in commit() (step 3)
        stamped = self.stamping.stamped()
        self.producer.begin_epoch(epoch, {s: Stamp(self.sink, epoch, lease.node.incarnation) if stamped else None
                                          for s, lease in self._leases.items()})
        return epoch

    def commit(self, extra: Sequence[Op] = (), *, wait: bool = True) -> EpochCommit:
        """Pre-commit in Kafka, then commit in ZooKeeper; returns the committed ranges.

        ``extra`` ZooKeeper ops (a job's input offsets) commit atomically with the epoch, in the
        same multi-op as every subject's contribution.

        ``wait=False`` returns once Kafka committed: the ZooKeeper commit goes on beside the next
        epoch and is waited for by the next ``commit`` (or :meth:`sync`), before that epoch's Kafka
        commit. If it failed, that call aborts its own epoch too and raises EpochFailedError: write
        again from ``next_epoch``. The multi-op makes the next epoch's node too where this producer writes
        alone (``ledger.commits.commit_epoch_async``), so the next ``begin`` sends nothing to ZooKeeper.
        """
        epoch = self.epoch
        if epoch is None:
            raise AlignerError("no open epoch to commit")
        started = time.monotonic()
        written = self._flush()  # 1. every record on the broker: the epoch's ranges
        # 2. The epoch before, if its ZooKeeper commit is in flight: waited for after the flush, whose wait
        # on the broker lets kazoo's thread (starved of the GIL while records are sent) finish it.
        self._settle_or_abort()
        self._fault("before_kafka_commit")
        self._ensure_node(epoch)  # 3. the epoch's node in every subject (round trip 1, sent by begin)
        self._precommit()  # 4. the Kafka commit
        self._fault("after_kafka_commit")
        attempt = self.attempt if self.stamped else None
        self._commit_point(epoch, written, extra, wait, started)  # 5. the ZooKeeper commit
        main = written[self.subject]
        return EpochCommit(epoch, attempt, main.ranges, main.records,
                           {s: w.ranges for s, w in written.items() if s != self.subject})

    def _flush(self) -> dict[str, Written]:
        """Step 1: the open epoch's records on the broker, each subject's ranges; a failed write aborts, and so
        does an unstamped one with another writer's records among its own (written again with stamps)."""
        try:
            written = self.producer.flush_epoch(self._zk.starts(self._leases))
            if (dense := written if self.stamped else without_stamps(written)) is None:
                self.stamping.mixed()
                EPOCHS_RESTAMPED.labels(self.subject, self.sink).inc()
                raise EpochFailedError(f"epoch {self.epoch}: another writer's records lie among this attempt's, "
                                       f"which carry no stamps; written again with stamps")
            return dense
        except EpochFailedError as exc:
            self.abort()
            raise EpochFailedError(f"{exc}; aborted") from exc

    def _ensure_node(self, epoch: int) -> None:
        """Step 3: wait for the open epoch's round trip 1, issued by ``begin`` (done already on a retried commit)."""
        try:
            self._zk.ensured(epoch)
        except Exception:  # re-raised: the epoch node could not be made, so nothing was committed anywhere
            self.abort()
            raise

    def _precommit(self) -> None:
        """Step 4: commit the Kafka transaction; the epoch stays open until ZooKeeper commits it."""
        try:
            self.producer.commit_transaction(end=False)
        except EpochFailedError as exc:
            self.abort()  # e.g. a record produced without a delivery report failed
            raise EpochFailedError(f"{exc}; aborted") from exc

    def _commit_point(self, epoch: int, written: Mapping[str, Written], extra: Sequence[Op], wait: bool,
                      started: float) -> None:
        """Step 5: commit the epoch in ZooKeeper, the commit point for aligned readers (or send the commit,
        ``wait=False``); the epoch ends once it is done (or sent)."""
        stamped = self.stamped
        contributions = [Contribution(lease, lease.node.incarnation if stamped else None, written[s].ranges,
                                      written[s].counts) for s, lease in self._leases.items()]
        if wait:
            leases = self._zk.commit(epoch, contributions, extra)
            self.producer.end_epoch()
            self._confirmed(Confirmed(epoch, leases, written, time.monotonic() - started))
        else:
            self._zk.send(epoch, contributions, extra, written, time.monotonic() - started)
            self.producer.end_epoch()
            self._fault("zk_commit_sent")

    def sync(self) -> int | None:
        """Wait for the ZooKeeper commit ``commit(wait=False)`` left in flight; returns the last epoch
        committed. If it failed, an open epoch is aborted as well and EpochFailedError is raised: write
        again from ``next_epoch``."""
        self._settle_or_abort()
        return self.lease.node.committed_epoch

    def _confirmed(self, done: Confirmed) -> None:
        """ZooKeeper committed an epoch: its leases carry the next epoch's versions and offsets."""
        self._leases = dict(zip(self._leases, done.leases, strict=True))
        self._fault("after_zk_commit")
        COMMIT_SECONDS.labels(self.subject, self.sink).observe(done.seconds)
        for s, w in done.written.items():
            RECORDS_SENT.labels(s, self.sink).inc(w.records)
            EPOCHS_COMMITTED.labels(s, self.sink).inc()
            LAST_EPOCH.labels(s, self.sink, self.producer_id).set(done.epoch)

    def _settle(self) -> None:
        """Wait for the ZooKeeper commit in flight, if any."""
        done = self._zk.settle()
        if done is not None:
            self._confirmed(done)

    def _settle_or_abort(self) -> None:
        """Wait for the ZooKeeper commit in flight. Its Kafka transaction committed, but if ZooKeeper did
        not name it, readers drop its records: it is written again, after the open epoch is aborted."""
        confirming = self._zk.confirming
        try:
            self._settle()
        except Exception as exc:  # re-raised (not an interrupt: that ends the process, and ZooKeeper says what landed)
            self._abort(unnamed=True)  # a new attempt: next_epoch is ZooKeeper's last committed epoch + 1
            if isinstance(exc, TRANSIENT):
                assert confirming is not None
                raise EpochFailedError(f"epoch {confirming.epoch} of {self.subject!r} did not commit in ZooKeeper "
                                       f"({type(exc).__name__}: {exc}); write again from epoch {self.next_epoch}"
                                       ) from exc
            raise

    def finish(self) -> int | None:
        """No more epochs from this producer: readers of the subjects may drain and stop."""
        if self.epoch is not None:
            raise AlignerError("commit or abort the open epoch before finishing")
        self._settle_or_abort()
        last = None
        for subject, lease in self.leases.items():
            done = self.ledger.commits.finish(lease)
            if subject == self.subject:
                last = done
        return last

    def finish_lane(self, subject: str) -> int | None:
        """Stop writing one of the ``also`` subjects (a new version's shadow, at its swap): its producer is
        finished after its last committed epoch, so its readers drain and stop and retention can collect it,
        and later epochs commit without it. Returns the last epoch it wrote."""
        if self.epoch is not None:
            raise AlignerError("commit or abort the open epoch before finishing a lane")
        self._settle_or_abort()
        if subject == self.subject or subject not in self._leases:
            raise AlignerError(f"{subject!r} is not one of the other subjects this sink writes ({sorted(self.lanes)})")
        lease = self._leases.pop(subject)
        del self.lanes[subject]
        self._zk.forget(subject)
        return self.ledger.commits.finish(lease)

    def take_over(self, partitions: Sequence[int], giver: str, last: int) -> None:
        """Take ``partitions`` of the output over from the old version's sink ``giver`` after the swap
        epoch ``last`` (committed at the output; :meth:`aligner.ledger.Ledger.take_over`): a new version
        writes from ``last`` + 1 on the partitions its old version wrote."""
        if self.epoch is not None:
            raise AlignerError("commit or abort the open epoch before taking partitions over")
        self._settle_or_abort()
        topic = self.producer.topic
        lease = self.ledger.claims.take_over(self.lease, partitions, giver, last, lambda parts: end_offsets(
            self.bootstrap, topic, parts, committed_only=False))
        self._leases[self.subject] = lease
        self._zk.forget(self.subject)
        self.producer.main.own(lease.node.partitions, self.ledger.subjects.subject(self.subject).partitions)

    @property
    def holds_partitions(self) -> bool:
        """Whether it writes any partition of the output (a new version writes none until its swap)."""
        return bool(self.lease.node.partitions)

    def abort(self) -> None:
        """Abort the open epoch; it will be written again under a new attempt number. A ZooKeeper commit
        in flight is waited for first; if it failed, its epoch is written again too (from ``next_epoch``)."""
        try:
            self._settle()
            unnamed = False
        except Exception as exc:  # recorded here; safe: the new attempt below writes its epoch again
            log.warning("producer %s: the ZooKeeper commit in flight failed (%s: %s); its epoch is written again "
                        "from epoch %d", self.producer.name, type(exc).__name__, exc, self.lease.next_epoch)
            unnamed = True
        self._abort(unnamed)

    def _abort(self, unnamed: bool) -> None:
        """``unnamed``: an epoch's Kafka transaction committed but ZooKeeper may not name its attempt, so a
        new attempt is taken even without an open epoch (or with one precommitted in Kafka)."""
        if self.producer.started and (self.epoch is not None or unnamed):
            try:
                self.producer.abort_transaction()
            finally:
                self._zk.pending = []
                self._leases = {s: self.ledger.claims.reincarnate(lease) for s, lease in self._leases.items()}
