"""The peer in ``bench_pipeline``: a Quix Streams application doing the same consume -> identity -> produce.

Runs in its own virtual environment (``make peer-venv``: Quix Streams pins its own confluent-kafka), so it
imports nothing of this project. It reads ``--records`` records of ``--input`` from the earliest offset under
a new consumer group and writes each value to ``--output`` with the given processing guarantee, then prints
one JSON line: records, seconds from the first record processed to the application's stop (its last
checkpoint committed: the transaction under exactly-once), and seconds from the start of ``run``.

    experiments/.peer-venv/bin/python experiments/peer_quix.py --broker HOST:PORT --input T --output U \\
        --records 300000 --guarantee exactly-once
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid


def main() -> None:
    from quixstreams import Application

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--guarantee", choices=["exactly-once", "at-least-once"], required=True)
    args = ap.parse_args()
    first: list[float] = []

    def processed(_topic: str, _partition: int, _offset: int) -> None:
        if not first:
            first.append(time.perf_counter())

    app = Application(broker_address=args.broker, consumer_group=f"peer-{uuid.uuid4().hex[:8]}",
                      auto_offset_reset="earliest", processing_guarantee=args.guarantee,
                      on_message_processed=processed, loglevel=logging.WARNING, use_changelog_topics=False)
    source = app.topic(args.input, value_deserializer="bytes", key_deserializer="bytes")
    sink = app.topic(args.output, value_serializer="bytes", key_serializer="bytes")
    app.dataframe(source).to_topic(sink)
    t0 = time.perf_counter()
    app.run(count=args.records, collect=False)
    end = time.perf_counter()
    print(json.dumps({"records": args.records, "seconds": end - (first[0] if first else t0),
                      "seconds_from_start": end - t0}))


if __name__ == "__main__":
    main()
