"""ZooKeeper authentication and ACLs, on the real ZooKeeper of the embedded stack.

An admin (coordinator) identity grants a sink identity one subject and one job. Then an unauthenticated
client and a reader identity try to write a command, an epoch, a contribution, a decision and a swap
node: each attempt fails with one clear error naming the path and the identity, and nothing in the tree
changes. The granted sink commits epochs of its own subject, not of another one, and cannot write its
own job's command.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kazoo.security import Permissions

from aligner.acl import AclLedger, Grants, acl_for, digest_id, rule
from aligner.alignment import Command
from aligner.embedded.stack import StackInfo
from aligner.errors import AccessDeniedError, AlignerError
from aligner.layout import Layout, writer_id
from aligner.ledger import Lease, Ledger
from aligner.models import (
    AlignmentDecision,
    ConsumerNode,
    ContributionNode,
    JobNode,
    ProducerNode,
    Range,
    SubjectNode,
    SwapNode,
)
from aligner.settings import parse_zk_auth
from tests.conftest import run_cli

ADMIN = "digest:admin:admin-secret"
SINK = "digest:sink-a:sink-secret"
READER = "digest:reader:reader-secret"
ROOT = "/r"

# ---- the policy itself (pure) -----------------------------------------------------------------------


def _grants(readers: list[str] | None = None) -> Grants:
    return Grants(admin="admin", identities={u: digest_id(u, "pw") for u in ("admin", "sink-a", "reader")},
                  subjects={"a": ["sink-a"]}, jobs={"j": ["sink-a"]}, readers=readers or [])


def _perms(path: str, grants: Grants) -> dict[str, int]:
    acl = acl_for(ROOT, path, grants)
    assert acl is not None
    return {f"{a.id.scheme}:{a.id.id.split(':')[0]}": a.perms for a in acl}


def test_no_grants_means_open_acl() -> None:
    assert acl_for(ROOT, "/r/subjects/a/epochs/0000000001", None) is None


@pytest.mark.parametrize(("path", "sink"), [
    ("/r/subjects/a/epochs", Permissions.READ | Permissions.CREATE),
    ("/r/subjects/a/epochs/0000000000", Permissions.READ | Permissions.CREATE),  # a bucket of epochs
    ("/r/subjects/a/epochs/0000000000/0000000001", Permissions.READ | Permissions.CREATE),
    ("/r/subjects/a/epochs/0000000000/0000000001/k:0", Permissions.READ),  # a contribution never changes
    ("/r/subjects/a/writers", Permissions.READ | Permissions.WRITE),
    ("/r/subjects/a/sinks/k/producers/0", Permissions.READ | Permissions.WRITE),
    ("/r/subjects/a/retention", None),
    ("/r/subjects/b/epochs/0000000000/0000000001", None),  # not granted
    ("/r/jobs/j/sources/a/command", Permissions.READ),  # the coordinator alone writes commands
    ("/r/jobs/j/sources/a/consumers/0", Permissions.READ | Permissions.WRITE),
    ("/r/jobs/j/decision", Permissions.READ),
    ("/r/jobs/j/swap", Permissions.READ),
    ("/r/jobs/k/swap", None),
    ("/r/acl", None),
    ("/r/coordinator/election", None),
    ("/r", None),
])
def test_policy_by_path(path: str, sink: int | None) -> None:
    perms = _perms(path, _grants())
    assert perms["digest:admin"] == Permissions.ALL
    assert perms.get("digest:sink-a") == sink
    assert perms["world:anyone"] == Permissions.READ
    assert "digest:reader" not in perms


def _layout_paths(lay: Layout) -> dict[str, str]:
    """Every path a Layout method or property builds, with sample arguments."""
    samples: dict[str, object] = {"subject": "a", "sink": "k", "producer": "0", "epoch": 1, "writer": "k:0",
                                  "job": "j", "worker": 0, "old_job": "j", "query": "q", "batch": 3}
    out = {}
    for name in dir(lay):
        attr = getattr(type(lay), name, None)
        if name.startswith("_") or name in ("root", "declared"):
            continue
        if isinstance(attr, property):
            out[name] = getattr(lay, name)
        elif callable(attr):
            params = list(inspect.signature(attr).parameters)[1:]
            out[name] = getattr(lay, name)(*(samples[p] for p in params))
    return out


def test_every_layout_path_is_declared_and_the_policy_follows_the_declaration() -> None:
    lay = Layout(ROOT)
    paths = _layout_paths(lay)
    assert {"spark_sink_epoch", "source_batch", "retention", "grants", "election"} <= set(paths)
    for name, path in paths.items():
        found = lay.declared(path)
        assert found is not None, f"Layout.{name} builds {path}, which no declaration names"
        node, _ = found
        assert len(node.parts) == len(path[len(ROOT):].strip("/").split("/")) or path == ROOT, \
            f"Layout.{name} builds {path}: only an ancestor ({node.pattern!r}) is declared"
        _scope, _name, perms = rule(ROOT, path)
        assert perms == ("" if node.who == "admin" else node.perms), (name, path)
    assert rule(ROOT, lay.spark_sink_epoch("a", "k", 1)) == ("subject", "a", "rwcd")
    assert rule(ROOT, lay.source_batch("q", 3, "a")) == ("job", "q", "rwcd")
    assert rule(ROOT, f"{lay.subject('a')}/undeclared") == ("subject", "a", "rwcd")  # its grantees own it
    assert rule(ROOT, lay.grants) == ("", None, "")


def test_restricted_readers() -> None:
    perms = _perms("/r/subjects/b/epochs", _grants(readers=["reader"]))
    assert "world:anyone" not in perms
    assert perms["digest:reader"] == Permissions.READ
    assert perms["digest:sink-a"] == Permissions.READ  # a job reads its upstream subjects
    assert rule(ROOT, "/other") == ("", None, "")


def test_zk_auth_format() -> None:
    assert parse_zk_auth("digest:u:p:w").password == "p:w"
    for bad in ("u:s3cret", "digest:u", "sasl:u:s3cret", "digest:bad user:s3cret"):
        with pytest.raises(ValueError) as info:
            parse_zk_auth(bad)
        assert "s3cret" not in str(info.value)  # never echo a password


# ---- on the real ZooKeeper -------------------------------------------------------------------------


@dataclass
class Secured:
    root: str
    admin: Ledger
    subject: str
    other: str
    job: str
    epoch: int
    lease: Lease
    """The sink's producer in ``subject``, epoch ``epoch`` ensured (for contribution attempts)."""

    def client(self, stack: StackInfo, auth: str) -> Ledger:
        return Ledger.connect(stack.zk, self.root, auth=auth)


