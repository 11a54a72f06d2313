"""Micro: the main thread's Python per pipelined epoch, with ZooKeeper live (10k one-record epochs warm first)."""
import logging, time, statistics
from experiments.bench_sink import PARTITIONS, VALUE
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.coordinator.stack import EmbeddedStack
from aligner.ledger import Ledger
logging.getLogger("kazoo").setLevel(logging.ERROR)
acc = {}
def timed(obj, name):
    fn = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            acc.setdefault(name, []).append(time.perf_counter_ns() - t)
    setattr(obj, name, w)
with EmbeddedStack() as info:
    led = Ledger.connect(info.zk, "/bench")
    create_subject(led, info.kafka, "s", PARTITIONS)
    with SinkProducer(led, info.kafka, "s", "sink", 0, list(range(PARTITIONS))) as p:
        for i in range(3000):
            p.begin(); p.send(VALUE, partition=i % 4); p.commit(wait=False)
        p.sync()
        for n in ("_commit_ops", "multi_async", "epoch_committed", "_commit_outcome", "_ensure_ops"):
            timed(led, n)
        for n in ("begin", "commit", "_settle", "_confirmed", "_starts", "flush_epoch", "commit_transaction"):
            timed(p, n)
        for i in range(2000):
            p.begin()
            for j in range(8):
                p.send(VALUE, partition=j % 4)
            p.commit(wait=False)
            time.sleep(0.005)  # a little time for the reply, as the next epoch's sends give it
        p.sync()
    led.close()
for k, v in acc.items():
    print(f"{k:20s} median {statistics.median(v)/1000:7.1f} us  p90 {sorted(v)[int(len(v)*.9)]/1000:7.1f} us")
