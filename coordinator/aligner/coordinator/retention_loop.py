"""The leading coordinator applies retention by itself, so ZooKeeper state is bounded by policy, not uptime.

``aligner retention run`` contends for leadership among retention loops (kazoo's Election recipe on
``coordinator/retention``); a second instance waits as a standby and takes over when the leader's session
goes. The leader runs one :func:`aligner.coordinator.gc.collect` pass every interval, logs one line per
pass and exports Prometheus metrics. Before each pass it checks it still leads (a session that expired
lost the lock node), so two instances never collect at once. Each pass also holds the coordinators'
election (the one ``aligner align``/``hotswap`` hold while they work) for the pass only: a pass never
overlaps an alignment or a hot-swap, and one of those waits at most one pass (holding that election
between passes made every ``align`` wait for the loop forever).
ZooKeeper outages are ridden out by the ledger's retrying session; the stop flag ends every wait. The
Election recipe's own calls block while ZooKeeper is away (kazoo queues them until it is back), so they
run on a helper thread the loop waits for in slices: SIGTERM stops it within a second, outage or not.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import KazooException, LockTimeout
from prometheus_client import Counter, Gauge

from aligner.errors import AlignerError, StoppedError
from aligner.ledger import Ledger
from aligner.retention_policy import RetentionPolicy

log = logging.getLogger(__name__)

LEADER = Gauge("aligner_retention_leader", "1 while this process leads and applies retention")
PASSES = Counter("aligner_retention_passes_total", "Retention passes run by this process", ["outcome"])
DELETED_EPOCHS = Counter("aligner_retention_deleted_epochs_total", "Subject epochs retention removed")
DELETED_NODES = Counter("aligner_retention_deleted_nodes_total", "ZooKeeper nodes retention removed")
PASS_SECONDS = Gauge("aligner_retention_pass_seconds", "Duration of the last retention pass")
LAST_PASS = Gauge("aligner_retention_last_pass_timestamp_seconds", "When the last retention pass ended")
FIRST_RETAINED = Gauge("aligner_retention_first_retained_epoch", "A subject's first retained epoch", ["subject"])

_CONTEND = 0.5
"""Seconds a standby waits on the election lock before contending again."""
_SLICE = 0.2
"""Seconds between looks at the stop flag while an election call is in flight."""
_PASS_WAIT = 5.0
"""Seconds a pass waits for the coordinators' election before the leader checks its own again."""

T = TypeVar("T")


def summary(report: dict[str, Any], seconds: float) -> str:
    """One line per pass: what it removed."""
    subjects = report["subjects"]
    epochs = sum(r["deleted_epochs"] for r in subjects.values())
    touched = sorted(f"{s}<{r['first_retained']}" for s, r in subjects.items() if r["deleted_epochs"])
    swapped = sorted(j for j, r in report["jobs"].items() if r["swapped_out"] and r["deleted_nodes"])
    return (f"retention pass: removed {epochs} epochs of {len(touched)} subjects, {report['deleted_nodes']} nodes "
            f"({report['spark_batches']} Spark batch records) in {seconds:.2f}s"
            + (f"; floors {', '.join(touched)}" if touched else "")
            + (f"; swapped-out jobs cleared: {', '.join(swapped)}" if swapped else ""))


