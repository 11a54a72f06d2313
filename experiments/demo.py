"""`make demo`: a chained pipeline on the embedded stack, aligned live, verified record by record.

    outside producer --> subject `events` (epochs cut by the marker)
        --> job `enrich` (2 workers)  --> subject `enriched`
        --> job `totals` (1 worker)   --> subject `totals`

Both jobs start unaligned on their own timers; the coordinator aligns them while data flows, then
hot-swaps `enrich` for `enrich-v2` (which ran beside it, following its epochs) without stopping.
Spark then reads `totals` by aligned epoch when PySpark is installed. The demo ends with a
verification line and exits non-zero if anything was lost or duplicated.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable

from confluent_kafka import Producer
from rich.console import Console

from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from connectors.marker import EpochMarker
from connectors.reader import EpochReader
from connectors.runtime import JobFunction, JobSpec, JobWorker, KeyedState
from connectors.source import SourceRecord
from connectors.subjects import create_subject
from coordinator.alignment import Coordinator
from coordinator.hotswap import HotSwap
from coordinator.lineage import flatten, job_epoch_lineage
from coordinator.stack import EmbeddedStack, wait_for

console = Console()
EVENTS = 6000
ROOT = "/aligner-demo"


def enrich(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    event = json.loads(record.value or b"{}")
    user = event["user"]
    seen = state.get(user, 0) + 1
    state.put(user, seen)
    yield user.encode(), json.dumps({**event, "nth_for_user": seen, "events_epoch": record.epoch, "v": 1}).encode()


def enrich_v2(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    """Version 2: the same enrichment, marked, so the output shows which version produced it."""
    for key, value in enrich(record, state):
        yield key, json.dumps({**json.loads(value), "v": 2}).encode()


def totals(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    event = json.loads(record.value or b"{}")
    total = state.get(event["user"], 0) + event["amount"]
    state.put(event["user"], total)
    yield record.key, json.dumps({"n": event["n"], "user": event["user"], "total": total,
                                  "enriched_epoch": record.epoch, "enrich_version": event["v"]}).encode()


def outside_producer(bootstrap: str, stop: threading.Event) -> None:
    """A system that knows nothing about epochs: plain, unstamped, non-transactional writes."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    for n in range(EVENTS):
        p.produce("events", json.dumps({"n": n, "user": f"u{n % 37}", "amount": n % 11}).encode(),
                  key=f"u{n % 37}".encode())
        if n % 50 == 49:
            p.flush()
            stop.wait(0.06)
    p.flush()


def run_job(ledger_hosts: str, bootstrap: str, spec: JobSpec, worker: int, fn: JobFunction,
            stop: threading.Event, errors: list[BaseException]) -> threading.Thread:
    def target() -> None:
        led = Ledger.connect(ledger_hosts, ROOT)
        try:
            w = JobWorker(led, bootstrap, spec, worker, fn).open()
            w.run(stop)
            w.close()
        except BaseException as exc:
            errors.append(exc)
        finally:
            led.close()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def spark_read(zk: str, kafka: str, first: int, last: int) -> int | None:
    try:
        from connectors.spark.session import local_session
    except ImportError:
        return None
    spark = local_session(app="aligner-demo", **{"spark.ui.showConsoleProgress": "false"})
    try:
        df = (spark.read.format("aligned").option("zk", zk).option("kafka", kafka).option("root", ROOT)
              .option("subject", "totals").option("epochs", f"{first}:{last}").load())
        return df.count()
    finally:
        spark.stop()


