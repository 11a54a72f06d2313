"""Per-epoch phase breakdown: raw + stamp loop vs pipelined sink, interleaved rounds."""
import collections, gc, statistics, sys, time, logging
from experiments.bench_sink import raw_producer, raw_run, sink_run, EPOCH, PARTITIONS, VALUE
from aligner.connectors.kafka import ensure_topic
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.coordinator.stack import EmbeddedStack
from aligner.ledger import Ledger
from aligner.stamps import HEADER, Stamp

logging.getLogger("kazoo").setLevel(logging.ERROR)
REC = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
ph = collections.defaultdict(float)
import os
def threads():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{t}/comm").read().strip()
            import threading
            name = next((th.name for th in threading.enumerate() if th.native_id == int(t)), name)
            f = open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()
            out[(t, name)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return out
tcpu = {"raw": collections.Counter(), "sink": collections.Counter()}

def timed(obj, name, key):
    fn = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            ph[key] += time.perf_counter() - t
    setattr(obj, name, w)

class KP:
    """Wraps a confluent Producer's per-epoch calls for timing."""
    def __init__(self, kp, tag):
        self.kp, self.tag = kp, tag
        self.produce, self.poll = kp.produce, kp.poll
        self.stale = False
    def begin_transaction(self):
        t = time.perf_counter(); self.kp.begin_transaction(); ph[self.tag + ".begin_txn"] += time.perf_counter() - t
    def flush(self, *a):
        t = time.perf_counter(); r = self.kp.flush(*a); ph[self.tag + ".flush"] += time.perf_counter() - t; return r
    def commit_transaction(self, *a):
        t = time.perf_counter(); self.kp.commit_transaction(*a); ph[self.tag + ".commit_txn"] += time.perf_counter() - t

stamp = [(HEADER, Stamp("sink", 123, 1).encode())]
with EmbeddedStack() as info:
    led = Ledger.connect(info.zk, "/bench")
    create_subject(led, info.kafka, "s-pipelined", PARTITIONS)
    ensure_topic(info.kafka, "raw-stamp", PARTITIONS)
    kp = KP(raw_producer(info.kafka, "raw-stamp"), "raw")
    with SinkProducer(led, info.kafka, "s-pipelined", "sink", 0, list(range(PARTITIONS))) as sink:
        raw_run(kp, "raw-stamp", EPOCH, stamp); sink_run(sink, EPOCH, wait=False)
        for n in ("begin", "flush_epoch", "_settle_or_abort", "_ensured", "commit_transaction", "sync"):
            timed(sink, n, "sink." + n)
        timed(led, "commit_epoch_async", "sink.zk_send")
        timed(led, "epoch_committed", "sink.settle.epoch_committed")
        import os as _os
        YIELD = float(_os.environ.get("YIELD", "0"))
        if YIELD:
            _ma = led.multi_async
            def _yield_ma(*a, **k):
                r = _ma(*a, **k); time.sleep(YIELD); return r
            led.multi_async = _yield_ma
        timed(led, "multi_async", "sink.zk_send.multi_async")
        timed(led, "_commit_ops", "sink.zk_send._commit_ops")
        timed(led, "_commit_outcome", "sink.settle.outcome")
        timed(sink, "_confirmed", "sink.settle.confirmed")
        timed(sink, "_release_held", "sink.flush.release_held")
        inner = sink.kp
        kpw = KP(inner, "sink")
        sink._kp = kpw
        res = {"raw": [], "sink": []}
        cpu = {"raw": [], "sink": []}
        thr = {"raw": [], "sink": []}
        for r in range(ROUNDS):
            order = ["raw", "sink"] if r % 2 == 0 else ["sink", "raw"]
            for w in order:
                c0, t0 = time.process_time(), time.thread_time(); th0 = threads()
                res[w].append(raw_run(kp, "raw-stamp", REC, stamp) if w == "raw" else sink_run(sink, REC, wait=False))
                cpu[w].append(time.process_time() - c0); thr[w].append(time.thread_time() - t0)
                th1 = threads()
                for k, v in th1.items():
                    tcpu[w][k[1]] += v - th0.get(k, 0.0)
        sink._kp = inner
    kp.kp.flush(10); del kp; gc.collect(); led.close()
ep = ROUNDS * REC // EPOCH
for w in res:
    print(f"{w}: median {REC/statistics.median(res[w]):,.0f}/s; wall/epoch {1000*sum(res[w])/ep:.2f} ms; "
          f"process cpu/epoch {1000*sum(cpu[w])/ep:.2f} ms; main thread cpu/epoch {1000*sum(thr[w])/ep:.2f} ms")
print("median per-round ratio", statistics.median(r/s for r, s in zip(res["raw"], res["sink"])))
for k, v in sorted(ph.items()):
    print(f"  {k}: {1000*v/ep:.3f} ms/epoch")
for w in tcpu:
    print(w, {k: round(1000 * v / ep, 2) for k, v in tcpu[w].most_common()})
