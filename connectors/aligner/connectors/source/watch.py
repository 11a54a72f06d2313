"""A source's watchdog: it looks once a second, from the source's poll.

A partition with data to read that has not moved for a while is reported (once, and again when it moves)
and, when the broker answers but fetches come back empty or crawl, the fetch reads on with a consumer that
waits longer per fetch. The source never gives up on a slow broker.
"""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition

from aligner.connectors.kafka import MAX_FETCH_WAIT_MS, escalate_after, probe, stall_cause
from aligner.connectors.source.fetch import SourceFetch
from aligner.connectors.source.positions import UNBOUNDED, Part
from aligner.connectors.watchdog import Stall


class SourceWatchdog:
    """Stall detection over the fetch's partitions; the fetch's consumer is replaced here when it is too hasty."""

    def __init__(self, name: str, fetch: SourceFetch) -> None:
        self.name = name
        self.fetch = fetch
        self.parts = fetch.parts
        self._crawl = fetch.crawl
        self._stalls: dict[tuple[str, int], tuple[Stall, int | None]] = {}
        self._watched = self._assigned = self._crawl.began

    def close(self) -> None:
        for stall, _pos in self._stalls.values():
            stall.close()

    def stalled(self) -> dict[str, tuple[float, str]]:
        """Partitions reported stalled now: "topic[partition]" -> (seconds without progress, cause)."""
        return {stall.name: (stall.idle(), stall.cause) for stall, _pos in self._stalls.values()
                if stall.cause is not None}

    def _lag_of(self, part: Part) -> int:
        """Records this source may read now on a partition it waits for data on (a guess when unknown)."""
        if part.bound < UNBOUNDED:
            return part.bound - (part.pos or 0)
        tp = TopicPartition(part.topic, part.partition)
        _low, high = self.fetch.consumer.get_watermark_offsets(tp, cached=True)
        return high - (part.pos or 0) if high >= 0 else 0

    def _waiting_for_data(self, part: Part) -> bool:
        """The partition has data this source should be reading (not merely an open end)."""
        if part.pos is None or part.paused or part.pos >= part.bound:
            return False
        if part.bound < UNBOUNDED:
            return True  # committed epochs name the offsets up to the bound
        tp = TopicPartition(part.topic, part.partition)
        _low, high = self.fetch.consumer.get_watermark_offsets(tp, cached=True)
        return high < 0 or high > part.pos  # unknown: no fetch of it was ever answered, which is the stall itself

    def watch(self) -> None:
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
        wait = self.fetch.fetching.wait_ms
        stuck, lagging, idle = self._look()
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
        answered = fetched or probe(self.fetch.consumer, lagging[0].topic, lagging[0].partition) is not None
        raised = None
        if answered and slow and now - self._assigned >= escalate_after(wait) and wait < MAX_FETCH_WAIT_MS:
            raised = self.fetch.reopen()
            self._assigned = time.monotonic()
            self._crawl.restart(now, self._crawl.lag)
        for part, stall in stuck:
            stall.report(part.pos, f"wants offsets up to {part.bound if part.bound < UNBOUNDED else 'the end'}",
                         stall_cause(answered, wait, raised))

    def _look(self) -> tuple[list[tuple[Part, Stall]], list[Part], float]:
        """Each partition's progress since the last look: the stuck ones with their stalls, the ones with data
        to read, and the longest any of those has not moved."""
        stuck: list[tuple[Part, Stall]] = []
        lagging: list[Part] = []
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
        return stuck, lagging, idle
