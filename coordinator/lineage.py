"""Lineage moved to the ledger layer (it only reads the ledger): see :mod:`aligner.lineage`.

Kept as a re-export for callers of the old name; new code imports ``aligner.lineage``.
"""

from __future__ import annotations

from aligner.lineage import flatten, job_epoch_lineage, subject_epoch_lineage

__all__ = ["flatten", "job_epoch_lineage", "subject_epoch_lineage"]
