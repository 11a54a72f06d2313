"""Who may do what in ZooKeeper: the ACL policy of the aligner tree, and its grants.

Roles (ZooKeeper digest identities):

- the **admin** (the coordinator identity) has every permission everywhere; it alone writes alignment
  commands, alignment decisions, hot-swap nodes, retention floors and the grants themselves;
- a **sink** identity granted a subject registers it, claims partitions (sink, producer and writers
  nodes) and commits its epochs (epoch nodes, contributions); a contribution, once written, is read-only;
- a **job** identity granted a job registers it, reports its consumers' alignment states and records
  its job and worker epochs (and, for a Spark query id, its micro-batch records); it reads, but never
  writes, its command, decision and swap nodes;
- **readers** read: anyone when no reader identity is granted, otherwise only the reader identities
  and the granted sink and job identities (jobs read their upstream subjects).

The grants live in ZooKeeper at ``{root}/acl`` (admin-only), so that every client computes the ACL of
a node it creates from its path (:func:`acl_for`) and nodes created later get the right ACL; granting
re-applies the ACLs to existing nodes (:class:`AclLedger`). Without grants (or without
``ALIGNER_ZK_AUTH``) nodes are created open, exactly as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, Permissions, make_acl, make_digest_acl_credential
from pydantic import BaseModel, Field

from aligner.errors import AlignerError, MalformedNodeError
from aligner.settings import ZkAuth

if TYPE_CHECKING:
    from aligner.ledger import Ledger
    from aligner.zk import RetryingClient

log = logging.getLogger("aligner.acl")

GRANTS = "acl"
"""Name of the grants node under the root."""

CONTAINERS = ("subjects", "jobs", "spark", "spark/queries", "coordinator", "coordinator/election")
"""Top-level nodes the first grant creates, so that their ACLs exist before any component starts."""


class Grants(BaseModel):
    """The grants node: identities by user name (their digest ids), and what each was granted."""

    admin: str
    identities: dict[str, str] = Field(default_factory=dict)
    """user -> ZooKeeper digest id ``user:base64(sha1(user:password))`` (never a password)."""
    subjects: dict[str, list[str]] = Field(default_factory=dict)
    jobs: dict[str, list[str]] = Field(default_factory=dict)
    readers: list[str] = Field(default_factory=list)
    """Reader identities; empty means anyone may read."""

    def dump(self) -> bytes:
        return self.model_dump_json().encode()

    def digest(self, user: str) -> str:
        return self.identities[user]


def digest_id(user: str, password: str) -> str:
    """ZooKeeper's digest id of a user (what an ACL names; the password itself is never stored)."""
    return make_digest_acl_credential(user, password)


# ---- the policy: path -> ACL (pure) -------------------------------------------------------------------

ALL = "rwcda"

_SUBJECT_RULES: dict[tuple[str, ...], str] = {
    (): "rc",  # the subject node: a granted sink registers it (with its children, in one multi-op)
    ("writers",): "rw",
    ("retention",): "",  # the gc floor: admin only
    ("sinks",): "rc",
    ("sinks", "*"): "rc",
    ("sinks", "*", "producers"): "rc",
    ("sinks", "*", "producers", "*"): "rw",
    ("epochs",): "rc",
    ("epochs", "*"): "rc",
    ("epochs", "*", "*"): "r",  # a contribution never changes
}
_JOB_RULES: dict[tuple[str, ...], str] = {
    (): "rc",
    ("sources",): "rc",
    ("sources", "*"): "rc",
    ("sources", "*", "command"): "r",  # the coordinator alone writes commands
    ("sources", "*", "consumers"): "rc",
    ("sources", "*", "consumers", "*"): "rw",
    ("decision",): "r",
    ("swap",): "r",
    ("epochs",): "rc",
    ("epochs", "*"): "r",
    ("workers",): "rc",
    ("workers", "*"): "rc",
    ("workers", "*", "epochs"): "rc",
    ("workers", "*", "epochs", "*"): "r",
}
_OTHER = "rwcd"
"""Nodes of a subject or job no rule names (e.g. Spark progress records): its grantees own them."""


def _match(rules: dict[tuple[str, ...], str], rest: Sequence[str]) -> str:
    for pattern, perms in rules.items():
        if len(pattern) == len(rest) and all(p in ("*", r) for p, r in zip(pattern, rest, strict=True)):
            return perms
    return _OTHER


def rule(root: str, path: str) -> tuple[str, str | None, str]:
    """(scope, name, perms) of a path: the identities granted ``name`` in ``scope`` ("subject", "job";
    "subjects"/"jobs" for any grantee of that kind; "" for nobody but the admin) get ``perms``."""
    if path != root and not path.startswith(root + "/"):
        return "", None, ""
    parts = [p for p in path[len(root):].split("/") if p]
    if parts[:1] == ["subjects"]:
        if len(parts) == 1:
            return "subjects", None, "rc"  # a granted sink may register its subjects (a job's changelog)
        return "subject", parts[1], _match(_SUBJECT_RULES, parts[2:])
    if parts[:1] == ["jobs"]:
        if len(parts) == 1:
            return "jobs", None, "rc"
        return "job", parts[1], _match(_JOB_RULES, parts[2:])
    if parts[:2] == ["spark", "queries"] and len(parts) >= 3:
        return "job", parts[2], "rwcd"  # a Spark query's micro-batch records (pruned by the query)
    if parts in (["spark"], ["spark", "queries"]):
        return "jobs", None, "rc"
    return "", None, ""  # the root, the grants, the coordinators' election, anything unknown


