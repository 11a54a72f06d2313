"""How long a transactional producer takes to start: the product's (``StampedProducer.start``, what every
Spark write task does once per micro-batch) against a raw confluent-kafka producer with default settings.

Each start is one task's life: create the producer, ``init_transactions`` (which fences the previous
incarnation of the same transactional id), one record in one transaction, commit, close. The two kinds
alternate on one transactional id each, on the embedded broker; the figure that matters is the start
(constructor to initialised), reported as median, mean, p95 and the share of starts over 200 ms.

``work`` in the results, per kind summed over the measured starts: the records each start's transaction carried, its
transactions committed and the bytes of its values, counted as they were produced and committed (not timed).

    python -m experiments.bench_producer_start [--starts 100]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from aligner.connectors.kafka import QUIET, ensure_topic
from aligner.connectors.stamped import StampedProducer
from aligner.embedded.stack import EmbeddedStack
from experiments import ForeignCpu
from experiments.common import Work, work_results, write_results

TOPIC = "bench-producer-start"
SLOW_S = 0.2


def one_record(kp: Producer, work: Work | None) -> None:
    """The start's one record in one transaction, counted in ``work`` once committed."""
    value = b"x"
    kp.begin_transaction()
    kp.produce(TOPIC, value, partition=0)
    kp.commit_transaction(30)
    if work is not None:
        work.add(Work(records=1, transactions=1, bytes=len(value)))


def raw_start(bootstrap: str, work: Work | None = None) -> float:
    """A default confluent-kafka transactional producer: seconds to initialise."""
    started = time.perf_counter()
    kp = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench.start.raw", **QUIET})
    kp.init_transactions(30)
    took = time.perf_counter() - started
    one_record(kp, work)
    kp.flush(0)
    return took


def product_start(bootstrap: str, work: Work | None = None) -> float:
    """The product's producer, as a Spark write task starts it: seconds to initialise."""
    started = time.perf_counter()
    producer = StampedProducer(bootstrap, "bench.start.product", TOPIC, [0], name="bench")
    producer.start({TOPIC: TOPIC})
    took = time.perf_counter() - started
    one_record(producer.kp, work)
    producer.close()
    return took


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"median_ms": round(statistics.median(times) * 1000, 1), "mean_ms": round(statistics.mean(times) * 1000, 1),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 1),
            "over_200ms": round(sum(t > SLOW_S for t in times) / len(times), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=100, help="starts of each kind")
    args = ap.parse_args()
    with EmbeddedStack() as info:
        foreign = ForeignCpu(info.zk_pid, info.kafka_pid)
        ensure_topic(info.kafka, TOPIC, 1)
        kinds: dict[str, Callable[[str, Work | None], float]] = {"raw": raw_start, "product": product_start}
        for start in kinds.values():  # warm-up: the transactional ids exist, the broker has loaded its code paths
            start(info.kafka, None)
        times: dict[str, list[float]] = {name: [] for name in kinds}
        work = {name: Work() for name in kinds}
        for _ in range(args.starts):
            for name, start in kinds.items():
                times[name].append(start(info.kafka, work[name]))
        others = foreign.cores()
    payload: dict[str, Any] = {"starts": args.starts, "foreign_cores": round(others, 2),
                               **{k: summary(v) for k, v in times.items()}, **work_results(work)}
    raw, ours = payload["raw"], payload["product"]
    payload["product_over_raw_median"] = round(ours["median_ms"] / raw["median_ms"], 3)
    payload["product_over_raw_mean"] = round(ours["mean_ms"] / raw["mean_ms"], 3)
    for name in kinds:
        s = payload[name]
        print(f"{name:8s} start median {s['median_ms']:6.1f} ms  mean {s['mean_ms']:6.1f} ms  "
              f"p95 {s['p95_ms']:6.1f} ms  over {SLOW_S * 1000:.0f} ms {s['over_200ms']:.0%}")
    print(f"product / raw: median {payload['product_over_raw_median']}, mean {payload['product_over_raw_mean']} "
          f"(other processes used {others:.2f} cores)")
    print(f"results: {write_results('bench_producer_start', payload)}")


if __name__ == "__main__":
    main()
