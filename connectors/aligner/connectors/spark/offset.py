"""The one offset shape of ``spark.readStream.format("aligned")``: a typed model Spark keeps as JSON.

``{"epochs": {subject: N}}``: every epoch before N of each subject has been read. A query running as an
aligned job adds what its planner decided for the micro-batch that ends here: ``job`` (the next job epoch
to plan), ``first`` (the batch's first job epoch: it covers ``first`` .. ``job`` - 1) and ``act`` (``write``
or ``void``), so the decision travels with the batch to its read tasks (and from them to its write tasks)
instead of being taken again. Offsets written by earlier versions (``{"epoch": N}`` for one subject, a job's
offset without ``act``) are read too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from aligner.errors import AlignerError

Act = Literal["write", "void"]


class StreamOffset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: dict[str, int]
    job: int | None = None
    first: int | None = None
    act: Act | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any], subjects: Sequence[str]) -> StreamOffset:
        """An offset Spark hands back (from its offset log), checked to cover exactly ``subjects``."""
        data = dict(raw)
        if "epoch" in data and "epochs" not in data and len(subjects) == 1:  # the one-subject shape before 0.x
            data = {"epochs": {subjects[0]: data.pop("epoch")}, **data}
        try:
            offset = cls.model_validate(data)
        except ValidationError:
            offset = None
        if offset is None or set(offset.epochs) != set(subjects):
            raise AlignerError(f"offset {dict(raw)!r} of format('aligned') is not an epoch vector "
                               f"{{'epochs': {{subject: N}}}} over the subjects {list(subjects)}")
        return offset

    def dump(self) -> dict[str, Any]:
        """The JSON object Spark stores (fields left unset are left out)."""
        return self.model_dump(exclude_none=True)

    @property
    def job_span(self) -> tuple[int, int] | None:
        """The job epochs [first, last] of the batch that ended here, when one was planned."""
        if self.job is None or self.first is None:
            return None
        return self.first, self.job - 1

    @property
    def writes(self) -> bool | None:
        """The planner's decision for the batch that ended here (None: an offset without one)."""
        return None if self.act is None else self.act == "write"
