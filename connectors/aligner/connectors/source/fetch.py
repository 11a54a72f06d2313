"""A source's consumer and its hot path: fetched runs cut into the loaded epochs' records.

The fetch hands over records up to the end of the last loaded epoch (never further) and keeps a record only
when its stamp is the committed attempt (its header is not even read where the slice's record count shows
that nothing else lies in the rest of the range). Past the last loaded epoch it fetches only into a capped
stash, and only while the next epoch is committed already (a job catching up). In at-least-once mode it
reads whatever Kafka shows, unbounded and unfiltered.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable
from operator import methodcaller

from confluent_kafka import KafkaError, Message, TopicPartition

from aligner.connectors.kafka import FetchingConsumer
from aligner.connectors.source.positions import Part, SourcePositions
from aligner.connectors.source.record import Records
from aligner.connectors.watchdog import CrawlWindow
from aligner.errors import DataLossError
from aligner.ledger import Ledger
from aligner.models import Mode
from aligner.stamps import stamp_of

SOURCE_FETCH_WAIT_MS = 100
"""A source's first fetch wait: shorter than readers' (FETCH_WAIT_MS), because librdkafka keeps one
fetch per broker in flight, and the fetch a source sends as it reaches an epoch's end holds back the
next epoch's first fetch for up to this long. Bounded sources unassign a partition at its bound, so
caught up they send no fetches at all; an at-least-once source caught up costs the broker ~0.5 % of a
core at 100 ms (bench_fetch). A broker too slow for it gets a longer wait from the watchdog."""

STASH_RECORDS = 20_000
"""Records a partition paused at its bound keeps fetched ahead before it stops fetching (about 2 MB of 100-byte
records; the fetch that reaches it is kept whole)."""

_offset = methodcaller("offset")

_DATA_LOST = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})
"""Fetch errors meaning the log no longer holds what a committed epoch names; others are transient."""


def source_settings(mode: Mode) -> dict[str, object]:
    """What a source's consumer sets beyond ``consumer_config``. The prefetch stays the readers' (queued.min.messages
    200,000, at most 64 MB queued): librdkafka counts it over the consumer's one queue, not per partition, and the
    embedded broker may answer a fetch with a partition's whole log. At 20,000 (this source's earlier
    setting) one partition's records fetched past its bound kept every other partition from being fetched until
    the source had stashed them, and an aligned job waited on empty consumes at each epoch's start (bench_pipeline,
    300k records a run: 40-120 empty consumes, 0.26-0.67 s; 0-15 and 0-0.09 s at 200,000)."""
    return {"fetch.queue.backoff.ms": 5, "fetch.error.backoff.ms": 10, "max.partition.fetch.bytes": 1 << 20,
            # at-least-once does not wait for any commit (thesis 6.3)
            **({"isolation.level": "read_uncommitted"} if mode == "at_least_once" else {})}


class SourceFetch:
    """The consumer (replaced by a slower one when the watchdog says so), what it is assigned, the stash, and
    the per-run hot path. Everything the hot path reads is an attribute of this object or a module global:
    no hop through another part of the source per run or per record."""

    def __init__(self, ledger: Ledger, bootstrap: str, mode: Mode, positions: SourcePositions) -> None:
        self.ledger = ledger
        self.mode = mode
        self.positions = positions
        self.parts = positions.parts
        self.inputs = positions.inputs
        self._by_topic = positions.by_topic
        self.fetching = FetchingConsumer(bootstrap, source_settings(mode), SOURCE_FETCH_WAIT_MS)
        self.consumer = self.fetching.consumer
        self.crawl = CrawlWindow(time.monotonic())
        """Polls of a readable source, for the watchdog's crawl rule; lag is what the lagging partitions had to read."""

    def close(self) -> None:
        self.fetching.close()

    # ---- assignment ---------------------------------------------------------------------------

    def fetch_from(self, parts: Iterable[Part]) -> None:
        """Fetch ``parts`` from their positions on (restored, first loaded, or on a new consumer)."""
        assign = []
        for part in parts:
            assert part.pos is not None, "a partition fetches from a position"
            part.fetching = True
            assign.append(TopicPartition(part.topic, part.partition, part.pos))
        if assign:
            self.consumer.incremental_assign(assign)

    def reopen(self) -> int:
        """Read on with a consumer that waits longer per fetch, from where every partition stands; returns the
        new wait."""
        wait = self.fetching.slower()
        self.consumer = self.fetching.consumer
        for p in self.parts.values():
            p.fetching = False  # a paused one is assigned again when it resumes
        self.fetch_from(p for p in self.parts.values() if p.pos is not None and not p.paused)
        return wait

    def _assign(self, part: Part) -> None:
        """Fetch ``part`` from ``fetch_at`` on (once)."""
        if not part.fetching:
            self.consumer.incremental_assign([TopicPartition(part.topic, part.partition, part.fetch_at)])
            part.fetching = True

    def _unassign(self, part: Part) -> None:
        if part.fetching:
            self.consumer.incremental_unassign([TopicPartition(part.topic, part.partition)])
            part.fetching = False

    # ---- reading ------------------------------------------------------------------------------

    def poll(self, timeout: float, max_records: int) -> Records:
        """Kept records of loaded epochs, in offset order per partition."""
        out = Records()
        touched = False
        for waiting in self.parts.values():
            if waiting.paused and waiting.pos is not None and waiting.pos < waiting.bound:
                self._resume(waiting, out)
                touched = True
        if self.positions.readable():
            messages = self.consumer.consume(max_records, timeout=timeout)
            errors = 0
            by_topic = self._by_topic
            i, n = 0, len(messages)
            while i < n:  # runs of one partition: librdkafka hands over a fetched batch whole
                m = messages[i]
                topic, partition = m.topic(), m.partition()
                j = i + 1
                while j < n and messages[j].partition() == partition and messages[j].topic() == topic:
                    j += 1
                part = by_topic.get((topic, partition))  # type: ignore[arg-type]
                if part is not None and part.pos is not None:
                    errors += self._take(part, messages[i:j] if i or j < n else messages, out)
                    touched = True
                else:
                    errors += sum(messages[k].error() is not None for k in range(i, j))
                i = j
            self.crawl.polled(n - errors)
        self._settle(touched)
        return out

    def _take(self, part: Part, run: list[Message], out: Records) -> int:
        """Keep what ``run``, fetched from ``part`` in offset order, holds for loaded epochs; stash what lies past
        the bound. Error events (end of partition, a broker outage or a slow fetch: librdkafka retries by itself)
        split it into clean runs. Returns how many messages were errors."""
        if not [m for m in run if m.error() is not None]:  # a comprehension: ~3 times cheaper than map(error)
            self._take_clean(part, run, out)
            return 0
        errors = start = 0
        for k, m in enumerate(run):
            err = m.error()
            if err is None:
                continue
            if start < k:
                self._take_clean(part, run[start:k], out)
            errors, start = errors + 1, k + 1
            if err.code() in _DATA_LOST:
                raise DataLossError(f"{m.topic()}[{m.partition()}]: {err}")
        if start < len(run):
            self._take_clean(part, run[start:], out)
        return errors

    def _take_clean(self, part: Part, run: list[Message], out: Records, stashed: bool = False) -> None:
        """``_take`` for a run without errors (``stashed``: served from the stash, all below the bound), a piece
        at a time: each piece (one epoch's records, those past the bound, those read already) is found by
        bisecting the run on offsets and handed over as a slice of the run's own messages. No Python statement
        runs per record (but the stamp test of a stamped epoch's comprehension): the records are made only if
        the job function asks for them (:class:`Records`; 1.38 us a record made one at a time, 0.96 with a
        comprehension, none for a batch function that reads columns)."""
        n = len(run)
        if run[-1].offset() - run[0].offset() < n - 1:  # type: ignore[operator]
            self._take_each(part, run, out, stashed)
            return
        subject, partition, segs = part.subject, part.partition, part.segments
        k = 0
        while k < n:
            o: int = run[k].offset()  # type: ignore[assignment]
            if part.paused and not stashed:  # fetched past the bound: kept for the next epochs
                self._stash_from(part, run, k)
                return
            seen = part.pos
            if o < seen:  # type: ignore[operator]
                k = bisect_left(run, seen, k, key=_offset)  # read already
                continue
            if o >= part.bound:
                if stashed:
                    return  # not served: the stash is served only below the bound
                self._stop_at_bound(part)
                continue
            if self.mode == "at_least_once":  # unbounded, unfiltered
                self._take_all(part, run[k:] if k else run, out)
                return
            while segs and o >= segs[0][2]:
                segs.popleft()
            if not segs or o < segs[0][1]:  # offsets no loaded epoch holds, up to the next one's
                k = bisect_left(run, min(segs[0][1], part.bound) if segs else part.bound, k, key=_offset)
                part.pos = run[k - 1].offset() + 1  # type: ignore[operator]
                continue
            epoch, seg_start, seg_end, stamp, sl = segs[0]
            if stamp is not None and seen <= seg_start and sl.only_committed_from(o):
                stamp = None  # the rest of the range is the committed attempt's: no header to read
                segs[0] = (epoch, seg_start, seg_end, None, sl)
            cut = bisect_left(run, min(seg_end, part.bound), k, key=_offset)
            piece = run[k:cut] if k or cut < n else run
            if stamp is None:
                out.add(subject, partition, epoch, piece)
            else:  # another attempt's records may lie among them
                out.add(subject, partition, epoch, [
                    m for m in piece
                    if (h := m.headers()) is not None and (h[0][1] == stamp or stamp_of(h) == stamp)])  # type: ignore[index, arg-type]
            part.pos = run[cut - 1].offset() + 1  # type: ignore[operator]
            k = cut

    def _take_each(self, part: Part, run: list[Message], out: Records, stashed: bool) -> None:
        """Offsets repeat in ``run`` (never seen from librdkafka): bisecting needs them ascending."""
        for m in run:
            self._take_clean(part, [m], out, stashed)

    def _take_all(self, part: Part, run: list[Message], out: Records) -> None:
        """At least once: every record, unbounded and unfiltered."""
        subject, partition = part.subject, part.partition
        out.add(subject, partition, -1, run)
        part.pos = run[-1].offset() + 1  # type: ignore[operator]

    # ---- the stash ----------------------------------------------------------------------------

    def _stop_at_bound(self, part: Part) -> None:
        if not part.paused:
            part.paused = True
            part.fetch_at = part.bound
            self._fetch_ahead(part)
        part.pos = part.bound

    def _fetch_ahead(self, part: Part) -> None:
        """A paused partition fetches on, into the stash, while its subject's next epoch is committed already
        and its slices are at hand (prefetched by the worker: no ZooKeeper read here), so a job catching up
        meets no fetch round trip at each epoch's end; the stash is capped. Otherwise it is unassigned:
        caught up, it sends no fetch at all. Unassigned rather than paused + seek: librdkafka delays the
        first fetch after a seek on a paused partition by about a second; a fresh assignment fetches at once."""
        more = (len(part.stash) < STASH_RECORDS
                and self.ledger.cached(part.subject, self.inputs[part.subject].next_load) is not None)
        if more:
            self._assign(part)
        else:
            self._unassign(part)

    def _stash_from(self, part: Part, run: list[Message], k: int) -> None:
        """Keep what ``run`` holds from ``k`` on past what the stash holds (fetched past the bound) for the next
        epochs; at the cap, fetch no more."""
        k = bisect_left(run, part.fetch_at, k, key=_offset)
        if k < len(run):
            part.stash += run[k:] if k else run
            part.fetch_at = run[-1].offset() + 1  # type: ignore[operator]
            if len(part.stash) >= STASH_RECORDS:
                self._unassign(part)

    def _resume(self, part: Part, out: Records) -> None:
        """The bound moved: serve the stash first, then read on after it."""
        stash, bound = part.stash, part.bound
        served = bisect_left(stash, bound, key=_offset)  # offsets ascend
        if served:  # the records handed over keep their messages: the stash gives them up, not a copy of them
            if served < len(stash):
                self._take_clean(part, stash[:served], out, stashed=True)
                del stash[:served]
            else:
                part.stash = []
                self._take_clean(part, stash, out, stashed=True)
        part.pos = part.bound if part.stash else min(max(part.pos or 0, part.fetch_at), part.bound)
        if part.stash or part.pos >= part.bound:  # the next record lies past the new bound too
            self._fetch_ahead(part)
        else:
            self._assign(part)
            part.paused = False

    def _settle(self, touched: bool) -> None:
        """Advance positions over offsets that hold no record (commit markers, aborted data)."""
        active = [p for p in self.parts.values() if p.pos is not None and p.pos < p.bound and not p.paused]
        if active:
            positions = self.consumer.position([TopicPartition(p.topic, p.partition) for p in active])
            for part, tp in zip(active, positions, strict=True):
                if tp.offset >= 0 and tp.offset > (part.pos or 0):
                    part.pos = min(tp.offset, part.bound)
                if part.pos is not None and part.pos >= part.bound and self.mode != "at_least_once":
                    self._stop_at_bound(part)
        if touched or active:
            self.positions.advance_consumed()
