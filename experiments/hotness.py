"""The two jobs of the hotness workload (thesis 6.1.1).

Job 1, hot issues: issue comments are counted per issue in tumbling windows of logical
event time and joined with the issue itself; from the ``hot_threshold``-th comment of a window on,
every comment yields a hot-issue record (issue, pull request, window, count). A comment that
arrives before its issue waits in keyed state for the join partner, so every hot comment is output
exactly once whatever the arrival order of the two inputs. :func:`hot_issues` is job 1 on the job
runtime (the experiments use it); :func:`hot_issues_query` is the same job on Spark Structured
Streaming (the demo runs it), in two versions whose keyed state differs, so version 2 cannot start
from version 1's checkpoint: it rebuilds its state from the start of the input beside version 1.

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
                     epochs_per_batch: int | None = None, job: str | None = None) -> Any:
    """Job 2 on Spark Structured Streaming: the aligned multi-subject source, a stateful reduce.

    ``job``: run as that registered aligned job (:func:`aligner.connectors.spark.job.register_query`;
    the sink then takes the same option).

    Each micro-batch covers whole committed epochs of both subjects (epoch-vector offsets). The
    running totals per pull request live in Spark's state store (``applyInPandasWithState``), and
    each batch appends one row per pull request it changed, so the query runs in append mode,
    which the aligned sink takes.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from aligner.connectors.spark.common import TASK_RECORDS

    # Small ranges share read tasks: the query shuffles before its sink, so the batch's task count is free.
    reader = (spark.readStream.format("aligned").options(**conn, minRecordsPerTask=str(TASK_RECORDS))
              .option("subjects", f"{hot_issues_subject},{pr_comments_subject}"))
    if job is not None:
        reader = reader.option("job", job)
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
    for b in batches:  # plain lists: a group holds a few rows, and pandas reductions cost more than the loop
        flags, ts = b["is_comment"].tolist(), b["ts"].tolist()
        n = sum(flags)
        comments, hot = comments + n, hot + len(flags) - n
        if ts:
            oldest, newest = min(oldest, *ts), max(newest, *ts)
    state.update((comments, hot))
    pr = int(key[0])
    # ts: the newest input that changed the row, oldest_ts: the oldest (creation times, for latency)
    value = {"pr": pr, "comments": comments, "hot": hot, "hotness": comments + hot, "ts": newest,
             "oldest_ts": oldest}
    yield pd.DataFrame({"key": [str(pr)], "value": [json.dumps(value)]})


HOT_STATE = {1: "pr long, w long, n long, pending string", 2: "doc string"}
"""Job 1's state per issue on Spark: version 1 keeps typed columns (pull request, -1 until the issue was
seen; current window; its count; pending hot comments as JSON), version 2 one JSON document with the
count of every window seen. Spark checks a checkpoint's state schema, so v2 needs a checkpoint of its own."""


def hot_issues_query(spark: Any, conn: dict[str, str], job: str, issues_subject: str, comments_subject: str,
                     workload: Workload, version: int = 1, epochs_per_batch: int | None = None) -> Any:
    """Job 1 on Spark Structured Streaming as aligned job ``job`` (registered with
    :func:`aligner.connectors.spark.job.register_query`): issues and issue comments grouped by issue,
    one ``applyInPandasWithState`` step per issue and micro-batch; output rows ``key`` (pull request),
    ``value`` (the hot-issue record of :func:`hot_issues`, ``v`` = ``version``).

    Within a batch the issue is applied first, then the comments in id order (= event-time order), so
    the output is the runtime job's whatever the batch boundaries are."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from aligner.connectors.spark.common import TASK_RECORDS

    reader = (spark.readStream.format("aligned").options(**conn, job=job, minRecordsPerTask=str(TASK_RECORDS))
              .option("subjects", f"{issues_subject},{comments_subject}"))
    if epochs_per_batch is not None:
        reader = reader.option("maxEpochsPerBatch", str(epochs_per_batch))
    v = F.col("value").cast("string")
    is_issue = F.get_json_object(v, "$.title").isNotNull()
    rows = reader.load().select(
        F.when(is_issue, F.get_json_object(v, "$.id")).otherwise(F.get_json_object(v, "$.issue"))
        .cast("long").alias("issue"),
        is_issue.alias("is_issue"),
        F.get_json_object(v, "$.id").cast("long").alias("id"),
        F.get_json_object(v, "$.pr").cast("long").alias("pr"),
        F.get_json_object(v, "$.et").cast("double").alias("et"),
        F.get_json_object(v, "$.ts").cast("double").alias("ts"),
    )
    step = _hot_step(workload.window, workload.hot_threshold, version)
    return rows.groupBy("issue").applyInPandasWithState(
        step, outputStructType="key string, value string", stateStructType=HOT_STATE[version],
        outputMode="append", timeoutConf=GroupStateTimeout.NoTimeout)


def _hot_step(window: float, threshold: int, version: int) -> Any:
    """The per-issue state step of :func:`hot_issues_query` for one version (its state layout differs)."""

    def load(state: Any) -> tuple[int, dict[int, int], list[dict[str, Any]]]:
        if not state.exists:
            return -1, {}, []
        if version == 1:
            pr, w, n, pending = state.get
            return int(pr), {int(w): int(n)}, json.loads(pending)
        doc = json.loads(state.get[0])
        return int(doc["pr"]), {int(w): n for w, n in doc["windows"].items()}, doc["pending"]

    def save(state: Any, pr: int, windows: dict[int, int], pending: list[dict[str, Any]]) -> None:
        if version == 1:
            w = max(windows)
            state.update((pr, w, windows[w], json.dumps(pending)))
        else:
            state.update((json.dumps({"pr": pr, "windows": windows, "pending": pending}),))

    def step(key: tuple[Any, ...], frames: Iterable[Any], state: Any) -> Iterable[Any]:
        import pandas as pd

        issue = int(key[0])
        pr, windows, pending = load(state)
        out: list[dict[str, Any]] = []
        # Plain lists, not pandas operations per group: a group holds a few rows, and concat, masks and a sort
        # cost milliseconds each (the demo's micro-batch spent most of its Python time there).
        issue_prs, comments = [], []
        for f in frames:
            for is_issue, cid, cpr, et, ts in zip(f["is_issue"].tolist(), f["id"].tolist(), f["pr"].tolist(),
                                                   f["et"].tolist(), f["ts"].tolist(), strict=True):
                if is_issue:
                    issue_prs.append(cpr)
                else:
                    comments.append((int(cid), et, ts))
        for cpr in issue_prs:
            pr = int(cpr)
            out += [{**hot, "pr": pr} for hot in pending]
            pending = []
        for cid, et, ts in sorted(comments):
            w = int(et // window)
            last = max(windows) if windows else w
            count = windows.get(w, 0) + 1 if last == w else 1
            if version == 1:
                windows = {w: count}
            else:
                windows[w] = count
            if count >= threshold:
                hot = {"comment": cid, "issue": issue, "window": w, "count": count, "ts": float(ts)}
                if pr >= 0:
                    out.append({**hot, "pr": pr})
                else:
                    pending.append(hot)
        if windows or pr >= 0:
            save(state, pr, windows or {0: 0}, pending)
        if out:  # most groups emit nothing: no empty frame for Spark to convert and concatenate
            yield pd.DataFrame({"key": [str(h["pr"]) for h in out],
                                "value": [json.dumps({**h, "v": version}) for h in out]})

    return step