def _perms(letters: str) -> int:
    bits = {"r": Permissions.READ, "w": Permissions.WRITE, "c": Permissions.CREATE, "d": Permissions.DELETE,
            "a": Permissions.ADMIN}
    value = 0
    for letter in letters:
        value |= bits[letter]
    return value


def _digest_acl(digest: str, letters: str) -> ACL:
    return make_acl("digest", digest, read="r" in letters, write="w" in letters, create="c" in letters,
                    delete="d" in letters, admin="a" in letters)


def acl_for(root: str, path: str, grants: Grants | None) -> list[ACL] | None:
    """The ACL a node at ``path`` gets when created (and when grants are re-applied); None without grants
    (kazoo's open ACL, as without security)."""
    if grants is None:
        return None
    scope, name, letters = rule(root, path)
    if scope == "subject":
        users = set(grants.subjects.get(name or "", ()))
    elif scope == "job":
        users = set(grants.jobs.get(name or "", ()))
    elif scope == "subjects":
        users = {u for us in grants.subjects.values() for u in us}
    elif scope == "jobs":
        users = {u for us in grants.jobs.values() for u in us}
    else:
        users = set()
    perms: dict[str, str] = {grants.admin: ALL}
    for user in sorted(users - {grants.admin}):
        perms[user] = letters
    if grants.readers:
        granted = {u for us in (*grants.subjects.values(), *grants.jobs.values()) for u in us}
        for user in sorted({*grants.readers, *granted} - {grants.admin}):
            perms[user] = "".join(sorted(set(perms.get(user, "")) | {"r"}, key="rwcda".index))
    acl = [_digest_acl(grants.digest(user), letters) for user, letters in perms.items() if letters]
    if not grants.readers:
        acl.append(make_acl("world", "anyone", read=True))
    return acl


def describe(acl: ACL) -> tuple[str, str]:
    """(who, permissions) of one ACL entry, for people: user names, not digests."""
    who = acl.id.id.split(":", 1)[0] if acl.id.scheme == "digest" else acl.id.id
    names = [n for n, bit in (("READ", Permissions.READ), ("WRITE", Permissions.WRITE),
                              ("CREATE", Permissions.CREATE), ("DELETE", Permissions.DELETE),
                              ("ADMIN", Permissions.ADMIN)) if acl.perms & bit]
    return f"{acl.id.scheme}:{who}", "ALL" if acl.perms == Permissions.ALL else "|".join(names) or "none"


class AclPolicy:
    """A client's view of the policy: its identity and the grants, kept current by a watch on the
    grants node (the client arms it), so that every node it creates gets the ACL of its path."""

    def __init__(self, root: str, auth: ZkAuth | None) -> None:
        self.root = root
        self.auth = auth
        self.grants: Grants | None = None
        self.loaded = threading.Event()

    @property
    def grants_path(self) -> str:
        return f"{self.root}/{GRANTS}"

    @property
    def identity(self) -> str:
        return f"identity {self.auth.user!r}" if self.auth is not None else \
            "an unauthenticated client (no ALIGNER_ZK_AUTH)"

    def on_grants(self, data: bytes | None, _stat: object = None) -> None:
        if not data:
            self.grants = None
        else:
            try:
                self.grants = Grants.model_validate_json(data)
            except ValueError as exc:
                log.error("%s", MalformedNodeError(self.grants_path, f"not a grants document: {exc}"))
        self.loaded.set()

    def acl(self, path: str) -> list[ACL] | None:
        return acl_for(self.root, path, self.grants)


# ---- grants and their application (through the ledger's retrying client) ----------------------------

def parse_identity(text: str, grants: Grants | None) -> tuple[str, str]:
    """``USER:PASSWORD`` or a known ``USER`` -> (user, digest id)."""
    user, sep, password = text.partition(":")
    if sep and password:
        return user, digest_id(user, password)
    if grants is not None and user in grants.identities:
        return user, grants.identities[user]
    raise AlignerError(f"identity {user!r} is not known yet: give it once as {user}:PASSWORD "
                       "(only its ZooKeeper digest is stored)")


def _granted(grants: Grants, identity: str | None, subjects: list[str], jobs: list[str], reader: bool) -> Grants:
    """``grants`` with ``identity`` granted the subjects and jobs (and reading)."""
    update = grants.model_copy(deep=True)
    if identity is None:
        return update
    user, digest = parse_identity(identity, grants)
    if user == grants.admin:
        raise AlignerError(f"{user!r} is the admin identity: it has every permission already")
    update.identities[user] = digest
    for s in subjects:
        update.subjects[s] = sorted({*update.subjects.get(s, ()), user})
    for j in jobs:
        update.jobs[j] = sorted({*update.jobs.get(j, ()), user})
    if reader:
        update.readers = sorted({*update.readers, user})
    return update


