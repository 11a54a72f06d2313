"""The composition of both swaps per job epoch (aligner.epoch_step), model-checked without I/O.

Three versions v1 -> v2 -> v3 of one job: swap A hands the target from v1 to v2 at S, swap B from v2
to v3 at S' (B is the outgoing swap of v2 and the incoming one of v3). Hypothesis draws every
interleaving of the coordinators' steps (pre-commit, acknowledgements, commit, finish, abort, a
later S) with the workers' job epochs, and kills (a worker restarts from its persisted state: its
next epoch, its reported acknowledgement when the engine persists it). The checks: each job epoch's
output is written by exactly one version, none is lost, and S+1 is never committed before S.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner import epoch_step, swap
from aligner.epoch_step import Act
from aligner.models import Phase, SwapNode


@dataclass
class Worker:
    """One version's worker: what it persists (next epoch, in Spark's case its acknowledgement) and
    what it keeps in memory (the runtime's acknowledgement)."""

    name: str
    incoming: str | None
    outgoing: str | None
    persist_ack: bool
    next: int = 0
    seen: tuple[int, int] | None = None
    finished: bool = False


@dataclass
class World:
    swaps: dict[str, SwapNode | None] = field(default_factory=lambda: {"A": None, "B": None})
    written: dict[int, list[str]] = field(default_factory=dict)
    """Target epoch -> the versions that committed output for it, in commit order."""
    acks: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    horizon: int = 30


OLD_OF = {"A": "v1", "B": "v2"}
NEW_OF = {"A": "v2", "B": "v3"}


def _workers(persist: tuple[bool, bool, bool]) -> dict[str, Worker]:
    return {"v1": Worker("v1", None, "A", persist[0]), "v2": Worker("v2", "A", "B", persist[1]),
            "v3": Worker("v3", "B", None, persist[2])}


def _run_epoch(w: Worker, world: World) -> None:
    inc = world.swaps[w.incoming] if w.incoming else None
    last_written = w.outgoing is None and inc is not None and inc.phase == Phase.DONE
    if w.finished or (last_written and w.next >= world.horizon):
        return
    out = world.swaps[w.outgoing] if w.outgoing else None
    decided = epoch_step.step(w.next, inc, out, new_version=w.incoming is not None, seen=w.seen)
    if decided.ack is not None:
        w.seen = decided.ack
        world.acks[w.name] = decided.ack
    if decided.act is Act.WAIT:
        return
    if decided.act is Act.FINISH:
        w.finished = True
        return
    if decided.act is Act.WRITE:
        if decided.await_target is not None and decided.await_target not in world.written:
            return  # the sink waits for S at the target; the epoch commits later (retried here)
        world.written.setdefault(w.next, []).append(w.name)
    w.next += 1


def _coordinate(name: str, world: World, workers: dict[str, Worker], later: int) -> None:
    """One step of swap ``name``'s coordinator, as HotSwap.run would take it (only when its old
    version writes: B starts once A is done)."""
    node = world.swaps[name]
    old, new = OLD_OF[name], NEW_OF[name]
    if name == "B" and (world.swaps["A"] is None or world.swaps["A"].phase != Phase.DONE):
        return
    now = max(workers[old].next, workers[new].next, max(world.written, default=0))
    if node is None or node.phase == Phase.ABORTED:
        world.swaps[name] = swap.precommit(node, old, new, "t", swap.choose(now, 2, None))
    elif node.phase == Phase.PRECOMMIT:
        acks = swap.acks([world.acks.get(old), world.acks.get(new)], node.epoch)
        if acks is swap.Acks.LATE:
            world.swaps[name] = swap.precommit(node, old, new, "t", swap.choose(now, 2 + later, None))
        elif acks is swap.Acks.ALL:
            world.swaps[name] = swap.commit(node)
    elif node.phase == Phase.COMMIT and any(e > node.epoch for e in world.written):
        world.swaps[name] = swap.finish(node)


def _abort(name: str, world: World) -> None:
    node = world.swaps[name]
    if node is not None and node.phase == Phase.PRECOMMIT:
        world.swaps[name] = swap.abort(node)


def _kill(w: Worker, world: World) -> None:
    """A restart: the next epoch is the one after the last committed; the runtime forgets its ack."""
    if not w.persist_ack:
        w.seen = None  # what it reported stays in ZooKeeper (world.acks); it acknowledges again


ACTIONS = st.sampled_from([("epoch", v) for v in ("v1", "v2", "v3")] * 4 + [("coordinate", s) for s in "AB"] * 2
                          + [("abort", s) for s in "AB"] + [("kill", v) for v in ("v1", "v2", "v3")])
"""Mostly epochs and coordinator steps, so that swaps get far; aborts and kills at any point."""


def _check(world: World) -> None:
    for epoch, by in world.written.items():
        assert len(by) == 1, f"target epoch {epoch} written by {by}"
    a, b = world.swaps["A"], world.swaps["B"]
    owners: list[tuple[int | None, str]] = []  # (last epoch, the version that owns the epochs up to it)
    for node, old in ((a, "v1"), (b, "v2")):
        if node is not None and node.phase in (Phase.COMMIT, Phase.DONE):
            owners.append((node.epoch, old))
            if node.epoch + 1 in world.written:
                assert node.epoch in world.written, f"S+1 = {node.epoch + 1} committed before S"
    owners.append((None, NEW_OF["B"] if len(owners) == 2 else NEW_OF["A"] if owners else "v1"))
    for epoch, by in world.written.items():
        assert by == [next(v for last, v in owners if last is None or epoch <= last)], (epoch, by, owners)


@settings(max_examples=400, deadline=None)
@given(actions=st.lists(ACTIONS, max_size=300), persist=st.tuples(st.booleans(), st.booleans(), st.booleans()),
       later=st.integers(0, 3))
def test_every_interleaving_writes_each_epoch_once_and_s_before_s_plus_1(actions, persist, later):
    world, workers = World(), _workers(persist)
    for kind, who in actions:
        if kind == "epoch":
            _run_epoch(workers[who], world)
        elif kind == "coordinate":
            _coordinate(who, world, workers, later)
        elif kind == "abort":
            _abort(who, world)
        else:
            _kill(workers[who], world)
        _check(world)


ACTORS = ["v1", "v2", "v3", "A", "B"]


@settings(max_examples=300, deadline=None)
@given(order=st.lists(st.sampled_from(ACTORS), max_size=40), kills=st.lists(st.sampled_from(ACTORS[:3]), max_size=3),
       persist=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_both_swaps_complete_and_no_epoch_is_lost(order, kills, persist):
    """Driven to the end (no abort), each actor at its own drawn speed (a round runs ``order``, then
    every actor once), with kills in the first rounds: the target holds every epoch exactly once,
    v1's up to S, v2's up to S', v3's after."""
    world, workers = World(horizon=24), _workers(persist)
    for round_ in range(300):
        for who in [*order, *ACTORS]:
            if who in workers:
                _run_epoch(workers[who], world)
            else:
                _coordinate(who, world, workers, 0)
            _check(world)
        if round_ < len(kills):
            _kill(workers[kills[round_]], world)
        if all(s is not None and s.phase == Phase.DONE for s in (world.swaps[n] for n in "AB")) and \
                workers["v3"].next >= world.horizon:
            break
    a, b = world.swaps["A"], world.swaps["B"]
    assert a is not None and b is not None and a.phase == b.phase == Phase.DONE
    assert sorted(world.written) == list(range(max(world.written) + 1)), "an epoch of the target was lost"
    assert max(world.written) >= world.horizon - 1
    for epoch, by in world.written.items():
        assert by == ["v1" if epoch <= a.epoch else "v2" if epoch <= b.epoch else "v3"]


# ---- single rules ----------------------------------------------------------------------------------

def _node(phase: Phase, epoch: int = 10) -> SwapNode:
    return SwapNode(old="a", new="b", target="t", epoch=epoch, phase=phase)


@pytest.mark.parametrize(("incoming", "outgoing", "epoch", "act", "decider"), [
    (None, None, 5, Act.VOID, None),
    (Phase.PRECOMMIT, None, 10, Act.VOID, "in"),
    (Phase.PRECOMMIT, None, 11, Act.WAIT, "in"),
    (Phase.COMMIT, None, 11, Act.WRITE, None),
    (Phase.DONE, Phase.PRECOMMIT, 21, Act.WAIT, "out"),
    (Phase.DONE, Phase.COMMIT, 21, Act.FINISH, "out"),
    (Phase.ABORTED, None, 30, Act.VOID, "in"),
])
def test_the_incoming_swap_decides_until_the_version_writes(incoming, outgoing, epoch, act, decider):
    inc = None if incoming is None else _node(incoming, 10)
    out = None if outgoing is None else _node(outgoing, 20)
    decided = epoch_step.step(epoch, inc, out, new_version=True)
    assert decided.act is act
    assert decided.swap is {"in": inc, "out": out, None: None if act is not Act.WRITE else out}[decider]


def test_acknowledged_once_per_s_and_never_an_aborted_swap():
    pre = _node(Phase.PRECOMMIT)
    assert epoch_step.step(7, None, pre, new_version=False).ack == (10, 7)
    assert epoch_step.step(8, None, pre, new_version=False, seen=(10, 7)).ack is None
    assert epoch_step.step(8, None, pre, new_version=False, seen=(6, 2)).ack == (10, 8)
    assert epoch_step.step(8, None, _node(Phase.ABORTED), new_version=False, seen=(6, 2)).ack is None


def test_only_the_new_versions_s_plus_1_awaits_the_target():
    assert epoch_step.step(11, _node(Phase.COMMIT), None, new_version=True).await_target == 10
    assert epoch_step.step(12, _node(Phase.COMMIT), None, new_version=True).await_target is None
    assert epoch_step.step(11, None, _node(Phase.COMMIT), new_version=False).await_target is None
    assert epoch_step.void_limit(_node(Phase.ABORTED)) is None and epoch_step.void_limit(_node(Phase.COMMIT)) == 10
