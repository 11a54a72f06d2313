"""The nemesis schedule: drawn from the seed up front, printed, then played by the run's main loop."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

KILLS = ("kill-worker", "kill-coordinator", "kill-marker", "kill-spark", "kill-faust")
FAULT_WEIGHTS: dict[str, float] = {
    "kill-worker": 3.0, "kill-coordinator": 1.0, "kill-marker": 1.5, "kill-spark": 1.0, "kill-faust": 1.5,
    "pause-zk": 1.5, "pause-broker": 1.5, "restart-zk": 1.5, "expire-session": 1.0, "kill-executor": 1.5,
    "restart-spark-worker": 1.0, "damage-state": 1.5, "damage-zk": 1.0,
    "cut-zk": 2.0, "cut-kafka": 1.5, "cut-both": 1.5, "split-zk": 1.5, "bridge-zk": 0.75, "slow-link": 1.5,
    "cut-driver": 1.0, "skew-clock": 1.5,
}
"""Relative frequency of each fault kind."""
OPS = ("align", "abort", "hotswap")
CLUSTER = ("kill-executor", "restart-spark-worker")
"""Faults of a Spark standalone cluster: drawn only when the Spark job runs on one."""
ROCKSDB = ("damage-state",)
"""Faults of job A's RocksDB state: drawn only when its workers keep state there."""
ENSEMBLE = ("damage-zk",)
"""Faults of a ZooKeeper ensemble member's disk: drawn only on an ensemble."""
NETWORK = ("cut-zk", "cut-kafka", "cut-both", "split-zk", "bridge-zk", "slow-link", "cut-driver", "skew-clock")
"""Faults of the network between components (and of one component's clock): drawn only with every component
in a network namespace of its own (``--netns``)."""
QUORUM = ("split-zk", "bridge-zk")
"""Network faults among the servers of a ZooKeeper ensemble: drawn only on one."""
COMPONENTS = ("worker 0", "worker 1", "marker", "coordinator", "spark", "faust", "executor 0", "executor 1")
"""What a cut or a clock skew hits (executors only on a cluster, faust only with the Faust job)."""
SKEW = (60.0, 600.0)
"""Seconds a skewed clock is off, forward or back (drawn in this range)."""


@dataclass(frozen=True)
class Fault:
    """One nemesis action at ``at`` seconds into the run, lasting ``duration`` (0 for a kill)."""

    at: float
    kind: str
    target: str = ""
    duration: float = 0.0

    def describe(self) -> str:
        target = f" {self.target}" if self.target else ""
        span = f" for {self.duration:.1f}s" if self.duration else ""
        return f"{self.at:7.1f}s  {self.kind}{target}{span}"


def _duration(kind: str, rng: random.Random) -> float:
    if kind == "pause-zk":
        return round(rng.uniform(1.0, 6.0), 1)
    if kind == "pause-broker":
        return round(rng.uniform(1.0, 8.0), 1)
    if kind == "restart-zk":
        return round(rng.uniform(0.5, 6.0), 1)
    if kind == "damage-zk":
        return round(rng.uniform(2.0, 8.0), 1)  # the member stays down this long, its disk damaged
    if kind == "restart-spark-worker":
        return round(rng.uniform(2.0, 10.0), 1)  # down this long, then started again
    if kind == "expire-session":
        return round(rng.uniform(12.5, 14.0), 1)  # longer than the 10 s session timeout (Ledger.connect)
    if kind in ("cut-zk", "cut-kafka", "cut-both", "cut-driver"):
        return round(rng.uniform(2.0, 25.0), 1)  # about half of them outlast the 10 s session timeout
    if kind in ("split-zk", "bridge-zk", "slow-link"):
        return round(rng.uniform(3.0, 15.0), 1)
    if kind == "skew-clock":
        return round(rng.uniform(5.0, 30.0), 1)
    return 0.0