class AclLedger:
    """Reads and writes the grants and applies ACLs to existing nodes."""

    def __init__(self, ledger: Ledger) -> None:
        self.zk: RetryingClient = ledger.zk
        self.root = ledger.layout.root

    @property
    def path(self) -> str:
        return f"{self.root}/{GRANTS}"

    def grants(self) -> tuple[Grants | None, int]:
        try:
            raw, stat = self.zk.get(self.path)
        except NoNodeError:
            return None, -1
        return self._parse(raw), stat.version

    def _parse(self, raw: bytes) -> Grants:
        try:
            return Grants.model_validate_json(raw)
        except ValueError as exc:
            raise MalformedNodeError(self.path, f"not a grants document: {exc}") from None

    def grant(self, me: ZkAuth | None, identity: str | None = None, subjects: Iterable[str] = (),
              jobs: Iterable[str] = (), reader: bool = False) -> Grants:
        """Grant ``identity`` the subjects and jobs (and reading); the first grant makes ``me`` the admin.

        Compare-and-set on the grants node; then the ACLs of every node the change concerns are
        re-applied (everything, for the first grant or a reader change)."""
        if me is None:
            raise AlignerError("granting needs an identity: set ALIGNER_ZK_AUTH (or --zk-auth) to "
                               "digest:USER:PASSWORD; the identity of the first grant becomes the admin")
        subjects, jobs = list(subjects), list(jobs)
        admin = Grants(admin=me.user, identities={me.user: digest_id(me.user, me.password)})
        seen: list[tuple[Grants | None, Grants]] = []

        def change(raw: bytes | None) -> bytes:  # may run again: another admin command got there first
            current = self._parse(raw) if raw else None
            if current is None:  # the first grant: the containers exist before anything is written under them
                for c in ("", *(f"/{c}" for c in CONTAINERS)):
                    self.zk.ensure_path(self.root + c)
            seen.append((current, _granted(current or admin, identity, subjects, jobs, reader)))
            return seen[-1][1].dump()

        self.zk.update(self.path, change)
        current, update = seen[-1]
        first, grants = current is None, current or update
        everything = first or update.readers != grants.readers
        if everything:
            self.apply(update, [self.root])
        else:
            tops = [self.root, self.path, *(f"{self.root}/{c}" for c in CONTAINERS)]
            subtrees = [f"{self.root}/subjects/{s}" for s in subjects] + [f"{self.root}/jobs/{j}" for j in jobs] \
                + [f"{self.root}/spark/queries/{j}" for j in jobs]
            self.apply(update, tops, recursive=False)
            self.apply(update, subtrees)
        return update

    def apply(self, grants: Grants, paths: Sequence[str], recursive: bool = True) -> int:
        """Set the policy's ACL on each of ``paths`` (and their subtrees); returns how many nodes."""
        count = 0
        for top in paths:
            for batch in self._walk(top, recursive):
                pending = [(p, self.zk.set_acls_async(p, acl_for(self.root, p, grants) or [])) for p in batch]
                for p, req in pending:
                    try:
                        req.get()
                        count += 1
                    except NoNodeError:
                        pass  # removed meanwhile (gc)
                    except Exception as exc:
                        raise self.zk.denied(exc, "setting the ACL", p) from None
        return count

    def _walk(self, top: str, recursive: bool) -> Iterator[list[str]]:
        """Batches of existing paths, breadth first (each batch's ACL writes are pipelined)."""
        level = [top] if self.zk.exists(top) is not None else []
        while level:
            yield level
            if not recursive:
                return
            pending = [(p, self.zk.get_children_async(p)) for p in level]
            level = []
            for p, req in pending:
                with contextlib.suppress(NoNodeError):
                    level.extend(f"{p}/{c}" for c in sorted(req.get()))

    def show(self, path: str, depth: int = 1) -> list[tuple[str, list[tuple[str, str]]]]:
        """(path, [(who, permissions)]) of ``path`` and its descendants down to ``depth`` levels."""
        out = []
        level = [path]
        for d in range(depth + 1):
            nxt: list[str] = []
            for p in level:
                try:
                    acls, _stat = self.zk.get_acls(p)
                except NoNodeError:
                    if p == path:
                        raise AlignerError(f"no ZooKeeper node at {path}") from None
                    continue
                out.append((p, [describe(a) for a in acls]))
                if d < depth:
                    with contextlib.suppress(NoNodeError):
                        nxt.extend(f"{p}/{c}" for c in sorted(self.zk.get_children(p)))
            level = nxt
        return out


def grants_json(grants: Grants | None) -> dict[str, Any]:
    """The grants without digests, for ``aligner acl show --json``."""
    if grants is None:
        return {"grants": None}
    data = json.loads(grants.model_dump_json())
    data["identities"] = sorted(grants.identities)
    return {"grants": data}
