"""A producer process for crash tests: writes deterministic records per epoch until an epoch.

Each record is {"sink", "producer", "epoch", "j"}: the epoch it was written for, so a test can
check every record arrives exactly once and in that epoch. ``--pause-at E:POINT`` stops the
process at POINT of epoch E (``mid``: records flushed, transaction open; or a commit fault point
such as ``after_kafka_commit``) and waits there to be SIGKILLed. ``--pipelined`` commits with
``commit(wait=False)`` (its fault point ``zk_commit_sent``: the ZooKeeper commit is on its way).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from aligner.connectors.sink import SinkProducer
from aligner.ledger import Ledger


def say(line: str) -> None:
    print(line, flush=True)


def park(epoch: int, point: str) -> None:
    say(f"paused {epoch} {point}")
    while True:
        time.sleep(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("zk", "kafka", "root", "subject", "sink", "producer", "partitions"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--until", type=int, required=True, help="stop after committing this epoch")
    ap.add_argument("--records", type=int, default=50)
    ap.add_argument("--barrier", type=int, default=0, help="start writing once this many producers claimed")
    ap.add_argument("--pause-at", default=None, help="E:POINT, or +N:POINT for this producer's N-th epoch")
    ap.add_argument("--pipelined", action="store_true", help="commit(wait=False): ZooKeeper beside the next epoch")
    args = ap.parse_args()
    pause_epoch, pause_point = (None, None)
    if args.pause_at:
        e, pause_point = args.pause_at.split(":")
        pause_epoch = None if e.startswith("+") else int(e)
    state = {"epoch": -1}

    def fault(point: str) -> None:
        if state["epoch"] == pause_epoch and point == pause_point:
            park(state["epoch"], point)

    ledger = Ledger.connect(args.zk, args.root)
    partitions = [int(p) for p in args.partitions.split(",")]
    producer = SinkProducer(ledger, args.kafka, args.subject, args.sink, args.producer, partitions, fault=fault).open()
    say(f"open next={producer.next_epoch} attempt={producer.attempt}")
    deadline = time.monotonic() + 300  # a liveness bound: the other producers start on a busy machine too
    while len(ledger.subjects.writers(args.subject)[0].writers) < args.barrier:
        if time.monotonic() > deadline:
            raise TimeoutError("the other producers never claimed their partitions")
        time.sleep(0.02)
    if args.pause_at and args.pause_at.startswith("+"):
        pause_epoch = producer.next_epoch + int(args.pause_at[1:].split(":")[0])
    while producer.next_epoch <= args.until:
        epoch = producer.begin()
        state["epoch"] = epoch
        for j in range(args.records):
            value = {"sink": args.sink, "producer": args.producer, "epoch": epoch, "j": j}
            producer.send(json.dumps(value).encode(), key=f"{args.producer}-{j}".encode())
        if epoch == pause_epoch and pause_point == "mid":
            producer.kp.flush(30)  # the open transaction's records reach the broker
            park(epoch, "mid")
        producer.commit(wait=not args.pipelined)
        say(f"committed {epoch}")
    producer.sync()
    producer.close()
    ledger.close()
    say("done")
    sys.exit(0)


if __name__ == "__main__":
    main()