def snapshot(led: Ledger, path: str) -> dict[str, bytes]:
    """Every node under ``path`` with its data and version: what 'nothing changed' compares."""
    out: dict[str, bytes] = {}
    todo = [path]
    while todo:
        p = todo.pop()
        data, stat = led.zk.get(p)
        out[p] = data + f"@{stat.version}/{stat.cversion}".encode()
        todo.extend(f"{p}/{c}" for c in led.zk.get_children(p))
    return out


@pytest.fixture
def secured(stack: StackInfo, root: str) -> Iterator[Secured]:
    admin = Ledger.connect(stack.zk, root, auth=ADMIN)
    try:
        for s in ("in-a", "in-b"):
            admin.subjects.register_subject(SubjectNode(name=s, topic=s, partitions=2))
        admin.jobs.register(JobNode(job="job-a", inputs=("in-b",), output="in-a", parallelism=1))
        AclLedger(admin).grant(parse_zk_auth(ADMIN), SINK.removeprefix("digest:"), subjects=["in-a"],
                               jobs=["job-a"])
        with Ledger.connect(stack.zk, root, auth=SINK) as sink:
            lease = sink.claims.claim("in-a", "k", "0", [0, 1], lambda: {0: 0, 1: 0})
            sink.commits.ensure_epoch("in-a", lease.next_epoch)
        yield Secured(root, admin, "in-a", "in-b", "job-a", lease.next_epoch, lease)
    finally:
        admin.close()


def _attempts(led: Ledger, s: Secured) -> dict[str, tuple[str, object]]:
    """Write attempts an unauthorized client makes: name -> (path it must name, thunk)."""
    lay, jobs = led.layout, led.jobs
    command_path = lay.command(s.job, s.other)
    version = s.admin.zk.get(command_path)[1].version
    contribution = ContributionNode(sink="k", producer="0", attempt=1, ranges={0: Range(start=0, end=0)})
    swap = SwapNode(old=s.job, new="job-b", target=s.subject, epoch=3, phase="precommit")
    decision = AlignmentDecision(job=s.job, subjects=(s.other,), phase="catching_up", seq=1)
    return {
        "command": (command_path, lambda: jobs.send(s.job, s.other, Command(kind="abort", seq=9), version)),
        "epoch": (lay.epoch(s.subject, s.epoch + 1), lambda: led.commits.ensure_epoch(s.subject, s.epoch + 1)),
        "contribution": (lay.contribution(s.subject, s.epoch, writer_id("k", "1")),
                         lambda: led.zk.create(lay.contribution(s.subject, s.epoch, writer_id("k", "1")),
                                               contribution.dump())),
        "commit": (lay.producer(s.subject, "k", "0"),
                   lambda: led.commits.commit(s.lease, s.epoch, 1, {0: Range(start=0, end=0), 1: Range(start=0,
                                                                                                       end=0)})),
        "swap": (lay.swap(s.job), lambda: jobs.write_swap(swap, -1)),
        "decision": (lay.decision(s.job), lambda: jobs.decide(decision, -1)),
    }


