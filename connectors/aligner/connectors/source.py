"""Kafka source of a job: one consumer's partitions of every input subject.

The source follows the subjects' committed epochs: it loads each committed epoch's slices, hands
over records up to the end of the last loaded epoch (never further) and keeps a record only when
its stamp is the committed attempt (its header is not even read where the slice's record count
shows that nothing else lies in the rest of the range). Past the last loaded epoch it fetches only
into a capped stash, and only while the next epoch is committed already (a job catching up).
A load limit per subject is how alignment works: a consumer that must end a job epoch exactly at
subject epoch k loads nothing past k and checkpoints once its position reaches k's end on every
partition. In at-least-once mode the source reads whatever Kafka shows, unbounded and unfiltered.

A watchdog looks once a second: a partition with data to read that has not moved for a while is
reported (once, and again when it moves) and, when the broker answers but fetches come back empty,
read on with a consumer that waits longer per fetch. The source never gives up on a slow broker.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import methodcaller
from typing import NamedTuple

from confluent_kafka import KafkaError, Message, TopicPartition

from aligner.connectors.kafka import (
    MAX_FETCH_WAIT_MS,
    FetchingConsumer,
    end_offsets,
    escalate_after,
    probe,
    stall_cause,
)
from aligner.connectors.watchdog import CrawlWindow, Stall
from aligner.epochs import CommittedEpoch, check_retention
from aligner.errors import DataLossError, EpochNotCommittedError
from aligner.ledger import Ledger
from aligner.models import Mode
from aligner.stamps import stamp_of

UNBOUNDED = 1 << 62

SOURCE_FETCH_WAIT_MS = 100
"""A source's first fetch wait: shorter than readers' (FETCH_WAIT_MS), because librdkafka keeps one
fetch per broker in flight, and the fetch a source sends as it reaches an epoch's end holds back the
next epoch's first fetch for up to this long. Bounded sources unassign a partition at its bound, so
caught up they send no fetches at all; an at-least-once source caught up costs the broker ~0.5 % of a
core at 100 ms (bench_fetch). A broker too slow for it gets a longer wait from the watchdog."""

_offset = methodcaller("offset")
_error = methodcaller("error")

_DATA_LOST = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})
"""Fetch errors meaning the log no longer holds what a committed epoch names; others are transient."""


class SourceRecord(NamedTuple):
    """One record handed to a job function, read-only. A named tuple, built in the source's hot path with
    ``tuple.__new__`` from one tuple: 0.31 us per record where a slots dataclass took 0.58 and a frozen one
    ~1.1."""

    subject: str
    partition: int
    offset: int
    epoch: int
    key: bytes | None
    value: bytes | None
    timestamp: int


_new_record = tuple.__new__
"""``_new_record(SourceRecord, (subject, partition, offset, epoch, key, value, timestamp))``: what
``SourceRecord(...)`` makes, without its Python-level ``__new__``."""


@dataclass
class _Part:
    subject: str
    topic: str
    partition: int
    pos: int | None = None
    bound: int = 0
    segments: deque = field(default_factory=deque)  # (epoch, start, end, stamp or None once unneeded, Slice)
    paused: bool = False
    """Stopped at its bound; ``stash`` holds records fetched past it, ``fetch_at`` follows them."""
    stash: list = field(default_factory=list)
    fetch_at: int = 0
    fetching: bool = False
    """Assigned in the consumer. A paused partition fetches on, into the stash, while its subject's next
    epoch is committed already (see ``SubjectSource._fetch_ahead``)."""


@dataclass
class _Input:
    subject: str
    topic: str
    partitions: list[int]
    next_load: int
    limit: int | None = None
    loaded: deque = field(default_factory=deque)  # CommittedEpoch, oldest first
    consumed: int = -1
    frontier: int | None = None
    """The subject's frontier as the last ``load`` found it (the epoch before the first uncommitted one:
    committed epochs are a prefix); None when a limit stopped that load first."""


STASH_RECORDS = 20_000
"""Records a partition paused at its bound keeps fetched ahead before it stops fetching (about 2 MB of 100-byte
records; the fetch that reaches it is kept whole)."""


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


class SubjectSource:
    def __init__(self, ledger: Ledger, bootstrap: str, assignment: Mapping[str, Sequence[int]],
                 mode: Mode = "exactly_once", name: str | None = None) -> None:
        self.ledger = ledger
        self.bootstrap = bootstrap
        self.mode = mode
        self.name = name or f"source of {', '.join(assignment)}"
        self._fetching = FetchingConsumer(bootstrap, source_settings(mode), SOURCE_FETCH_WAIT_MS)
        self._consumer = self._fetching.consumer
        self._stalls: dict[tuple[str, int], tuple[Stall, int | None]] = {}
        self._watched = self._assigned = time.monotonic()
        self._crawl = CrawlWindow(self._watched)
        """Polls of a readable source, for the crawl rule; lag is what the lagging partitions had to read."""
        self.inputs: dict[str, _Input] = {}
        self.parts: dict[tuple[str, int], _Part] = {}
        self._by_topic: dict[tuple[str, int], _Part] = {}
        for subject, partitions in assignment.items():
            topic = ledger.subjects.subject(subject).topic
            first = ledger.subjects.first_epoch(subject)
            self.inputs[subject] = _Input(subject, topic, list(partitions), first if first is not None else 0)
            for p in partitions:
                part = _Part(subject, topic, p)
                self.parts[(subject, p)] = part
                self._by_topic[(topic, p)] = part

    def close(self) -> None:
        for stall, _pos in self._stalls.values():
            stall.close()
        self._fetching.close()

    # ---- positions ----------------------------------------------------------------------------

    def restore(self, offsets: Mapping[str, Mapping[int, int]], load_from: Mapping[str, int]) -> None:
        """Resume from a committed job epoch: positions and the first epoch still to consume."""
        for subject, inp in self.inputs.items():
            inp.next_load = load_from.get(subject, inp.next_load)
            inp.consumed = inp.next_load - 1
            assign = []
            for p, off in offsets.get(subject, {}).items():
                if (subject, p) in self.parts:
                    self.parts[(subject, p)].pos = off
                    self.parts[(subject, p)].fetching = True
                    assign.append(TopicPartition(inp.topic, p, off))
            if assign:
                self._consumer.incremental_assign(assign)

    def offsets(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {s: {} for s in self.inputs}
        for part in self.parts.values():
            if part.pos is not None:
                out[part.subject][part.partition] = part.pos
        return out

    def load_from(self) -> dict[str, int]:
        return {s: inp.consumed + 1 for s, inp in self.inputs.items()}

    def consumed(self, subject: str) -> int:
        """Last subject epoch this consumer has fully consumed on all of its partitions."""
        return self.inputs[subject].consumed

    def set_limit(self, subject: str, last_epoch: int | None) -> None:
        """Load no subject epoch after ``last_epoch`` (None: no limit)."""
        self.inputs[subject].limit = last_epoch

    def next_load(self, subject: str) -> int:
        """The next subject epoch this consumer will load once it commits (it may have read anything before)."""
        return self.inputs[subject].next_load

    # ---- loading committed epochs ---------------------------------------------------------------

    def load(self) -> int:
        """Load newly committed epochs (up to the limits); returns how many were loaded."""
        loaded = 0
        for inp in self.inputs.values():
            inp.frontier = None
            while inp.limit is None or inp.next_load <= inp.limit:
                try:
                    committed = self.ledger.epochs.committed_if(inp.subject, inp.next_load)
                except EpochNotCommittedError:  # not even created yet
                    committed = None
                if committed is None:
                    inp.frontier = inp.next_load - 1 if inp.next_load > 0 else None
                    break
                self._add(inp, committed)
                inp.next_load += 1
                loaded += 1
        self._advance_consumed()
        return loaded

    def _add(self, inp: _Input, ce: CommittedEpoch) -> None:
        inp.loaded.append(ce)
        new_assign = []
        starting = [p for p in inp.partitions if p in ce.slices and self.parts[(inp.subject, p)].pos is None]
        log_starts = end_offsets(self.bootstrap, inp.topic, starting, earliest=True) if starting else {}
        for p in inp.partitions:
            sl = ce.slices.get(p)
            if sl is None:
                continue
            part = self.parts[(inp.subject, p)]
            if part.pos is None:
                part.pos = sl.start
                part.fetching = True
                check_retention(inp.subject, ce.epoch, p, sl.start, log_starts[p])
                new_assign.append(TopicPartition(inp.topic, p, sl.start))
            if not sl.empty and sl.end > part.pos and self.mode != "at_least_once":  # it reads unfiltered
                part.segments.append((ce.epoch, sl.start, sl.end, sl.stamp, sl))
            part.bound = UNBOUNDED if self.mode == "at_least_once" else max(part.bound, sl.end)
        if new_assign:
            self._consumer.incremental_assign(new_assign)

    def _advance_consumed(self) -> None:
        for inp in self.inputs.values():
            while inp.loaded:
                ce = inp.loaded[0]
                done = all(
                    self.parts[(inp.subject, p)].pos is not None and self.parts[(inp.subject, p)].pos >= sl.end
                    for p, sl in ce.slices.items() if (inp.subject, p) in self.parts
                )
                if not done:
                    break
                inp.loaded.popleft()
                inp.consumed = ce.epoch

    def readable(self) -> bool:
        """Whether any partition still has loaded data to read."""
        return any(p.pos is not None and p.pos < p.bound for p in self.parts.values())

    def caught_up(self) -> bool:
        """Every loaded epoch fully consumed: nothing to read until the next epoch commits."""
        return all(not inp.loaded for inp in self.inputs.values())

    def second_last_ahead(self) -> bool:
        """Thesis 5.6 Ready test: at or past the second-last committed epoch of every subject."""
        for subject, inp in self.inputs.items():
            # What the last load found (it ran within this epoch) saves listing the subject's epochs each epoch.
            frontier = inp.frontier if inp.frontier is not None else self.ledger.epochs.frontier(subject)
            if frontier is not None and frontier >= 1 and inp.consumed < frontier - 1:
                return False
        return True

    # ---- reading ------------------------------------------------------------------------------

    def poll(self, timeout: float = 0.005, max_records: int = 10000) -> list[SourceRecord]:
        """Kept records of loaded epochs, in offset order per partition."""
        out: list[SourceRecord] = []
        touched = False
        for waiting in self.parts.values():
            if waiting.paused and waiting.pos is not None and waiting.pos < waiting.bound:
                self._resume(waiting, out)
                touched = True
        if self.readable():
            messages = self._consumer.consume(max_records, timeout=timeout)
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
            self._crawl.polled(n - errors)
        self._settle(touched)
        self._watch()
        return out

    def _take(self, part: _Part, run: list[Message], out: list[SourceRecord]) -> int:
        """Keep what ``run``, fetched from ``part`` in offset order, holds for loaded epochs; stash what lies past
        the bound. Error events (end of partition, a broker outage or a slow fetch: librdkafka retries by itself)
        split it into clean runs. Returns how many messages were errors."""
        if not any(map(_error, run)):  # an error (even code 0) is truthy
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

    def _take_clean(self, part: _Part, run: list[Message], out: list[SourceRecord], stashed: bool = False) -> None:
        """``_take`` for a run without errors (``stashed``: served from the stash, all below the bound), a piece
        at a time: each piece (one epoch's records, those past the bound, those read already) is found by
        bisecting the run on offsets and kept with one comprehension or one list extension. The source's per-
        record hot path: no Python statement runs per record but the comprehension's (1.38 us per record
        one at a time, 0.96 with a comprehension; stashing one at a time was 13 % of the source's time)."""
        n = len(run)
        if run[-1].offset() - run[0].offset() < n - 1:  # type: ignore[operator]
            for m in run:  # offsets repeat (never seen from librdkafka): bisecting needs them ascending
                self._take_clean(part, [m], out, stashed)
            return
        subject, partition, segs = part.subject, part.partition, part.segments
        k = 0
        while k < n:
            o: int = run[k].offset()  # type: ignore[assignment]
            if part.paused and not stashed:  # fetched past the bound: kept for the next epochs
                k = bisect_left(run, part.fetch_at, k, key=_offset)
                if k < n:
                    self._stash(part, run[k:] if k else run)
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
                out += [_new_record(SourceRecord, (subject, partition, m.offset(), -1, m.key(), m.value(),
                                                     m.timestamp()[1])) for m in (run[k:] if k else run)]
                part.pos = run[-1].offset() + 1  # type: ignore[operator]
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
                out += [_new_record(SourceRecord, (subject, partition, m.offset(), epoch, m.key(), m.value(),
                                                     m.timestamp()[1])) for m in piece]
            else:  # another attempt's records may lie among them
                out += [_new_record(SourceRecord, (subject, partition, m.offset(), epoch, m.key(), m.value(),
                                                     m.timestamp()[1])) for m in piece
                        if (h := m.headers()) is not None and (h[0][1] == stamp or stamp_of(h) == stamp)]  # type: ignore[index, arg-type]
            part.pos = run[cut - 1].offset() + 1  # type: ignore[operator]
            k = cut

    def _stop_at_bound(self, part: _Part) -> None:
        if not part.paused:
            part.paused = True
            part.fetch_at = part.bound
            self._fetch_ahead(part)
        part.pos = part.bound

    def _fetch_ahead(self, part: _Part) -> None:
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

    def _assign(self, part: _Part) -> None:
        """Fetch ``part`` from ``fetch_at`` on (once)."""
        if not part.fetching:
            self._consumer.incremental_assign([TopicPartition(part.topic, part.partition, part.fetch_at)])
            part.fetching = True

    def _unassign(self, part: _Part) -> None:
        if part.fetching:
            self._consumer.incremental_unassign([TopicPartition(part.topic, part.partition)])
            part.fetching = False

    def _stash(self, part: _Part, run: list[Message]) -> None:
        """Keep ``run`` (ascending, past what the stash holds) for the next epochs; at the cap, fetch no more."""
        part.stash += run
        part.fetch_at = run[-1].offset() + 1  # type: ignore[operator]
        if len(part.stash) >= STASH_RECORDS:
            self._unassign(part)

    def _resume(self, part: _Part, out: list[SourceRecord]) -> None:
        """The bound moved: serve the stash first, then read on after it."""
        stash, bound = part.stash, part.bound
        served = bisect_left(stash, bound, key=_offset)  # offsets ascend
        if served:
            self._take_clean(part, stash[:served] if served < len(stash) else stash, out, stashed=True)
            del stash[:served]
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
            positions = self._consumer.position([TopicPartition(p.topic, p.partition) for p in active])
            for part, tp in zip(active, positions, strict=True):
                if tp.offset >= 0 and tp.offset > (part.pos or 0):
                    part.pos = min(tp.offset, part.bound)
                if part.pos is not None and part.pos >= part.bound and self.mode != "at_least_once":
                    self._stop_at_bound(part)
        if touched or active:
            self._advance_consumed()

    # ---- the watchdog -------------------------------------------------------------------------

    def _lag_of(self, part: _Part) -> int:
        """Records this source may read now on a partition it waits for data on (a guess when unknown)."""
        if part.bound < UNBOUNDED:
            return part.bound - (part.pos or 0)
        _low, high = self._consumer.get_watermark_offsets(TopicPartition(part.topic, part.partition), cached=True)
        return high - (part.pos or 0) if high >= 0 else 0

    def _waiting_for_data(self, part: _Part) -> bool:
        """The partition has data this source should be reading (not merely an open end)."""
        if part.pos is None or part.paused or part.pos >= part.bound:
            return False
        if part.bound < UNBOUNDED:
            return True  # committed epochs name the offsets up to the bound
        _low, high = self._consumer.get_watermark_offsets(TopicPartition(part.topic, part.partition), cached=True)
        return high < 0 or high > part.pos  # unknown: no fetch of it was ever answered, which is the stall itself

    def _watch(self) -> None:
        """Once a second: report partitions that stopped moving with data to read; a broker that
        answers but keeps fetches short of the data (nothing, or a crawl) gets a longer fetch wait."""
        now = time.monotonic()
        if now - self._watched < 1.0:
            return
        gap, self._watched = now - self._watched, now
        if gap > 3.0:  # not polled meanwhile (the worker was busy elsewhere): a stall counts from now
            for stall, _seen in self._stalls.values():
                stall.moved()
            self._crawl.restart(now, 0)
        wait = self._fetching.wait_ms
        stuck: list[tuple[_Part, Stall]] = []
        lagging: list[_Part] = []
        idle = 0.0
        for key, part in self.parts.items():
            stall, seen = self._stalls.get(key) or (Stall(self.name, part.topic, part.partition), None)
            waiting = self._waiting_for_data(part)
            if part.pos != seen or not waiting:
                stall.moved()
            else:
                idle = max(idle, stall.idle())
                if stall.idle() >= stall.warn_after:
                    stuck.append((part, stall))
            lagging += [part] if waiting else []
            self._stalls[key] = (stall, part.pos)
        fetched = self._crawl.records > 0  # the broker answers fetches, whether or not the probe gets through
        starving = False
        if self._crawl.due(now, escalate_after(wait)):
            crawled = self._crawl.judge(now, sum(self._lag_of(p) for p in lagging))  # also starts the next window
            starving = crawled and bool(lagging)
        slow = starving or idle >= escalate_after(wait)
        if not (stuck or slow):
            return
        # The probe queues behind the consumer's fetch on its connection: once the wait passes its timeout, a crawl's
        # records are the evidence that the broker answers.
        answered = fetched or probe(self._consumer, lagging[0].topic, lagging[0].partition) is not None
        raised = None
        if answered and slow and now - self._assigned >= escalate_after(wait) and wait < MAX_FETCH_WAIT_MS:
            raised = self._reopen()
            self._crawl.restart(now, self._crawl.lag)
        for part, stall in stuck:
            stall.report(part.pos, f"wants offsets up to {part.bound if part.bound < UNBOUNDED else 'the end'}",
                         stall_cause(answered, wait, raised))

    def stalled(self) -> dict[str, tuple[float, str]]:
        """Partitions reported stalled now: "topic[partition]" -> (seconds without progress, cause)."""
        return {stall.name: (stall.idle(), stall.cause) for stall, _pos in self._stalls.values()
                if stall.cause is not None}

    def _reopen(self) -> int:
        """Read on with a consumer that waits longer per fetch, from where every partition stands."""
        wait = self._fetching.slower()
        self._consumer = self._fetching.consumer
        self._assigned = time.monotonic()
        for p in self.parts.values():
            p.fetching = p.pos is not None and not p.paused  # a paused one is assigned again when it resumes
        assign = [TopicPartition(p.topic, p.partition, p.pos) for p in self.parts.values()
                  if p.fetching and p.pos is not None]
        if assign:
            self._consumer.incremental_assign(assign)
        return wait
