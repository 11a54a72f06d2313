"""Kafka source of a job: one consumer's partitions of every input subject.

The source follows the subjects' committed epochs: it loads each committed epoch's slices, hands
over records up to the end of the last loaded epoch (never further) and keeps a record only when
its stamp is the committed attempt (its header is not even read where the slice's record count
shows that nothing else lies in the rest of the range). Past the last loaded epoch it fetches only
into a capped stash, and only while the next epoch is committed already (a job catching up).
A load limit per subject is how alignment works: a consumer that must end a job epoch exactly at
subject epoch k loads nothing past k and checkpoints once its position reaches k's end on every
partition. In at-least-once mode the source reads whatever Kafka shows, unbounded and unfiltered.

A watchdog looks once a second: a partition with data to read that has not moved for a while is
reported (once, and again when it moves) and, when the broker answers but fetches come back empty,
read on with a consumer that waits longer per fetch. The source never gives up on a slow broker.

The parts, one job each: ``positions`` (where each partition stands), ``loader`` (committed epochs into
bounds), ``fetch`` (the consumer, the stash and the per-run hot path), ``watch`` (the watchdog), ``record``
(what a job function gets) and ``subject`` (``SubjectSource``, what the engines call).
"""

from aligner.connectors.source.fetch import source_settings
from aligner.connectors.source.record import Records, SourceRecord
from aligner.connectors.source.subject import SubjectSource

__all__ = ["Records", "SourceRecord", "SubjectSource", "source_settings"]
