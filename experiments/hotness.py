"""The two jobs of the hotness workload (thesis 6.1.1).

Job 1, hot issues (job runtime): issue comments are counted per issue in tumbling windows of logical
event time and joined with the issue itself; from the ``hot_threshold``-th comment of a window on,
every comment yields a hot-issue record (issue, pull request, window, count). A comment that
arrives before its issue waits in keyed state for the join partner, so every hot comment is output
exactly once whatever the arrival order of the two inputs.

Job 2, PR hotness: PR comments and hot issues are unioned by pull request and reduced to the
pull request's hotness = its comments + the hot comments of the issue it fixes. The Spark Structured
Streaming version (:func:`pr_hotness_query`) is the one the demo runs; :func:`pr_hotness` is the
same reduction on the job runtime, which the latency experiments use to compare processing modes.

Every output record keeps the ``ts`` (creation time) of the input record that caused it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from aligner.connectors.runtime import JobFunction, KeyedState
from aligner.connectors.source import SourceRecord
from experiments.workload import Workload, window_count

Output = Iterable[tuple[bytes | None, bytes]]


def hot_issues(workload: Workload, version: int = 1) -> JobFunction:
    """Job 1 (``version`` 2 marks its records, so the output shows which version wrote them)."""

    def out(hot: dict[str, Any]) -> tuple[bytes, bytes]:
        return str(hot["pr"]).encode(), json.dumps({**hot, "v": version}).encode()

    def job(record: SourceRecord, state: KeyedState) -> Output:
        value = json.loads(record.value or b"{}")
        if "title" in value:  # an issue (inputs are told apart by their fields: subject names vary)
            key = str(value["id"])
            s = state.get(key) or {}
            s["pr"] = value["pr"]
            for hot in s.pop("pending", []):
                yield out({**hot, "pr": value["pr"]})
            state.put(key, s)
            return
        key = str(value["issue"])
        s = state.get(key) or {}
        windows = {0: (s["w"], s["n"])} if "w" in s else {}
        count = window_count(windows, 0, value["et"], workload.window)
        s["w"], s["n"] = windows[0]
        if count >= workload.hot_threshold:
            hot = {"comment": value["id"], "issue": value["issue"], "window": s["w"], "count": count,
                   "ts": value["ts"]}
            if "pr" in s:
                yield out({**hot, "pr": s["pr"]})
            else:
                s.setdefault("pending", []).append(hot)
        state.put(key, s)

    return job


def pr_hotness(record: SourceRecord, state: KeyedState) -> Output:
    """Job 2 on the job runtime: running hotness per pull request."""
    value = json.loads(record.value or b"{}")
    key = str(value["pr"])
    comments, hot = state.get(key, (0, 0))
    if "comment" in value:  # a hot-issue record; a PR comment otherwise
        hot += 1
        src = ["h", value["comment"]]
    else:
        comments += 1
        src = ["c", value["id"]]
    state.put(key, (comments, hot))
    yield key.encode(), json.dumps({"pr": value["pr"], "comments": comments, "hot": hot,
                                    "hotness": comments + hot, "ts": value["ts"], "src": src}).encode()


def pr_hotness_query(spark: Any, conn: dict[str, str], hot_issues_subject: str, pr_comments_subject: str,
                     epochs_per_batch: int | None = None) -> Any:
    """Job 2 on Spark Structured Streaming: the aligned multi-subject source, a stateful reduce.

    Each micro-batch covers whole committed epochs of both subjects (epoch-vector offsets). The
    running totals per pull request live in Spark's state store (``applyInPandasWithState``), and
    each batch appends one row per pull request it changed, so the query runs in append mode,
    which the aligned sink takes.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    reader = (spark.readStream.format("aligned").options(**conn)
              .option("subjects", f"{hot_issues_subject},{pr_comments_subject}"))
    if epochs_per_batch is not None:  # default: every committed epoch per batch, so the query keeps up
        reader = reader.option("maxEpochsPerBatch", str(epochs_per_batch))
    rows = reader.load()
    v = F.col("value").cast("string")
    parsed = rows.select(
        F.get_json_object(v, "$.pr").cast("long").alias("pr"),
        F.get_json_object(v, "$.ts").cast("double").alias("ts"),
        (F.col("subject") == F.lit(pr_comments_subject)).cast("long").alias("is_comment"),
    )
    return parsed.groupBy("pr").applyInPandasWithState(
        _reduce_pr, outputStructType="key string, value string", stateStructType="comments long, hot long",
        outputMode="append", timeoutConf=GroupStateTimeout.NoTimeout)


def _reduce_pr(key: tuple[Any, ...], batches: Iterable[Any], state: Any) -> Iterable[Any]:
    import pandas as pd

    comments, hot = state.get if state.exists else (0, 0)
    oldest, newest = float("inf"), 0.0
    for b in batches:
        n = int(b["is_comment"].sum())
        comments, hot = comments + n, hot + len(b) - n
        oldest, newest = min(oldest, float(b["ts"].min())), max(newest, float(b["ts"].max()))
    state.update((comments, hot))
    pr = int(key[0])
    # ts: the newest input that changed the row, oldest_ts: the oldest (creation times, for latency)
    value = {"pr": pr, "comments": comments, "hot": hot, "hotness": comments + hot, "ts": newest,
             "oldest_ts": oldest}
    yield pd.DataFrame({"key": [str(pr)], "value": [json.dumps(value)]})
