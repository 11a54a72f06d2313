"""The runtime engine: plain Python jobs run as epoch jobs (consume -> user function -> stamped sink).

The engine's parts live in this package (``job`` drives one worker's epochs, ``worker`` is the
``aligner-worker`` process, ``state`` the keyed state and its changelog); this module names what a
job's author imports.
"""

from aligner.connectors.runtime.job import JobWorker, one_line, settle_heap
from aligner.connectors.runtime.job_spec import JobFunction, JobSpec, KeyedState, StateKind, batch

__all__ = ["JobFunction", "JobSpec", "JobWorker", "KeyedState", "StateKind", "batch", "one_line", "settle_heap"]
