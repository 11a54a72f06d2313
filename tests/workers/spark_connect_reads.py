"""A Spark Connect client for tests: registers format("aligned") from the client and prints, as one JSON
line per read, the sorted (epoch, partition, offset) of each batch read given as ``--read NAME=VALUE``
(e.g. ``epoch=1``, ``epochs=0:2``, ``asOf=2``, ``lineage=relay:3``) of ``--subject``; then ``done``.
A read that fails prints ``error <the library's own error line from the server's message>``."""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("remote", "zk", "kafka", "root", "subject"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--read", action="append", default=[])
    args = ap.parse_args()

    from aligner.connectors.spark.session import remote_session

    spark = remote_session(args.remote)
    conn = {"zk": args.zk, "kafka": args.kafka, "root": args.root, "subject": args.subject}
    for read in args.read:
        name, value = read.split("=", 1)
        try:
            rows = spark.read.format("aligned").options(**conn, **{name: value}).load() \
                .select("epoch", "partition", "offset").collect()
        except Exception as exc:
            lines = str(exc).strip().splitlines()
            print("error " + next((ln for ln in lines if ln.startswith("aligner.errors.")), lines[0]), flush=True)
            continue
        print(json.dumps({"read": read, "records": sorted([r.epoch, r.partition, r.offset] for r in rows)}),
              flush=True)
    spark.stop()
    print("done", flush=True)


if __name__ == "__main__":
    main()
