"""The source's per-run hot path (SubjectSource._take) on 200k real messages, GC frozen: with slice counts
(no stamp header read) and with every stamp checked.

    PYTHONPATH=. .venv/bin/python experiments/results/profiles/micro_take.py
"""
import time, gc, types, sys
from collections import deque
from confluent_kafka import Consumer, TopicPartition
from aligner.connectors.kafka import consumer_config
from aligner.connectors.sink import SinkProducer
from aligner.connectors import source as srcmod
from aligner.connectors.subjects import create_subject
from aligner.coordinator.stack import EmbeddedStack
from aligner.ledger import Ledger

N = 200_000
with EmbeddedStack() as info:
    led = Ledger.connect(info.zk, "/m")
    create_subject(led, info.kafka, "in", 1)
    with SinkProducer(led, info.kafka, "in", "gen", 0, [0]) as sink:
        for e in range(N // 10000):
            sink.begin()
            for j in range(10000):
                sink.send(b"v" * 100, partition=0)
            sink.commit()
    topic = led.subject("in").topic
    ces = [led.committed("in", e) for e in range(N // 10000)]
    c = Consumer(consumer_config(info.kafka))
    c.assign([TopicPartition(topic, 0, 0)])
    msgs = []
    while len(msgs) < N:
        msgs += [m for m in c.consume(10000, 0.5) if m.error() is None]
    c.close(); led.close()
gc.freeze()
fake = types.SimpleNamespace(mode="exactly_once", _stop_at_bound=lambda part: None)
def one(nostamp):
    part = srcmod._Part("in", topic, 0, pos=0, bound=ces[-1].slices[0].end)
    for ce in ces:
        sl = ce.slices[0]
        if nostamp:
            import dataclasses
            sl = dataclasses.replace(sl, count=None)
        part.segments.append((ce.epoch, sl.start, sl.end, sl.stamp, sl))
    t = time.perf_counter()
    total = 0
    for i in range(0, N, 10000):
        out = []
        srcmod.SubjectSource._take(fake, part, msgs, i, i + 10000, out)
        total += len(out)
        out = None
    assert total == N, total
    return time.perf_counter() - t
for label, ns in (("counts (no stamps)", False), ("stamps checked", True)):
    best = min(one(ns) for _ in range(5))
    print(f"{1e6*best/N:.3f} us/record  _take {label}")
