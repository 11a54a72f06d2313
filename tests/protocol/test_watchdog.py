"""The crawl rule the source and the reader share (``aligner.connectors.watchdog.crawling``, ``CrawlWindow``)."""

from __future__ import annotations

from aligner.connectors.watchdog import CRAWL_RECORDS_PER_S, CrawlWindow, crawling


def test_a_batch_or_two_per_fetch_from_a_long_backlog_is_a_crawl() -> None:
    # The embedded broker at a 10 ms wait on a partition of 60k batches: one record every few polls.
    assert crawling(polls=20, empty_polls=14, records=7, seconds=1.0, lag=53_000)
    # At a 40 ms wait (test_slow_broker): most polls bring a few dozen records, ~800 a second.
    assert crawling(polls=40, empty_polls=14, records=1_600, seconds=2.0, lag=50_000)


def test_reading_what_there_is_is_no_crawl() -> None:
    assert not crawling(polls=20, empty_polls=14, records=7, seconds=1.0, lag=10)  # a slow input, read as it comes
    assert not crawling(polls=20, empty_polls=14, records=CRAWL_RECORDS_PER_S, seconds=1.0, lag=53_000)
    assert not crawling(polls=2, empty_polls=0, records=800, seconds=1.0, lag=53_000)  # a busy machine's full polls
    assert not crawling(polls=0, empty_polls=0, records=0, seconds=1.0, lag=0)


def test_a_crawl_window_is_judged_whole_so_a_good_second_does_not_hide_it() -> None:
    # A 40 ms wait's crawl, second by second: thousands of records, then seconds of a few (test_slow_broker).
    window = CrawlWindow(0.0, lag=50_000)
    seconds = [[2_500] + [0] * 19, [1] * 5 + [0] * 15, [0] * 20]
    assert not crawling(20, 19, 2_500, 1.0, 50_000)  # judged alone, the good second started the clock over
    for second, polls in enumerate(seconds):
        for n in polls:
            window.polled(n)
        assert window.due(second + 1.0, 3.0) == (second == 2)
    assert window.judge(3.0, lag=47_000)
    assert (window.polls, window.records, window.began, window.lag) == (0, 0, 3.0, 47_000)
    for _ in range(20):
        window.polled(500)  # full polls again
    assert not window.judge(4.0, lag=37_000)
