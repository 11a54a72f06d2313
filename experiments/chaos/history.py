"""What the ledger said was committed while the run went on, to hold the end state against.

A committed epoch is final: its slices (the range and the stamped attempt of each producer) never change
and it is never gone. Two incarnations of a producer that both commit an epoch (a zombie cut off from
ZooKeeper while its successor took over: fencing failed) show as an epoch whose slices changed between a
look during the run and the end; a ledger that loses acknowledged writes (a ZooKeeper rollback) shows as an
epoch seen committed and missing at the end. A helper thread reads the frontier of each subject every
``interval`` seconds through its own ledger session and records each newly committed epoch once.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from aligner.epochs import CommittedEpoch
from aligner.ledger import Ledger

Slices = dict[int, tuple[int, int, str | None]]


def slices_of(ce: CommittedEpoch) -> Slices:
    return {p: (s.start, s.end, s.stamp.decode() if isinstance(s.stamp, bytes) else s.stamp)
            for p, s in ce.slices.items()}


class History:
    """Every committed epoch of ``subjects`` as first seen; :meth:`stop` before judging."""

    def __init__(self, zk: str, root: str, subjects: list[str], interval: float = 1.0) -> None:
        self.zk, self.root, self.subjects, self.interval = zk, root, subjects, interval
        self.seen: dict[str, dict[int, Slices]] = {s: {} for s in subjects}
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="chaos-history")

    def start(self) -> History:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        led: Ledger | None = None
        while not self._stop.wait(self.interval):
            try:
                if led is None:
                    led = Ledger.connect(self.zk, self.root)
                self.look(led)
            except Exception:  # ZooKeeper away or slow: look again later, a later look sees the same epochs
                if led is not None:
                    with contextlib.suppress(Exception):
                        led.close()
                led = None
        if led is not None:
            with contextlib.suppress(Exception):
                led.close()

    def look(self, led: Ledger) -> None:
        for subject in self.subjects:
            known = self.seen[subject]
            last = led.epochs.frontier(subject)
            if last is None:
                continue
            first = max(known) + 1 if known else (led.subjects.epoch_numbers(subject) or [last])[0]
            if first > last:
                continue
            for ce in led.epochs.committed_many(subject, first, last):
                known.setdefault(ce.epoch, slices_of(ce))
        self.looks += 1

    def judge(self, final: dict[str, list[CommittedEpoch]], retained: bool) -> list[tuple[str, str, str]]:
        """(class, subject, example) of each anomaly. ``fencing``: an epoch whose slices at the end differ from
        a look during the run; ``missing_commit``: an epoch seen committed and gone at the end (not judged when
        retention collected epochs)."""
        out: list[tuple[str, str, str]] = []
        for subject, epochs in self.seen.items():
            at_end = {ce.epoch: slices_of(ce) for ce in final.get(subject, [])}
            for epoch, slices in sorted(epochs.items()):
                end = at_end.get(epoch)
                if end is None:
                    if not retained:
                        out.append(("missing_commit", subject, f"epoch {epoch} was committed, then gone"))
                elif end != slices:
                    diff = {p: (slices.get(p), end.get(p)) for p in set(slices) | set(end)
                            if slices.get(p) != end.get(p)}
                    out.append(("fencing", subject, f"epoch {epoch} committed as {diff} (then, at the end)"))
        return out

    def as_json(self) -> dict[str, Any]:
        return {"looks": self.looks, "epochs_seen": {s: len(e) for s, e in self.seen.items()}}
