"""The watchdog word: a component that makes no progress on a partition while it has data to read says so
once, names the partition and the likely cause, and says so again when it moves.

Nothing here decides that data is lost or gives up: a stall is reported and waited out. The gauge
``aligner_fetch_stalled_seconds`` carries the same news to Prometheus (0 while the partition moves).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import Gauge

log = logging.getLogger(__name__)

STALLED = Gauge(
    "aligner_fetch_stalled_seconds",
    "Seconds a component has read nothing from a partition that has data for it (0 while it moves)",
    ["component", "topic", "partition"],
)

WARN_AFTER = 10.0
"""Seconds without progress, with data to read, before a component warns."""

CRAWL_RECORDS_PER_S = 1000
"""Below this many records a second, with data to read and most polls empty, a consumer's fetches are cut
short by the broker (a crawl): its fetch wait is raised as for a stall."""


SHORT_POLL_RECORDS = 100
"""Fewer records than this per poll, on average, while a backlog waits: the polls are cut short."""


def crawling(polls: int, empty_polls: int, records: int, seconds: float, lag: int) -> bool:
    """Whether a consumer crawled over the last ``seconds``: its polls came back short (most of them empty,
    or under :data:`SHORT_POLL_RECORDS` records each on average) and it got fewer than
    :data:`CRAWL_RECORDS_PER_S` records a second, and under half of the ``lag`` there was to read when the
    interval began (a slow input read as it comes, or a busy machine's few full polls, is no crawl). The
    embedded broker answers a short fetch wait on a partition of many batches with a batch or two per fetch,
    which never looks like a stall: the source and the reader both raise their wait on this rule."""
    short = 2 * empty_polls >= max(1, polls) or records < SHORT_POLL_RECORDS * polls
    return short and records < min(CRAWL_RECORDS_PER_S * seconds, lag / 2)


class CrawlWindow:
    """One consumer's polls since a window began, judged whole by :func:`crawling` once the window lasts the
    fetch wait's escalation delay: a crawl's rate swings from one second to the next (1 to 3,000 records at a
    40 ms wait on the embedded broker), and a judgement per second kept starting over."""

    def __init__(self, now: float, lag: int = 0) -> None:
        self.restart(now, lag)

    def restart(self, now: float, lag: int) -> None:
        """A new window from ``now``, with ``lag`` records to read when it begins."""
        self.polls = self.empty_polls = self.records = 0
        self.began, self.lag = now, lag

    def polled(self, records: int) -> None:
        self.polls += 1
        self.empty_polls += records == 0
        self.records += records

    def due(self, now: float, length: float) -> bool:
        """The window lasted ``length`` seconds: time to :meth:`judge` it."""
        return now - self.began >= length

    def judge(self, now: float, lag: int) -> bool:
        """Whether the window crawled; a new one begins with ``lag`` records to read."""
        crawled = crawling(self.polls, self.empty_polls, self.records, now - self.began, self.lag)
        self.restart(now, lag)
        return crawled


class Stall:
    """Progress of one component on one partition: ``moved`` on progress, ``report`` while stuck."""

    def __init__(self, component: str, topic: str, partition: int, warn_after: float = WARN_AFTER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.component, self.topic, self.partition = component, topic, partition
        self.warn_after = warn_after
        self._clock = clock
        self.since = clock()
        """When the partition last moved (or the watch started)."""
        self.warned = False
        self.empty_polls = 0
        """Polls that returned nothing for this partition since it last moved."""
        self.cause: str | None = None
        """The reported stall's cause while it lasts (for status reports), else None."""
        self._gauge = STALLED.labels(component, topic, str(partition))

    @property
    def name(self) -> str:
        return f"{self.topic}[{self.partition}]"

    def idle(self) -> float:
        """Seconds since the partition last moved."""
        return self._clock() - self.since

    def moved(self) -> None:
        if self.warned:
            log.warning("%s: %s moves again after %.0fs", self.component, self.name, self.idle())
            self.warned = False
            self._gauge.set(0)
        self.cause = None
        self.since = self._clock()
        self.empty_polls = 0

    def polled_empty(self) -> None:
        self.empty_polls += 1

    def report(self, position: int | None, wanted: str, cause: str) -> bool:
        """Warn once the stall is long enough (True when it did just now); keeps the gauge current."""
        idle = self.idle()
        if idle < self.warn_after:
            return False
        self._gauge.set(idle)
        self.cause = cause
        if self.warned:
            return False
        self.warned = True
        at = "no position yet" if position is None or position < 0 else f"offset {position}"
        log.warning("%s: no progress reading %s for %.0fs at %s (%s; %d polls came back empty): %s; "
                    "still waiting", self.component, self.name, idle, at, wanted, self.empty_polls, cause)
        return True

    def close(self) -> None:
        self._gauge.set(0)
