"""Lane.send_many of two commits in one process (per-record holding vs the batch's last record per partition),
on a producer with no broker (records queue in librdkafka; no network): us per record, 4 partitions, unkeyed
and keyed batches of 2,500. Usage: python micro_send_many.py OLD_STAMPED_PY NEW_STAMPED_PY"""
import importlib.util
import statistics
import sys
import time

from confluent_kafka import Producer

from aligner.stamps import Stamp


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Owner:
    def __init__(self) -> None:
        self.kp = Producer({"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 2_000_000,
                            "queue.buffering.max.kbytes": 2_000_000, "linger.ms": 100000, "log_level": 0})
        self.error = None
        self.name = "micro"


N, B = 200_000, 2500


def run(module, keyed: bool) -> float:
    owner = Owner()
    lane = module.Lane(owner, "s", [0, 1, 2, 3])
    lane.topic, lane._produce = "t", owner.kp.produce
    lane._open_epoch(Stamp("p", 1, 1))
    pairs = [(b"k%d" % (i % 97) if keyed else None, b"x" * 100) for i in range(N)]
    batches = [pairs[i:i + B] for i in range(0, N, B)]
    t = time.perf_counter()
    for b in batches:
        lane.send_many(b)
    d = time.perf_counter() - t
    owner.kp.purge()
    assert sum(lane.counts.values()) == N
    return d / N * 1e6


old, new = load(sys.argv[1], "stamped_old"), load(sys.argv[2], "stamped_new")
for keyed in (False, True):
    res: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(9):
        res["old"].append(run(old, keyed))
        res["new"].append(run(new, keyed))
    mo, mn = statistics.median(res["old"]), statistics.median(res["new"])
    print(f"{'keyed' if keyed else 'unkeyed'}: per-record holding {mo:.2f} us, last per partition {mn:.2f} us "
          f"(min {min(res['old']):.2f} / {min(res['new']):.2f}); new/old {mn / mo:.2f}")
