"""The chaos checker (issue 11, item 8): a chain of jobs under a seeded nemesis, checked like Jepsen's queue.

    outside producer --> in (marker epochs) --job A (runtime, 2 workers; hot-swapped for A2)--> a
    a --job B (Spark Structured Streaming, aligned source and sink)--> b
    a --job F (Faust)--> f

Every component is its own OS process (so SIGKILL and SIGSTOP are real), logging to the run's
directory. A schedule of faults is drawn from the seed up front and printed; a restarter plays the
process supervisor and restarts only what was SIGKILLed. At the end everything is healed, the input
finished, the jobs drained, and every subject is read by epoch and checked record by record
(:mod:`experiments.chaos.checker`). Run ``python -m experiments.chaos --help``.
"""
