"""Testing aid of the aligned sink: hold one write task's first attempt at a chosen point.

Options: ``hangTask`` = ``"B/S"`` (micro-batch B, slot S; ``"*/S"``: any micro-batch once armed),
``hangAt`` = ``write`` (records flushed to Kafka, the transaction open) or ``precommit`` (the Kafka
transaction committed, the commit message not yet returned), ``hangFile`` (the attempt writes its process
id there, so a test finds the executor to kill), ``hangSeconds`` (default 3600; a short hold makes Spark
speculate) and ``hangArm`` (a file: the hold happens only while it exists, and the first attempt to get
there takes it, so a test picks the moment, e.g. a hot-swap's pre-commit).
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
    batch: int | None
    """None: any micro-batch (with ``arm``)."""
    slot: int
    point: str
    path: str
    seconds: int
    arm: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TaskHang | None:
        task = opt(options, "hangTask")
        if task is None:
            return None
        try:
            batch, slot = task.split("/")
            parsed = cls(None if batch == "*" else int(batch), int(slot), opt(options, "hangAt") or "write",
                         opt(options, "hangFile") or "", int_option(options, "hangSeconds", 3600, minimum=1) or 3600,
                         opt(options, "hangArm"))
        except ValueError:
            raise AlignedOptionError(f"option hangTask={task!r} is not BATCH/SLOT") from None
        if parsed.point not in POINTS or not parsed.path or (parsed.batch is None and not parsed.arm):
            raise AlignedOptionError(f"option hangTask needs hangAt (one of {', '.join(POINTS)}) and hangFile "
                                     "(and hangArm for any batch)")
        return parsed

    def at(self, point: str, ctx: Any, slot: int) -> None:
        """Hold here when this is the chosen point of the chosen task's first attempt."""
        if ctx is None or point != self.point or slot != self.slot or ctx.attemptNumber() != 0:
            return
        if self.batch is not None and ctx.getLocalProperty("streaming.sql.batchId") != str(self.batch):
            return
        if self.arm is not None:
            try:
                os.rename(self.arm, f"{self.arm}.taken")  # atomic: one attempt takes the arm
            except OSError:
                return
        tmp = f"{self.path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, self.path)
        parent, deadline = os.getppid(), time.monotonic() + self.seconds
        while time.monotonic() < deadline and os.getppid() == parent:  # not outliving a killed executor
            time.sleep(0.2)
