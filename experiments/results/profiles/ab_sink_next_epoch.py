"""A/B of the pipelined sink's commit with and without the next epoch's node in its multi-op (session 28).

Four writers in one process and one embedded stack, order rotated each round: raw + stamp header, the
pipelined sink as it is (one ZooKeeper request per epoch), the pipelined sink with the next epoch made by
its own request (a ledger whose ``commit_epoch_async`` drops ``writers``, as before session 28), and the
sink with each commit waited for. Prints each round's ratios to raw + stamp and the paired medians.

    PYTHONPATH=. .venv/bin/python experiments/results/profiles/ab_sink_next_epoch.py 100000 48
"""

import logging
import statistics
import sys

from aligner.connectors.kafka import ensure_topic
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.coordinator.stack import EmbeddedStack
from aligner.ledger import Ledger
from aligner.stamps import HEADER, Stamp
from experiments.bench_sink import EPOCH, PARTITIONS, raw_producer, raw_run, sink_run

logging.getLogger("kazoo").setLevel(logging.ERROR)
N, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
stamp = [(HEADER, Stamp("sink", 123, 1).encode())]
with EmbeddedStack() as info:
    led = Ledger.connect(info.zk, "/bench")
    old = Ledger.connect(info.zk, "/bench")
    real = old.commit_epoch_async
    old.commit_epoch_async = lambda e, c, extra=(), writers=None: real(e, c, extra)  # type: ignore[method-assign]
    for s in ("new", "old", "wait"):
        create_subject(led, info.kafka, s, PARTITIONS)
    ensure_topic(info.kafka, "raw-stamp", PARTITIONS)
    kp = raw_producer(info.kafka, "raw-stamp")
    t: dict[str, list[float]] = {"raw": [], "new": [], "old": [], "wait": []}
    parts = list(range(PARTITIONS))
    with SinkProducer(led, info.kafka, "new", "sink", 0, parts) as pn, \
            SinkProducer(old, info.kafka, "old", "sink", 0, parts) as po, \
            SinkProducer(led, info.kafka, "wait", "sink", 0, parts) as pw:
        raw_run(kp, "raw-stamp", EPOCH, stamp)
        for p in (pn, po, pw):
            sink_run(p, EPOCH, wait=False)
        order = [("raw", lambda: raw_run(kp, "raw-stamp", N, stamp)),  # noqa: F821 (deleted after the rounds)
                 ("new", lambda: sink_run(pn, N, wait=False)),
                 ("old", lambda: sink_run(po, N, wait=False)), ("wait", lambda: sink_run(pw, N))]
        for r in range(ROUNDS):
            k = r % len(order)
            for name, fn in order[k:] + order[:k]:
                t[name].append(fn())
            print(r, {name: round(t["raw"][-1] / v[-1], 3) for name, v in t.items()}, flush=True)
    kp.flush(10)
    del kp
    led.close()
    old.close()
for name in ("new", "old", "wait"):
    per_round = [a / b for a, b in zip(t["raw"], t[name], strict=True)]
    print(f"{name}: median per-round ratio to raw + stamp {statistics.median(per_round):.3f}, "
          f"ratio of medians {statistics.median(t['raw']) / statistics.median(t[name]):.3f}")
for a, b in (("new", "old"), ("new", "wait"), ("old", "wait")):
    d = [y / x for x, y in zip(t[a], t[b], strict=True)]
    print(f"{a} faster than {b}: median per-round {statistics.median(d):.3f}, "
          f"in {sum(x > 1 for x in d)} of {len(d)} rounds")
