"""Prometheus metrics of the protocol; connectors add their own beside these."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ZK_ROUND_TRIPS = Counter("aligner_zk_round_trips_total", "ZooKeeper requests made", ["kind"])
EPOCHS_COMMITTED = Counter("aligner_epochs_committed_total", "Producer epoch commits", ["subject", "sink"])
RECORDS_SENT = Counter("aligner_records_sent_total", "Records sent by sinks", ["subject", "sink"])
EPOCHS_RESTAMPED = Counter(
    "aligner_epochs_restamped_total",
    "Unstamped epoch attempts aborted because another writer's records lay among their own, written again stamped",
    ["subject", "sink"])
RECORDS_READ = Counter("aligner_records_read_total", "Records returned by exact epoch reads", ["subject"])
RECORDS_DROPPED = Counter(
    "aligner_records_dropped_total", "Records dropped because their stamp is not the committed attempt", ["subject"]
)
LAST_EPOCH = Gauge(
    "aligner_last_committed_epoch", "Last epoch committed by a producer", ["subject", "sink", "producer"]
)
ZK_CONNECTED = Gauge("aligner_zk_connected", "1 while this process's ZooKeeper session is connected")
ZK_OUTAGES = Counter("aligner_zk_outages_total", "ZooKeeper connection losses and session expiries seen")
INPUT_WAIT = Gauge(
    "aligner_input_wait_seconds", "Seconds a job worker has been waiting for its next input epoch", ["job", "worker"]
)
KAFKA_RETRIES = Counter(
    "aligner_epoch_retries_total", "Epochs aborted on a Kafka or ZooKeeper failure and run again", ["job", "worker"]
)
COMMIT_SECONDS = Histogram(
    "aligner_epoch_commit_seconds",
    "A sink's epoch commit: Kafka flush and transaction commit, then the ZooKeeper multi-op",
    ["subject", "sink"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