class RetentionLoop:
    """Lead, then collect every ``every`` seconds until ``stop``; a standby until it leads."""

    def __init__(self, ledger: Ledger, policy: RetentionPolicy, every: float, stop: threading.Event,
                 say: Callable[[str], object] = log.info, identifier: str | None = None) -> None:
        self.ledger = ledger
        self.policy = policy
        self.every = every
        self.stop = stop
        self.say = say
        self.me = identifier or uuid.uuid4().hex
        self.passes = 0
        ledger.stop_on(stop)

    def run(self) -> None:
        """Contend, lead, and contend again after losing leadership, until the stop flag is set."""
        election = self.ledger.jobs.retention_election(self.me)
        waiting_said = False
        while not self.stop.is_set():
            try:
                acquired = self._stoppable(lambda: election.lock.acquire(timeout=_CONTEND))
            except StoppedError:
                return
            except LockTimeout:
                acquired = False
            except KazooException as exc:  # ZooKeeper down: contend again once it is back
                log.warning("retention: election unavailable (%s); retrying", type(exc).__name__)
                self.stop.wait(1.0)
                continue
            if not acquired:
                if not waiting_said:
                    self.say(f"retention: standby ({self.me}); another retention loop leads")
                    waiting_said = True
                continue
            try:
                self.say(f"retention: leading ({self.me}), a pass every {self.every:g}s")
                self._lead(election)
            finally:
                LEADER.set(0)
                waiting_said = False
                with contextlib.suppress(KazooException, StoppedError):
                    self._stoppable(election.lock.release)

    def _stoppable(self, call: Callable[[], T]) -> T:
        """``call()`` on a helper thread, awaited in slices: the stop flag ends the wait with StoppedError
        (the thread ends when the session is closed)."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # handed to the waiting thread
                box["error"] = exc

        helper = threading.Thread(target=run, daemon=True, name="retention-election")
        helper.start()
        while helper.is_alive():
            helper.join(_SLICE)
            if helper.is_alive() and self.stop.is_set():
                raise StoppedError("stopped while waiting for the coordinators' election")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def leads(self, election: Any) -> bool:
        """Whether our lock node is still the first in line (a session that expired lost it)."""
        try:
            contenders = self._stoppable(election.contenders)
        except KazooException:
            return False
        return bool(contenders) and contenders[0] == self.me

    def _lead(self, election: Any) -> None:
        coordinators = self.ledger.jobs.election(f"retention-{self.me}")
        busy_said = False
        while not self.stop.is_set():
            try:
                still = self.leads(election)
            except StoppedError:
                return
            if not still:
                self.say("retention: lost leadership; contending again")
                return
            LEADER.set(1)
            try:
                free = self._stoppable(lambda: coordinators.lock.acquire(timeout=min(self.every, _PASS_WAIT)))
            except StoppedError:
                return
            except LockTimeout:
                free = False
            except KazooException as exc:  # ZooKeeper down: the next interval tries again
                log.warning("retention: coordinators' election unavailable (%s); retrying", type(exc).__name__)
                free = False
            if not free:
                if not busy_said:
                    self.say("retention: a coordinator (align or hotswap) is at work; passes wait for it")
                    busy_said = True
                continue  # a new try at once: the acquire above waited already
            busy_said = False
            try:
                self.once()
            finally:
                with contextlib.suppress(KazooException, StoppedError):
                    self._stoppable(coordinators.lock.release)
            self.stop.wait(self.every)

    def once(self) -> dict[str, Any] | None:
        """One pass; a failure is logged and the next interval tries again."""
        from aligner.coordinator.gc import collect

        began = time.monotonic()
        try:
            report = collect(self.ledger, policy=self.policy)
        except StoppedError:
            return None
        except (AlignerError, KazooException) as exc:
            PASSES.labels("failed").inc()
            self.say(f"retention pass failed: {exc}")
            return None
        except Exception as exc:  # an always-on loop outlives one bad pass; the next interval tries again
            PASSES.labels("failed").inc()
            log.exception("retention pass failed")
            self.say(f"retention pass failed ({type(exc).__name__}): {exc}")
            return None
        took = time.monotonic() - began
        self.passes += 1
        PASSES.labels("ok").inc()
        PASS_SECONDS.set(took)
        LAST_PASS.set(time.time())
        DELETED_EPOCHS.inc(sum(r["deleted_epochs"] for r in report["subjects"].values()))
        DELETED_NODES.inc(report["deleted_nodes"])
        for subject, r in report["subjects"].items():
            FIRST_RETAINED.labels(subject).set(r["first_retained"])
        self.say(summary(report, took))
        return report