@pytest.mark.parametrize("who", ["unauthenticated", "reader"])
def test_unauthorized_writes_are_refused_and_change_nothing(stack: StackInfo, secured: Secured, who: str) -> None:
    auth, identity = ("", "an unauthenticated client") if who == "unauthenticated" else (READER, "'reader'")
    with secured.client(stack, auth) as led:
        before = snapshot(secured.admin, secured.root)
        for name, (path, attempt) in _attempts(led, secured).items():
            with pytest.raises(AccessDeniedError) as info:
                attempt()  # type: ignore[operator]
            assert info.value.path == path, name
            assert identity in str(info.value), name
        assert led.subjects.subject(secured.subject).name == secured.subject  # reading is open (no reader grants)
        assert snapshot(secured.admin, secured.root) == before


def test_granted_sink_commits_its_subject_only(stack: StackInfo, secured: Secured) -> None:
    with secured.client(stack, SINK) as sink:
        lease = sink.commits.commit(secured.lease, secured.epoch, 1, {0: Range(start=0, end=0), 1: Range(start=0,
                                                                                                         end=0)})
        assert sink.epochs.is_committed(secured.subject, secured.epoch)
        sink.commits.ensure_epoch(secured.subject, lease.next_epoch)  # its next epoch too
        producer, _ = sink.read(ProducerNode, sink.layout.producer(secured.subject, "k", "0"))
        assert producer.committed_epoch == secured.epoch

        before = snapshot(secured.admin, secured.root)
        with pytest.raises(AccessDeniedError, match="'sink-a'") as info:
            sink.claims.claim(secured.other, "k", "0", [0], lambda: {0: 0})
        assert info.value.path.startswith(sink.layout.sinks(secured.other))
        with pytest.raises(AccessDeniedError):
            sink.commits.ensure_epoch(secured.other, 0)
        assert snapshot(secured.admin, secured.root) == before
        other_lease = secured.admin.claims.claim(secured.other, "adm", "0", [0], lambda: {0: 0})
        secured.admin.commits.ensure_epoch(secured.other, other_lease.next_epoch)
        with pytest.raises(AccessDeniedError):
            sink.commits.commit(other_lease, other_lease.next_epoch, 1, {0: Range(start=0, end=0)})
        assert not secured.admin.epochs.is_committed(secured.other, other_lease.next_epoch)

        # its job: it reports consumer states but cannot write its own command
        jobs = sink.jobs
        jobs.report(secured.job, secured.other, 0, ConsumerNode())
        with pytest.raises(AccessDeniedError):
            jobs.send(secured.job, secured.other, Command(kind="abort", seq=1), -1)


def test_admin_writes_commands_and_nodes_created_later_get_acls(stack: StackInfo, secured: Secured) -> None:
    jobs = secured.admin.jobs
    _, version = jobs.command(secured.job, secured.other)
    jobs.send(secured.job, secured.other, Command(kind="abort", seq=1), version)
    assert jobs.command(secured.job, secured.other)[0].kind == "abort"
    # a subject registered after the grants: only the admin may write it until it is granted
    secured.admin.subjects.register_subject(SubjectNode(name="late", topic="late", partitions=1))
    with secured.client(stack, SINK) as sink:
        with pytest.raises(AccessDeniedError):
            sink.commits.ensure_epoch("late", 0)
        AclLedger(secured.admin).grant(parse_zk_auth(ADMIN), "sink-a", subjects=["late"])  # known identity
        sink.commits.ensure_epoch("late", 0)
        assert sink.subjects.epoch_numbers("late") == [0]


def test_grant_needs_an_identity_and_only_the_admin_grants(stack: StackInfo, secured: Secured) -> None:
    with secured.client(stack, SINK) as sink, pytest.raises(AccessDeniedError, match=r"/acl"):
        AclLedger(sink).grant(parse_zk_auth(SINK), "reader:x", subjects=[secured.subject])
    with secured.client(stack, "") as anon, pytest.raises(AlignerError, match="ALIGNER_ZK_AUTH"):
        AclLedger(anon).grant(None, "reader:x")
    with pytest.raises(AlignerError, match="not known yet"):
        AclLedger(secured.admin).grant(parse_zk_auth(ADMIN), "stranger", subjects=[secured.subject])


