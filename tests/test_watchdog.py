"""The crawl rule the source and the reader share (``aligner.connectors.watchdog.crawling``)."""

from __future__ import annotations

from aligner.connectors.watchdog import CRAWL_RECORDS_PER_S, crawling


def test_a_batch_or_two_per_fetch_from_a_long_backlog_is_a_crawl() -> None:
    # The embedded broker at a 10 ms wait on a partition of 60k batches: one record every few polls.
    assert crawling(polls=20, empty_polls=14, records=7, seconds=1.0, lag=53_000)
    # At a 40 ms wait (test_slow_broker, 2026-11-28): most polls bring a few dozen records, ~800 a second.
    assert crawling(polls=40, empty_polls=14, records=1_600, seconds=2.0, lag=50_000)


def test_reading_what_there_is_is_no_crawl() -> None:
    assert not crawling(polls=20, empty_polls=14, records=7, seconds=1.0, lag=10)  # a slow input, read as it comes
    assert not crawling(polls=20, empty_polls=14, records=CRAWL_RECORDS_PER_S, seconds=1.0, lag=53_000)
    assert not crawling(polls=2, empty_polls=0, records=800, seconds=1.0, lag=53_000)  # a busy machine's full polls
    assert not crawling(polls=0, empty_polls=0, records=0, seconds=1.0, lag=0)
