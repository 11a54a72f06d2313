"""The "hotness" of pull requests (thesis 6.1.1): seeded generators and the expected results.

Four streams, each a pure function of (seed, stream, offset), so a rerun or a recovered generator
writes the same records and the expected output of both jobs can be computed without reading Kafka:

- ``issues`` and ``pull-requests``: item ``i`` is created at logical event time ``i / item_rate``.
  Pull request ``i`` fixes issue ``i``.
- ``issue-comments`` and ``pr-comments``: comment ``n`` is at logical event time ``n / comment_rate``
  and targets an item already created at that time, ``Pareto`` many items back from the newest, so
  most comments land on recent items and find their join partner in the current window.

Every record carries ``et`` (logical event time, seconds; windows use it, so results are
deterministic) and ``ts`` (wall-clock creation time; latency is measured against it).
Issue-comment and issue records are keyed by issue, pull-request and PR-comment records by
pull request, so a job's keyed state sees every record of a key in one partition, in order.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ISSUES, ISSUE_COMMENTS, PULL_REQUESTS, PR_COMMENTS = "issues", "issue-comments", "pull-requests", "pr-comments"
STREAMS = (ISSUES, ISSUE_COMMENTS, PULL_REQUESTS, PR_COMMENTS)
HOT_ISSUES, PR_HOTNESS = "hot-issues", "pr-hotness"


@dataclass(frozen=True)
class Workload:
    seed: int = 7
    comment_rate: float = 400.0
    """Comments per second, per comment stream (issue comments and PR comments each)."""
    item_rate: float = 10.0
    """Issues per second and pull requests per second."""
    pareto_alpha: float = 1.5
    pareto_scale: float = 2.0
    """A comment targets the newest item minus ``floor(scale * (Pareto(alpha) - 1))``."""
    window: float = 8.0
    """Tumbling window of job 1's comment counts, logical seconds (the thesis's 8 s)."""
    hot_threshold: int = 3
    """An issue is hot from its ``hot_threshold``-th comment within a window."""

    def rate(self, stream: str) -> float:
        return self.item_rate if stream in (ISSUES, PULL_REQUESTS) else self.comment_rate

    def record(self, stream: str, n: int) -> tuple[str, dict[str, Any]]:
        """Record ``n`` of ``stream`` as (key, value) without ``ts``: the same for any run."""
        et = n / self.rate(stream)
        if stream in (ISSUES, PULL_REQUESTS):
            item = {"id": n, "et": et}
            if stream == ISSUES:
                return str(n), {**item, "title": f"issue {n}", "pr": n}
            return str(n), {**item, "issue": n}
        rng = random.Random(f"{self.seed}/{stream}/{n}")
        newest = max(0, int(et * self.item_rate))  # item 0 exists from the start
        back = int(self.pareto_scale * (rng.paretovariate(self.pareto_alpha) - 1.0))
        target = max(0, newest - back)
        if stream == ISSUE_COMMENTS:
            return str(target), {"id": n, "issue": target, "et": et}
        return str(target), {"id": n, "pr": target, "et": et}

    def records(self, stream: str, count: int) -> Iterator[tuple[str, dict[str, Any]]]:
        for n in range(count):
            yield self.record(stream, n)

    # ---- what the jobs must produce ----------------------------------------------------------

    def hot_comments(self, issue_comments: int) -> dict[int, dict[str, Any]]:
        """Job 1's output: issue comment id -> its hot-issue record (issue, pr, window, count)."""
        windows: dict[int, tuple[int, int]] = {}
        out: dict[int, dict[str, Any]] = {}
        for _key, c in self.records(ISSUE_COMMENTS, issue_comments):
            count = window_count(windows, c["issue"], c["et"], self.window)
            if count >= self.hot_threshold:
                out[c["id"]] = {"issue": c["issue"], "pr": c["issue"], "window": int(c["et"] // self.window),
                                "count": count}
        return out

    def pr_totals(self, issue_comments: int, pr_comments: int) -> dict[int, tuple[int, int]]:
        """Job 2's final result: pull request -> (PR comments, hot-issue comments of its issue)."""
        comments = Counter(c["pr"] for _k, c in self.records(PR_COMMENTS, pr_comments))
        hot = Counter(h["pr"] for h in self.hot_comments(issue_comments).values())
        return {pr: (comments[pr], hot[pr]) for pr in sorted(set(comments) | set(hot))}


def window_count(windows: dict[int, tuple[int, int]], issue: int, et: float, window: float) -> int:
    """Count one comment into its issue's tumbling window; the count so far in that window."""
    w = int(et // window)
    last_w, n = windows.get(issue, (w, 0))
    n = n + 1 if last_w == w else 1
    windows[issue] = (w, n)
    return n


class Pacer:
    """Wall-clock pacing of a stream: record ``n`` is due ``n / rate`` seconds after the start."""

    def __init__(self, rate: float, start: float | None = None) -> None:
        self.rate = rate
        self.start = time.time() if start is None else start

    def due(self, now: float | None = None) -> int:
        """How many records are due by ``now``: record ``n`` from ``n / rate`` on, so an item is
        always written no later than the comments on it."""
        return int(((time.time() if now is None else now) - self.start) * self.rate) + 1
