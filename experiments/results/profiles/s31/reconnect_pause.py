"""Time from a 10 s broker pause's end to a lagging, probing consumer's first record produced after it."""
import os, signal, sys, threading, time
from confluent_kafka import Consumer, Producer, TopicPartition
from aligner.coordinator.stack import EmbeddedStack
from aligner.connectors.kafka import QUIET, consumer_config, probe
from aligner.connectors.subjects import create_subject
from aligner.ledger import Ledger

stack = EmbeddedStack(); info = stack.start()
try:
    led = Ledger.connect(info.zk, "/exp")
    topic = "t-pause"
    create_subject(led, info.kafka, topic, 1)
    p = Producer({"bootstrap.servers": info.kafka, "batch.num.messages": 1, "linger.ms": 0, **QUIET})
    N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    for n in range(N):
        while True:
            try: p.produce(topic, b"x%d" % n, partition=0); break
            except BufferError: p.poll(0.05)
        p.poll(0)
    p.flush(60)
    variants = [("default", {}), ("backoff1s", {"reconnect.backoff.max.ms": 1000})]
    for trial in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
        for name, extra in variants:
            c = Consumer(consumer_config(info.kafka, extra))
            c.assign([TopicPartition(topic, 0, N - 200)])
            got = 0
            while got < 150:
                for m in c.consume(1000, 0.1):
                    if m.error() is None: got += 1
            marker = b"after-%d-%s" % (trial, name.encode())
            os.kill(info.kafka_pid, signal.SIGSTOP)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:  # lagging and probing each second, as the source does
                c.consume(1000, 0.1)
                probe(c, topic, 0)
            os.kill(info.kafka_pid, signal.SIGCONT)
            resumed = time.monotonic()
            p.produce(topic, marker, partition=0); p.flush(60)
            produced = time.monotonic() - resumed
            seen = None
            while seen is None and time.monotonic() - resumed < 120:
                for m in c.consume(1000, 0.1):
                    if m.error() is None and m.value() == marker: seen = time.monotonic() - resumed
                if time.monotonic() - resumed > 1:
                    probe(c, topic, 0)
            print(f"trial {trial} {name}: produced {produced:.1f}s after resume, consumer saw it {seen}", flush=True)
            c.close()
finally:
    for proc in stack.processes():
        if proc.poll() is None: os.kill(proc.pid, signal.SIGCONT)
    stack.stop()
