"""The outside producer: numbered records ``{"n": n}`` into a plain Kafka topic, at a steady rate.

Idempotent (no duplicates from its own retries), ordered per key. SIGTERM stops it: it flushes,
writes what was acknowledged to ``--out`` as JSON and prints ``done sent=N acked=M``.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from experiments.chaos.jobs import key_of


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="chaos-producer")
    ap.add_argument("--kafka", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rate", type=float, default=200.0, help="records per second")
    ap.add_argument("--out", required=True, help="JSON file of the acknowledged numbers")
    ap.add_argument("--linger-ms", type=float, default=5.0,
                    help="librdkafka's linger.ms: how long records gather into one batch per partition")
    args = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    producer = Producer({"bootstrap.servers": args.kafka, "enable.idempotence": True, "linger.ms": args.linger_ms,
                         "message.timeout.ms": 900_000, "log_level": 3})
    acked: list[int] = []
    failed: list[int] = []

    def delivered(err: object, msg: object) -> None:
        n = int(json.loads(msg.value())["n"])  # type: ignore[attr-defined]
        (failed if err is not None else acked).append(n)

    sent = 0
    started = time.monotonic()
    print(f"open topic={args.topic} rate={args.rate}", flush=True)
    while not stop.is_set():
        due = int((time.monotonic() - started) * args.rate) + 1
        while sent < due and not stop.is_set():
            try:
                producer.produce(args.topic, json.dumps({"n": sent}).encode(), key_of(sent), on_delivery=delivered)
            except BufferError:
                producer.poll(0.1)
                continue
            sent += 1
        producer.poll(0.01)
    while producer.flush(1.0) > 0:  # a paused broker: wait as long as it takes (the checker heals it)
        pass
    Path(args.out).write_text(json.dumps({"sent": sent, "acked": sorted(acked), "failed": sorted(failed)}))
    print(f"done sent={sent} acked={len(acked)} failed={len(failed)}", flush=True)


if __name__ == "__main__":
    main()
