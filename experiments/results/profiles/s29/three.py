"""raw + stamp vs the sink's Kafka half alone (StampedProducer) vs the pipelined sink: interleaved rounds."""
import gc, logging, statistics, sys, time
from experiments.bench_sink import raw_producer, raw_run, sink_run, EPOCH, PARTITIONS, VALUE
from aligner.connectors.kafka import ensure_topic
from aligner.connectors.sink import SinkProducer
from aligner.connectors.stamped import StampedProducer
from aligner.connectors.subjects import create_subject
from aligner.coordinator.stack import EmbeddedStack
from aligner.ledger import Ledger
from aligner.stamps import HEADER, Stamp
logging.getLogger("kazoo").setLevel(logging.ERROR)
import os; sys.setswitchinterval(float(os.environ.get("SWI", "0.005")))
REC, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
stamp = [(HEADER, Stamp("sink", 123, 1).encode())]
starts = {"half": {p: 0 for p in range(PARTITIONS)}}
ep = [0]

def pcpu0(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100.0

def half_run(sp, records):
    t0 = time.perf_counter()
    for start in range(0, records, EPOCH):
        ep[0] += 1
        sp.begin_epoch(ep[0], {"h": Stamp("sink", ep[0], 1)})
        for i in range(start, min(start + EPOCH, records)):
            sp.send(VALUE, partition=i % PARTITIONS)
        w = sp.flush_epoch({"h": starts["half"]})
        sp.commit_transaction()
        starts["half"] = {p: r.end for p, r in w["h"].ranges.items()}
    return time.perf_counter() - t0

with EmbeddedStack() as info:
    led = Ledger.connect(info.zk, "/bench")
    create_subject(led, info.kafka, "s-pipelined", PARTITIONS)
    ensure_topic(info.kafka, "raw-stamp", PARTITIONS)
    ensure_topic(info.kafka, "half", PARTITIONS)
    kp = raw_producer(info.kafka, "raw-stamp")
    sp = StampedProducer(info.kafka, "half-txn", "h", list(range(PARTITIONS)))
    sp.start({"h": "half"})
    with SinkProducer(led, info.kafka, "s-pipelined", "sink", 0, list(range(PARTITIONS))) as sink:
        runs = {"raw": lambda: raw_run(kp, "raw-stamp", REC, stamp), "half": lambda: half_run(sp, REC),
                "sink": lambda: sink_run(sink, REC, wait=False)}
        for f in runs.values():
            f()
        W = int(os.environ.get("WARM", "0"))
        t0 = time.perf_counter(); z0 = pcpu0(info.zk_pid)
        for i in range(W):
            sink.begin(); sink.send(VALUE, partition=i % PARTITIONS); sink.commit(wait=False)
        sink.sync()
        print(f"warm-up {W} epochs {time.perf_counter() - t0:.1f} s, ZK cpu {pcpu0(info.zk_pid) - z0:.1f} s")
        res = {k: [] for k in runs}
        def pcpu(pid):
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / 100.0
        pids = {"zk": info.zk_pid, "broker": info.kafka_pid, "self": os.getpid()}
        cpu = {k: {p: 0.0 for p in pids} for k in runs}
        names = list(runs)
        for r in range(ROUNDS):
            for name in names[r % 3:] + names[:r % 3]:
                c0 = {p: pcpu(v) for p, v in pids.items()}
                res[name].append(runs[name]())
                for p, v in pids.items():
                    cpu[name][p] += pcpu(v) - c0[p]
    sp.close(); kp.flush(10); del kp; gc.collect(); led.close()
for k in res:
    print(f"{k}: median {REC / statistics.median(res[k]):,.0f}/s; median per-round ratio to raw+stamp "
          f"{statistics.median(r / s for r, s in zip(res['raw'], res[k])):.3f}")
epochs = ROUNDS * REC // EPOCH
for k in res:
    print(k, "cpu ms/epoch:", {p: round(1000 * v / epochs, 2) for p, v in cpu[k].items()}, f"wall {1000*sum(res[k])/epochs:.2f} ms/epoch")
