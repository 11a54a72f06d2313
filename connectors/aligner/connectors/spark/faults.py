"""Testing aid of the aligned sink: hold one write task's first attempt at a chosen point.

Options (all four together): ``hangTask`` = ``"B/S"`` (micro-batch B, slot S), ``hangAt`` = ``write``
(records flushed to Kafka, the transaction open) or ``precommit`` (the Kafka transaction committed, the
commit message not yet returned), ``hangFile`` (the attempt writes its process id there, so a test
finds the executor to kill) and ``hangSeconds`` (default 3600; a short hold makes Spark speculate).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aligner.connectors.spark.common import AlignedOptionError, int_option, opt

POINTS = ("write", "precommit")


@dataclass(frozen=True)
class TaskHang:
    batch: int
    slot: int
    point: str
    path: str
    seconds: int

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TaskHang | None:
        task = opt(options, "hangTask")
        if task is None:
            return None
        try:
            batch, slot = (int(v) for v in task.split("/"))
        except ValueError:
            raise AlignedOptionError(f"option hangTask={task!r} is not BATCH/SLOT") from None
        point, path = opt(options, "hangAt") or "write", opt(options, "hangFile")
        if point not in POINTS or not path:
            raise AlignedOptionError(f"option hangTask needs hangAt (one of {', '.join(POINTS)}) and hangFile")
        return cls(batch, slot, point, path, int_option(options, "hangSeconds", 3600, minimum=1) or 3600)

    def at(self, point: str, ctx: Any, slot: int) -> None:
        """Hold here when this is the chosen point of the chosen task's first attempt."""
        if ctx is None or point != self.point or slot != self.slot or ctx.attemptNumber() != 0:
            return
        if ctx.getLocalProperty("streaming.sql.batchId") != str(self.batch):
            return
        tmp = f"{self.path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, self.path)
        parent, deadline = os.getppid(), time.monotonic() + self.seconds
        while time.monotonic() < deadline and os.getppid() == parent:  # not outliving a killed executor
            time.sleep(0.2)
