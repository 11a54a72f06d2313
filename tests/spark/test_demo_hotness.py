"""Job 1 of the demo on Spark (experiments.hotness.hot_issues_query): its per-issue state step, both versions,
gives the runtime job's hot issues whatever the micro-batch boundaries (pandas only: the step is what Spark
calls per issue and batch; the aligned query itself runs in ``make demo``)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from experiments.hotness import _hot_step
from experiments.workload import ISSUE_COMMENTS, ISSUES, Workload

pd = pytest.importorskip("pandas")


class _State:
    """The part of Spark's GroupState the step uses."""

    def __init__(self) -> None:
        self.value: tuple | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple:
        assert self.value is not None
        return self.value

    def update(self, value: tuple) -> None:
        self.value = value


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("batch", [7, 400])
def test_spark_hot_issues_step_matches_the_runtime_job(version, batch):
    w = Workload(comment_rate=150.0, item_rate=5.0)
    comments, items = 3000, 100
    rows = [{"issue": v["id"], "is_issue": True, "id": v["id"], "pr": v["pr"], "et": v["et"], "ts": 0.0}
            for _k, v in w.records(ISSUES, items)]
    rows += [{"issue": v["issue"], "is_issue": False, "id": v["id"], "pr": None, "et": v["et"], "ts": 0.0}
             for _k, v in w.records(ISSUE_COMMENTS, comments)]
    rows.sort(key=lambda r: r["et"] + (0.05 if r["is_issue"] else 0))  # some issues arrive after their comments
    states: defaultdict[int, _State] = defaultdict(_State)
    step, out = _hot_step(w.window, w.hot_threshold, version), []
    for lo in range(0, len(rows), batch):
        groups = defaultdict(list)
        for r in rows[lo:lo + batch]:
            groups[r["issue"]].append(r)
        for issue, group in groups.items():
            for frame in step((issue,), [pd.DataFrame(group)], states[issue]):
                out += [json.loads(v) for v in frame["value"]]
    expected = {c: h for c, h in w.hot_comments(comments).items() if h["issue"] < items}
    got = {h["comment"]: {k: h[k] for k in ("issue", "pr", "window", "count")} for h in out}
    assert len(out) == len(got) and got == expected
    assert {h["v"] for h in out} == {version}
