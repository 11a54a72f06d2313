"""The embedded stack: ZooKeeper (one server or an ensemble), the Tansu broker and a Spark standalone
cluster, started on one machine for the demo, the tests and the benchmarks.

It is a development platform beside the coordinator, not part of it: the coordinator's ``aligner stack``
commands drive it, and nothing a production deployment runs imports it.
"""
