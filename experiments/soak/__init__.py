"""The soak (issue 23, item 4): the chaos chain left running for hours, sampled every minute, with a verdict.

``python -m experiments.soak --minutes 120`` plays the chain of :mod:`experiments.chaos` under a fault every
~30 s and a hot-swap of job A every 10 minutes (A -> A2 -> A3 ...), samples ZooKeeper (``mntr``: znodes,
approximate data size, watches; its data dir on disk), the RSS and CPU of every process (each component
with its children, ZooKeeper, the broker), how long ``aligner status --json`` takes and every subject's
frontier, optionally runs ``aligner gc`` as retention, and fails (exit 1, one line) on a stall, an anomaly of
the chaos checker or growth after the first retention window. Results: ``experiments/results/soak/``.
"""
