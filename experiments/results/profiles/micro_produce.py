"""Per-call cost of confluent_kafka Producer.produce variants and of Lane.send, without a broker.

The producer points at an unreachable broker, so produce() only queues in librdkafka: this is the
CPU a produce call costs the calling thread (what every raw loop and the sink pay per record), not
batching, network or broker time. Best of 15 repeats of 100,000 calls each.

    .venv/bin/python experiments/results/profiles/micro_produce.py
"""
from __future__ import annotations

import time
from time import time_ns

from confluent_kafka import Producer

from aligner.stamps import HEADER, Stamp

N = 100_000
VALUE = b"x" * 100
STAMP = [(HEADER, Stamp("sink", 123, 1).encode())]


def fresh() -> Producer:
    return Producer({"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 2_000_000,
                     "queue.buffering.max.kbytes": 2_000_000, "linger.ms": 60000, "log_level": 0,
                     "message.timeout.ms": 600000})


REPEATS = 15


def bench(name: str, body) -> float:
    best = float("inf")
    kp = fresh()
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        body(kp)
        best = min(best, time.perf_counter() - t0)
        kp.purge()
        kp.poll(0)
    us = 1e6 * best / N
    print(f"{us:6.3f} us/record  {name}", flush=True)
    return us


def cb(err, msg):
    pass


def main() -> None:
    def raw(kp):
        produce = kp.produce
        for i in range(N):
            produce("t", VALUE, partition=i % 4)

    def raw_pos(kp):
        produce = kp.produce
        for i in range(N):
            produce("t", VALUE, None, i % 4)

    def header(kp):
        produce = kp.produce
        for i in range(N):
            produce("t", VALUE, partition=i % 4, headers=STAMP)

    def header_ts_pos(kp):  # exactly what Lane.send passes
        produce = kp.produce
        for i in range(N):
            produce("t", VALUE, None, i % 4, None, None, time_ns() // 1_000_000, STAMP)

    def header_dict(kp):
        produce = kp.produce
        h = dict(STAMP)
        for i in range(N):
            produce("t", VALUE, partition=i % 4, headers=h)

    def header_cb(kp):
        produce = kp.produce
        for i in range(N):
            produce("t", VALUE, partition=i % 4, headers=STAMP, on_delivery=cb)

    def short_header(kp):
        produce = kp.produce
        h = [("s", b"1")]
        for i in range(N):
            produce("t", VALUE, partition=i % 4, headers=h)

    def ts_only(kp):
        produce = kp.produce
        for i in range(N):
            produce("t", VALUE, None, i % 4, None, None, time_ns() // 1_000_000)

    def loop_only(kp):
        for i in range(N):
            i % 4

    def time_ns_only(kp):
        for i in range(N):
            time_ns() // 1_000_000

    base = bench("loop only (for i; i % 4)", loop_only)
    bench("time_ns() // 1_000_000", time_ns_only)
    r = bench("produce(t, v, partition=p)                       [raw loop]", raw)
    bench("produce(t, v, None, p) positional", raw_pos)
    bench("produce(..., timestamp=now) positional, no header", ts_only)
    h = bench("produce(..., headers=[stamp])                    [raw + stamp]", header)
    bench("produce(..., headers={stamp dict})", header_dict)
    bench("produce(..., headers=[('s', b'1')]) (tiny header)", short_header)
    bench("produce(positional, timestamp, headers=[stamp])  [what Lane.send passes]", header_ts_pos)
    bench("produce(..., headers=[stamp], on_delivery=cb)    (C side; cb never runs here)", header_cb)
    print(f"stamp header adds {h - r:.3f} us/record to produce() (loop {base:.3f} us)")

    from aligner.connectors.stamped import StampedProducer

    def lane(kp):
        sp = StampedProducer("127.0.0.1:1", "micro", "s", [0, 1, 2, 3])
        sp._kp = kp
        sp.topic = "t"
        sp._produce = kp.produce
        sp._open_epoch(Stamp("sink", 123, 1))
        return sp

    def send_partition(kp):  # bench_sink's call
        send = lane(kp).send
        for i in range(N):
            send(VALUE, partition=i % 4)

    def send_rr(kp):  # JobWorker._process's call: send(value, key) with key None -> round-robin pick()
        send = lane(kp).send
        for i in range(N):
            send(VALUE, None)

    s1 = bench("Lane.send(v, partition=p)  [bench_sink]", send_partition)
    s2 = bench("Lane.send(v, None)  round-robin [JobWorker._process]", send_rr)
    print(f"Lane.send Python overhead over the produce call it makes: {s1 - h:.3f} / {s2 - h:.3f} us/record")


if __name__ == "__main__":
    main()