def _network_target(kind: str, rng: random.Random, faust: bool, cluster: bool, turn: int) -> str:
    """The target of a network or clock fault: a component, or for the ensemble's own faults which side the
    leader is on (``turn`` alternates it), and for a skew how far and which way."""
    if kind in QUORUM:
        return "leader" if turn % 2 == 0 else "follower"
    parts = [c for c in COMPONENTS if (faust or c != "faust") and (cluster or not c.startswith("executor"))]
    if kind == "cut-driver":
        return f"executor {rng.randrange(2)}"
    if kind == "slow-link":
        return rng.choice([*parts, "broker", "zk leader"])
    target = rng.choice(parts)
    if kind == "skew-clock":
        target = rng.choice([p for p in parts if not p.startswith("executor")])
        return f"{target} {rng.choice('+-')}{round(rng.uniform(*SKEW))}s"
    return target


def schedule(seed: int, faults: int, duration: float, start: float = 8.0,
             faust: bool = True, cluster: bool = False, rocksdb: bool = False,
             ensemble: bool = False, netns: bool = False, quorum: bool = False) -> tuple[list[Fault], list[Fault]]:
    """(faults, coordinator operations) of one run. Faults are sequential, with random gaps filling
    ``duration`` (longer when the faults need it); operations run beside them in the coordinator's lane:
    align A early, maybe abort and re-align it, hot-swap A for A2 midway, align/abort F at random. Executor
    kills only with the Spark job on a ``cluster``; state damage only with job A's state in ``rocksdb``;
    a member's disk damage only on an ``ensemble``; network and clock faults only with ``netns``, those among
    ZooKeeper servers only on a ``quorum`` (three servers or more), cuts between driver and executors only on a
    ``cluster``. Without ``netns`` a seed's plan is what it always was."""
    rng = random.Random(seed)
    kinds = [k for k in FAULT_WEIGHTS if (faust or k != "kill-faust") and (cluster or k not in CLUSTER)
             and (rocksdb or k not in ROCKSDB) and (ensemble or k not in ENSEMBLE)
             and (netns or k not in NETWORK) and (quorum or k not in QUORUM) and (cluster or k != "cut-driver")]
    weights = [FAULT_WEIGHTS[k] for k in kinds]
    drawn = [rng.choices(kinds, weights)[0] for _ in range(faults)]
    busy = sum(_duration(k, random.Random(f"{seed}/{i}")) for i, k in enumerate(drawn))
    mean_gap = max(0.3, (duration - start - busy) / max(1, faults))
    out: list[Fault] = []
    t = start
    for i, kind in enumerate(drawn):
        d = _duration(kind, random.Random(f"{seed}/{i}"))
        target = ""
        if kind in ("kill-worker", "expire-session", "damage-state"):
            target = f"worker {rng.randrange(2)}"
        elif kind == "restart-spark-worker":
            target = f"spark worker {rng.randrange(2)}"
        elif kind == "pause-zk":  # on an ensemble: its leader or a follower (a side draw: seeds keep their plan)
            target = random.Random(f"{seed}/{i}/zk").choice(["leader", "follower"])
        elif kind in NETWORK:
            turn = sum(1 for f in out if f.kind == kind)
            target = _network_target(kind, random.Random(f"{seed}/{i}/net"), faust, cluster, turn)
        out.append(Fault(round(t, 1), kind, target, d))
        t += d + rng.uniform(0.5 * mean_gap, 1.5 * mean_gap)
    end = max(t, duration)
    ops: list[Fault] = [Fault(round(rng.uniform(0.08, 0.15) * end, 1), "align", "A")]
    swap_at = rng.uniform(0.4, 0.6) * end
    if rng.random() < 0.6:
        abort_at = rng.uniform(ops[0].at + 5, swap_at - 10)
        ops += [Fault(round(abort_at, 1), "abort", "A"), Fault(round(abort_at + rng.uniform(2, 6), 1), "align", "A")]
    ops.append(Fault(round(swap_at, 1), "hotswap", "A -> A2"))
    f_ops = sorted(rng.uniform(0.1, 0.9) * end for _ in range(rng.randint(2, 4)))
    for i, at in enumerate(f_ops if faust else []):
        ops.append(Fault(round(at, 1), "align" if i % 2 == 0 else "abort", "F"))
    ops.sort(key=lambda f: f.at)
    return out, ops


def as_json(faults: list[Fault]) -> list[dict[str, object]]:
    return [asdict(f) for f in faults]