def test_cli_acl_and_clear_denial(secured: Secured, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "ALIGNER_ROOT": secured.root}
    source = f"{secured.root}/jobs/{secured.job}/sources/{secured.other}"
    shown = run_cli(env, "acl", "show", source, "--json")
    assert shown.returncode == 0, shown.stderr
    acls = json.loads(shown.stdout)["acls"]
    assert {"id": "digest:sink-a", "perms": "READ"} in acls[f"{source}/command"]
    assert {"id": "digest:admin", "perms": "ALL"} in acls[f"{source}/command"]
    assert "digest:admin" in run_cli(env, "acl", "show", source).stdout  # the table
    denied = run_cli(env, "--zk-auth", READER, "abort", secured.job)
    assert denied.returncode == 1
    lines = denied.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in denied.stderr, denied.stderr
    assert "'reader'" in lines[0] and f"{secured.root}/coordinator/election" in lines[0]  # a coordinator
    granted = run_cli(env, "--zk-auth", ADMIN, "acl", "grant", "--job", "job-b", "--identity", "reader:reader-secret")
    assert granted.returncode == 0, granted.stderr
    grants, _ = AclLedger(secured.admin).grants()
    assert grants is not None and grants.jobs["job-b"] == ["reader"]
    refused = run_cli(env, "--zk-auth", READER, "acl", "grant", "--subject", "x", "--identity", "reader")
    assert refused.returncode == 1 and f"{secured.root}/acl" in refused.stderr and "Traceback" not in refused.stderr


# ---- secure by default: an identity set and no grant yet -------------------------------------------------


def test_an_identity_without_grants_creates_nodes_only_it_may_write(stack: StackInfo, root: str,
                                                                    cli_env: dict[str, str]) -> None:
    """No window where the tree is open: before the first grant, a node created with an identity is writable
    by that identity only (readable by anyone), kazoo's own recipe nodes too; another identity or an
    unauthenticated client is refused with a line saying why; the admin's first grant then applies the policy,
    and ``aligner status`` says which of the three states the tree is in."""
    env = {**cli_env, "ALIGNER_ROOT": root}
    with Ledger.connect(stack.zk, root, auth=ADMIN) as admin:
        admin.subjects.register_subject(SubjectNode(name="in-a", topic="in-a", partitions=1))
        admin.zk.kazoo.ensure_path(admin.layout.election)  # as the Election recipe does, through kazoo alone
        for path in (root, admin.layout.subject("in-a"), admin.layout.election):
            acls, _ = admin.zk.get_acls(path)
            assert {(a.id.scheme, a.perms) for a in acls} == {("digest", Permissions.ALL),
                                                               ("world", Permissions.READ)}, path
        status = json.loads(run_cli(env, "status", "--json").stdout)["acls"]
        assert status["mode"] == "creator-only" and status["in_force"]
        for auth, who in ((SINK, "'sink-a'"), ("", "an unauthenticated client")):
            with Ledger.connect(stack.zk, root, auth=auth) as other:
                assert other.subjects.subject("in-a").partitions == 1  # reading stays open
                with pytest.raises(AccessDeniedError, match="ACLs are not set up yet") as info:
                    other.claims.claim("in-a", "k", "0", [0], lambda: {0: 0})
                assert who in str(info.value)

        AclLedger(admin).grant(parse_zk_auth(ADMIN), SINK.removeprefix("digest:"), subjects=["in-a"])
        status = json.loads(run_cli(env, "status", "--json").stdout)["acls"]
        assert status["mode"] == "policy" and status["admin"] == "admin"
        assert "ZooKeeper ACLs: in force: admin 'admin'" in run_cli(env, "status").stdout
        with Ledger.connect(stack.zk, root, auth=SINK) as sink:
            lease = sink.claims.claim("in-a", "k", "0", [0], lambda: {0: 0})
            sink.commits.ensure_epoch("in-a", lease.next_epoch)


def test_the_first_grant_names_a_node_another_identity_made_before_it(stack: StackInfo, root: str) -> None:
    with Ledger.connect(stack.zk, root, auth=SINK) as sink:  # a sink started before the admin set up the tree
        sink.subjects.register_subject(SubjectNode(name="in-a", topic="in-a", partitions=1))
    with Ledger.connect(stack.zk, root, auth=ADMIN) as admin:
        with pytest.raises(AccessDeniedError, match="identity 'sink-a' created it before the first grant") as info:
            AclLedger(admin).grant(parse_zk_auth(ADMIN), SINK.removeprefix("digest:"), subjects=["in-a"])
        assert info.value.path == root


def test_a_tree_created_without_identities_is_shown_open(ledger: Ledger, cli_env: dict[str, str]) -> None:
    ledger.subjects.register_subject(SubjectNode(name="in-a", topic="in-a", partitions=1))
    status = json.loads(run_cli({**cli_env, "ALIGNER_ROOT": ledger.layout.root}, "status", "--json").stdout)
    assert status["acls"]["mode"] == "open" and not status["acls"]["in_force"]
