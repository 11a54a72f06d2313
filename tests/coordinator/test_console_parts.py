"""The console's pure parts: the chain's layout, the warnings, the actions a page may ask for, and who may act."""

from __future__ import annotations

import pytest

from aligner.coordinator.console.actions import parse
from aligner.coordinator.console.app import Guard
from aligner.coordinator.console.hub import Hub
from aligner.coordinator.console.picture import JobView, Picture, SourceView, SwapView, graph, warnings
from aligner.models import JobNode


def _job(name: str, inputs: tuple[str, ...], output: str, follows: str | None = None) -> JobNode:
    return JobNode(job=name, inputs=inputs, output=output, parallelism=1, follows=follows)


def test_a_chain_is_laid_out_left_to_right_with_versions_side_by_side() -> None:
    jobs = [_job("j2", ("mid", "side"), "out"), _job("j1", ("raw",), "mid"), _job("j1-v2", ("raw",), "mid", "j1")]
    g = graph(["raw", "side", "mid", "out"], jobs)
    at = {n.id: (n.layer, n.row) for n in g.nodes}
    assert at["s:raw"][0] == at["s:side"][0] == 0
    assert at["j:j1"][0] == at["j:j1-v2"][0] == 1 and at["j:j1-v2"][1] == at["j:j1"][1] + 1
    assert at["s:mid"][0] == 2 and at["j:j2"][0] == 3 and at["s:out"][0] == 4
    assert ("s:mid", "j:j2") in g.edges and ("j:j1-v2", "s:mid") in g.edges
    assert len({(n.layer, n.row) for n in g.nodes}) == len(g.nodes), "two nodes in one place"


def test_a_cycle_does_not_loop_the_layout() -> None:
    g = graph(["a", "b"], [_job("x", ("a",), "b"), _job("y", ("b",), "a")])
    assert {n.id for n in g.nodes} == {"s:a", "s:b", "j:x", "j:y"}


def _source(lag_seconds: float, consumers: int = 1) -> SourceView:
    return SourceView(subject="in", state="aligned", mode="aligned", consumers=consumers, lag_epochs=9,
                      lag_seconds=lag_seconds)


def test_warnings_name_the_cause_and_spare_a_swapped_out_job() -> None:
    picture = Picture(taken_at=200_000, jobs=[
        JobView(job="slow", engine="runtime", version="1", inputs=("in",), output="o", parallelism=2, mode="aligned",
                sources=[_source(120.0, consumers=1)]),
        JobView(job="old", engine="spark", version="1", inputs=("in",), output="o", parallelism=1, mode="aligned",
                swapped_to="new", sources=[_source(500.0)]),
    ], swaps=[SwapView(old="a", new="b", target="t", epoch=9, phase="precommit", updated_at=100_000,
                       acks={"a:0": True, "b:0": False})])
    said = warnings(picture)
    assert "job slow is 9 epochs (120s) behind in" in said
    assert "job slow: 1 of 2 workers report on in" in said
    assert "hot-swap a -> b has stood at precommit for 100s; not acknowledged by b:0" in said
    assert not any("old" in line for line in said)


@pytest.mark.parametrize(("body", "argv"), [
    ({"kind": "align", "job": "j"}, ["align", "--timeout", "600", "--json", "--", "j"]),
    ({"kind": "abort", "job": "--help"}, ["abort", "--timeout", "600", "--json", "--", "--help"]),
    ({"kind": "hotswap", "old": "a", "new": "-b", "subject": "t", "verify_epochs": 3},
     ["hotswap", "--old=a", "--new=-b", "--subject=t", "--verify-epochs", "3", "--timeout", "600", "--json"]),
    ({"kind": "gc"}, ["gc", "--json"]),
])
def test_an_action_is_the_cli_command(body: dict[str, object], argv: list[str]) -> None:
    assert parse(body).argv() == argv


@pytest.mark.parametrize(("body", "error"), [
    ({"kind": "drop", "job": "j"}, "invalid kind"),
    ({"kind": "align", "job": "no/slash"}, "invalid job"),
    ({"kind": "align"}, "align needs a job"),
    ({"kind": "hotswap", "old": "a"}, "hotswap needs old, new and subject"),
    ({"kind": "hotswap", "old": "a", "new": "b", "subject": "t", "verify_epochs": 0}, "invalid verify_epochs"),
])
def test_a_malformed_action_is_one_clear_error(body: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(body).argv()


def test_only_the_admin_acts_where_acls_are_in_force() -> None:
    hub = Hub()
    assert "--allow-actions" in (Guard(False, "admin").refusal(hub) or "")
    assert "not connected to ZooKeeper yet" in (Guard(True, "admin").refusal(hub) or "")
    hub.picture = Picture(acl={"in_force": True, "mode": "policy", "admin": None})
    assert "only the admin may read" in (Guard(True, None).refusal(hub) or "")
    hub.picture = Picture(acl={"in_force": True, "mode": "policy", "admin": "admin"})
    assert Guard(True, "admin").refusal(hub) is None
    refused = Guard(True, "viewer").refusal(hub) or ""
    assert "admin identity 'admin'" in refused and "'viewer'" in refused
    hub.picture = Picture(acl={"in_force": False, "mode": "open"})
    assert Guard(True, None).refusal(hub) is None
