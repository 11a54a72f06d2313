"""The stateful Spark query whose versions the hot-swap tests and benchmark swap, as an aligned job.

It reads subject X ({"n": N} records) and keeps per key k = N % 4 a running aggregate in Spark state
(applyInPandasWithState): version 1 a running count, version 2 a running sum, so the two versions'
checkpoints are incompatible. Every input yields one output {"in": {"n": N}, "k", "count" | "sum",
"v"}, keyed N as its input.
"""

from __future__ import annotations

import json
from typing import Any


def start_running_query(spark: Any, conn: dict[str, str], source: str, target: str, job: str, version: int,
                        checkpoint: str, sink_options: dict[str, str] | None = None, sink: str = "aligned") -> Any:
    """Start version ``version`` (1 or 2) of the query as registered job ``job``; returns the StreamingQuery.
    ``sink_options``: more options of the sink; ``sink``: its format (a test's own aligned data source, which
    injects faults)."""
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    def running(key, frames, state):
        acc = state.get[0] if state.exists else 0
        ns = sorted(int(n) for f in frames for n in f["n"])
        out = []
        for n in ns:
            acc += 1 if version == 1 else n
            out.append(json.dumps({"in": {"n": n}, "k": int(key[0]), ("count" if version == 1 else "sum"): acc,
                                   "v": version}))
        state.update((acc,))
        yield pd.DataFrame({"key": [str(n) for n in ns], "value": out})

    n = F.get_json_object(F.col("value").cast("string"), "$.n").cast("long")
    rows = (spark.readStream.format("aligned").options(**conn, subject=source, job=job).load()
            .select(n.alias("n")).withColumn("k", F.col("n") % 4))
    out = rows.groupBy("k").applyInPandasWithState(running, "key string, value string", "acc long", "append",
                                                   GroupStateTimeout.NoTimeout)
    return (out.writeStream.format(sink).options(**conn, subject=target, job=job, **(sink_options or {}))
            .option("checkpointLocation", checkpoint).outputMode("append").start())
