"""Epoch alignment protocol: ZooKeeper data model, layout and pure epoch logic.

Nothing in this package talks to Kafka or starts processes; connectors and the
coordinator call it.
"""
