"""The hotness workload and job 1, as pure functions: determinism, the join, the expected result."""

from __future__ import annotations

import json
from collections import Counter

from aligner.connectors.runtime.state import MemoryStore
from aligner.connectors.source import SourceRecord
from experiments.hotness import hot_issues
from experiments.workload import ISSUE_COMMENTS, ISSUES, PR_COMMENTS, Pacer, Workload


def test_records_are_a_function_of_seed_stream_and_offset():
    a, b, other = Workload(seed=1), Workload(seed=1), Workload(seed=2)
    assert list(a.records(ISSUE_COMMENTS, 500)) == list(b.records(ISSUE_COMMENTS, 500))
    assert list(a.records(ISSUE_COMMENTS, 500)) != list(other.records(ISSUE_COMMENTS, 500))
    assert a.record(PR_COMMENTS, 123) == b.record(PR_COMMENTS, 123)


def test_comments_target_existing_recent_items():
    w = Workload(comment_rate=200, item_rate=10)
    back: Counter[int] = Counter()
    for key, c in w.records(ISSUE_COMMENTS, 20_000):
        newest = int(c["et"] * w.item_rate)
        assert 0 <= c["issue"] <= newest, "a comment may only target an issue created before it"
        assert key == str(c["issue"])
        back[min(newest - c["issue"], 10)] += 1
    # Pareto: most comments go to the newest few items, a long tail to older ones.
    assert back[0] + back[1] > 0.5 * 20_000
    assert back[10] > 0


def test_pacer_writes_an_item_no_later_than_comments_on_it():
    w = Workload(comment_rate=200, item_rate=10)
    items, comments = Pacer(w.item_rate, start=0.0), Pacer(w.comment_rate, start=0.0)
    for now in (0.0, 0.05, 0.1, 0.55, 1.0, 3.33):
        sent_comments = list(w.records(ISSUE_COMMENTS, comments.due(now)))
        assert all(c["issue"] < items.due(now) for _k, c in sent_comments)


def _record(subject: str, value: dict, offset: int) -> SourceRecord:
    return SourceRecord(subject, 0, offset, 0, None, json.dumps({**value, "ts": 1.0}).encode(), 0)


def _run(job, state, records):
    return [json.loads(v) for r in records for _k, v in job(r, state)]


def test_job1_emits_each_hot_comment_once_whatever_the_arrival_order():
    w = Workload(hot_threshold=2, window=8.0)
    comments = [_record(ISSUE_COMMENTS, {"id": n, "issue": 5, "et": 1.0 + n}, n) for n in range(4)]
    issue = _record(ISSUES, {"id": 5, "title": "issue 5", "pr": 5, "et": 0.5}, 0)
    late_issue = _run(hot_issues(w), MemoryStore(), [*comments, issue])
    early_issue = _run(hot_issues(w), MemoryStore(), [issue, *comments])
    # comments 1, 2, 3 are the 2nd..4th in window 0; the issue arriving late releases them in order
    assert [h["comment"] for h in late_issue] == [h["comment"] for h in early_issue] == [1, 2, 3]
    assert [h["count"] for h in early_issue] == [2, 3, 4]
    assert all(h["pr"] == 5 and h["v"] == 1 for h in late_issue)


def test_job1_counts_per_tumbling_window():
    w = Workload(hot_threshold=2, window=8.0)
    state = MemoryStore()
    job = hot_issues(w, version=2)
    _run(job, state, [_record(ISSUES, {"id": 1, "title": "i", "pr": 1, "et": 0.0}, 0)])
    out = _run(job, state, [_record(ISSUE_COMMENTS, {"id": n, "issue": 1, "et": et}, n)
                            for n, et in enumerate((1.0, 7.9, 8.0, 9.0, 9.5))])
    assert [(h["comment"], h["window"], h["count"], h["v"]) for h in out] == [(1, 0, 2, 2), (3, 1, 2, 2),
                                                                                (4, 1, 3, 2)]


def test_expected_result_matches_a_replay_of_job1():
    w = Workload(comment_rate=100, item_rate=5)
    state, job = MemoryStore(), hot_issues(w)
    records = [_record(ISSUES, v, n) for n, (_k, v) in enumerate(w.records(ISSUES, 60))]
    records += [_record(ISSUE_COMMENTS, v, n) for n, (_k, v) in enumerate(w.records(ISSUE_COMMENTS, 1000))]
    out = _run(job, state, records)
    expected = w.hot_comments(1000)
    assert len(out) == len(expected)  # no comment output twice
    assert {h["comment"]: {k: h[k] for k in ("issue", "pr", "window", "count")} for h in out} == expected
    assert 0 < len(expected) < 1000
    totals = w.pr_totals(1000, 300)
    assert sum(c for c, _h in totals.values()) == 300 and sum(h for _c, h in totals.values()) == len(expected)


def test_experiment_cli_refuses_bad_arguments_before_starting_anything():
    from typer.testing import CliRunner

    from experiments.suite import app

    runner = CliRunner()
    bad = runner.invoke(app, ["modes", "--interval", "soon"])
    assert bad.exit_code == 2 and "Invalid value" in bad.output
    assert runner.invoke(app, ["no-such-experiment"]).exit_code == 2
    for args in (["interval", "--intervals", "1,x"], ["parallelism", "--values", "0,2"], ["repeat", "--runs", "0"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "Invalid value" in result.output, args
    assert runner.invoke(app, ["--help"]).exit_code == 0
