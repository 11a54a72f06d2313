"""Stress offset look-ups against the embedded broker: AdminClient.list_offsets (`admin`) or the product's
end_offsets through a consumer (`consumer`), as fast as they go; a crash leaves its stack on stderr."""
import faulthandler
import sys
import time

faulthandler.enable(all_threads=True)
from confluent_kafka import IsolationLevel, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import OffsetSpec  # noqa: E402

from aligner.connectors.kafka import admin, end_offsets, ensure_topic  # noqa: E402
from aligner.coordinator.stack import EmbeddedStack  # noqa: E402

seconds, mode = float(sys.argv[1]), sys.argv[2]
st = EmbeddedStack()
info = st.start()
try:
    bs = info.kafka
    ensure_topic(bs, "lo", 2)
    p = Producer({"bootstrap.servers": bs})
    for i in range(1000):
        p.produce("lo", b"x", partition=i % 2)
    p.flush()
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        parts = [n % 2] if n % 3 else [0, 1]
        if mode == "admin":
            spec = OffsetSpec.earliest() if n % 2 else OffsetSpec.latest()
            fs = admin(bs).list_offsets({TopicPartition("lo", q): spec for q in parts},
                                        isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30)
            [f.result(30) for f in fs.values()]
        else:
            end_offsets(bs, "lo", parts, earliest=bool(n % 2))
        n += 1
        if n % 5000 == 0:
            print(n, round(time.monotonic() - end + seconds), flush=True)
    print("ok", mode, n, "calls in", seconds, "s")
finally:
    st.stop()