def main() -> int:
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    t0 = time.monotonic()
    with EmbeddedStack() as info:
        console.print(f"[bold]embedded stack[/] ZooKeeper {info.zk}, Kafka (Tansu) {info.kafka}")
        led = Ledger.connect(info.zk, ROOT)
        for name, parts in (("events", 4), ("enriched", 4), ("totals", 2)):
            create_subject(led, info.kafka, name, parts)
        stop, errors = threading.Event(), []
        producer_done = threading.Event()

        def produce() -> None:
            outside_producer(info.kafka, threading.Event())
            producer_done.set()

        threading.Thread(target=produce, daemon=True).start()
        marker_led = Ledger.connect(info.zk, ROOT)
        marker = EpochMarker(marker_led, info.kafka, "events").open()
        marker_stop = threading.Event()
        marker_thread = threading.Thread(target=marker.run, args=(0.25, marker_stop), daemon=True)
        marker_thread.start()

        enrich_spec = JobSpec(job="enrich", inputs=("events",), output="enriched", parallelism=2, interval=0.3,
                              output_partitions=(0, 1))
        enrich_v2_spec = JobSpec(job="enrich-v2", version="2", inputs=("events",), output="enriched",
                                 parallelism=2, interval=0.3, output_partitions=(2, 3), follows="enrich")
        totals_spec = JobSpec(job="totals", inputs=("enriched",), output="totals", interval=0.45)
        threads = [run_job(info.zk, info.kafka, enrich_spec, i, enrich, stop, errors) for i in range(2)]
        threads.append(run_job(info.zk, info.kafka, totals_spec, 0, totals, stop, errors))

        coord, jobs = Coordinator(led), JobLedger(led)
        for job, source, workers in (("enrich", "events", 2), ("totals", "enriched", 1)):
            wait_for(lambda j=job, s=source, n=workers: j in jobs.job_names() and len(jobs.consumers(j, s)) == n,
                     60, f"{job} workers to start")
        console.print("jobs running unaligned on their own timers; aligning enrich, then totals ...")
        d1 = coord.align("enrich", timeout=120)
        console.print(f"  enrich aligned: job epoch {d1.job_epoch} starts at events epoch {d1.subject_epochs}")
        d2 = coord.align("totals", timeout=120)
        console.print(f"  totals aligned: job epoch {d2.job_epoch} starts at enriched epoch {d2.subject_epochs}")
        console.print("starting enrich v2 beside v1 (it follows v1's epochs, output voided), hot-swapping ...")
        threads += [run_job(info.zk, info.kafka, enrich_v2_spec, i, enrich_v2, stop, errors) for i in range(2)]
        wait_for(lambda: "enrich-v2" in jobs.job_names() and len(jobs.consumers("enrich-v2", "events")) == 2
                 and all(c.job_epoch is not None for c in jobs.consumers("enrich-v2", "events").values()),
                 60, "enrich v2 to follow")
        swap = HotSwap(led).run("enrich", "enrich-v2", "enriched", timeout=120)
        console.print(f"  swapped: enrich v1 wrote enriched epochs <= {swap.epoch}, v2 writes from {swap.epoch + 1}")

        producer_done.wait(120)
        marker_stop.set()
        marker_thread.join(30)
        # One last cut takes whatever the producer wrote after the marker's last tick; then the
        # marker finishes the subject so the chain drains and stops (thesis 5.7).
        marker.mark()
        marker.finish()
        marker.close()
        for t in threads:
            t.join(180)
        if errors:
            raise errors[0]

        with EpochReader(led, info.kafka) as reader:
            first, last = led.epoch_numbers("totals")[0], led.frontier("totals")
            out = [json.loads(r.value) for r in reader.read("totals", first, last)]
        counts = Counter(o["n"] for o in out)
        lost = sum(1 for n in range(EVENTS) if counts[n] == 0)
        dup = sum(c - 1 for c in counts.values() if c > 1)
        final = {}
        for o in out:
            final[o["user"]] = max(final.get(o["user"], 0), o["total"])
        expected = Counter()
        for n in range(EVENTS):
            expected[f"u{n % 37}"] += n % 11
        totals_ok = final == dict(expected)

        aligned_epochs = jobs.job_epoch_numbers("totals")
        tree = job_epoch_lineage(led, "totals", aligned_epochs[len(aligned_epochs) // 2])
        cut = flatten(tree)
        spark_rows = spark_read(info.zk, info.kafka, first, last)
        marker_led.close()
        led.close()

    by_version = Counter(o["enrich_version"] for o in out)
    ok = lost == 0 and dup == 0 and totals_ok and len(out) == EVENTS and by_version[1] > 0 and by_version[2] > 0
    console.print(f"lineage of totals epoch {tree['epoch']}: " + ", ".join(f"{s} {e}" for s, e in cut.items()))
    if spark_rows is not None:
        console.print(f"Spark read of totals epochs {first}:{last}: {spark_rows} rows")
        ok = ok and spark_rows == len(out)
    style = "green" if ok else "red"
    console.print(
        f"[bold {style}]verification: records in {EVENTS}, records out {len(out)}, lost {lost}, "
        f"duplicated {dup}, per-user totals {'match' if totals_ok else 'DIFFER'}, "
        f"enriched by v1 {by_version[1]} / v2 {by_version[2]}, "
        f"{len(aligned_epochs)} aligned epochs of totals[/] ({time.monotonic() - t0:.0f}s)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
