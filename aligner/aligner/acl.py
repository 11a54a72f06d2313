"""The grant service: the ACL grants in ZooKeeper, and their application to existing nodes.

The policy itself (roles, what each may do) is :mod:`aligner.acl_policy`, below the client; this
service sits above the ledger.

The grants live in ZooKeeper at ``{root}/acl`` (admin-only), so that every client computes the ACL of
a node it creates from its path (:func:`acl_for`) and nodes created later get the right ACL; granting
re-applies the ACLs to existing nodes (:class:`AclLedger`). Without ``ALIGNER_ZK_AUTH`` nodes are created
open; with it and no grants yet, writable by their creator only.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import Permissions

from aligner.acl_policy import (
    ALL,
    CONTAINERS,
    GRANTS,
    AclPolicy,
    Grants,
    acl_for,
    describe,
    digest_id,
    parse_identity,
    rule,
)
from aligner.errors import AccessDeniedError, AlignerError, MalformedNodeError
from aligner.ledger import Ledger
from aligner.settings import ZkAuth
from aligner.zk import RetryingClient

log = logging.getLogger(__name__)

__all__ = ["ALL", "CONTAINERS", "GRANTS", "AclLedger", "AclPolicy", "Grants", "acl_for", "describe", "digest_id",
           "grants_json", "parse_identity", "rule"]


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
        self.layout = ledger.layout
        self.root = ledger.layout.root

    @property
    def path(self) -> str:
        return self.layout.grants

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
                    try:
                        self.zk.ensure_path(self.root + c)
                    except AccessDeniedError:
                        raise self._foreign(self.root + c.rsplit("/", 1)[0]) from None
            seen.append((current, _granted(current or admin, identity, subjects, jobs, reader)))
            return seen[-1][1].dump()

        self.zk.update(self.path, change)
        current, update = seen[-1]
        first, grants = current is None, current or update
        everything = first or update.readers != grants.readers
        if everything:
            self.apply(update, [self.root])
        else:
            lay = self.layout
            tops = [self.root, self.path, *(f"{self.root}/{c}" for c in CONTAINERS)]
            subtrees = [*map(lay.subject, subjects), *map(lay.job, jobs), *map(lay.spark_query, jobs)]
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
                    except NoAuthError:
                        raise self._foreign(p) from None
        return count

    def _foreign(self, path: str) -> AccessDeniedError:
        """A node whose ACL this identity may not change: one made before the first grant by another identity
        (writable by its creator only) says so."""
        with contextlib.suppress(Exception):  # naming the owner is a nicety: failing that, the plain refusal
            acls, _stat = self.zk.get_acls(path)
            owners = sorted(who.split(":", 1)[1] for who, perms in map(describe, acls)
                            if who.startswith("digest:") and perms == "ALL")
            if owners:
                return AccessDeniedError("setting the ACL", path, self.zk.policy.identity,
                                         f"identity {owners[0]!r} created it before the first grant and alone may "
                                         f"change it; with identities set, the admin makes the first grant before "
                                         f"other identities write (or {owners[0]!r} removes the node)")
        return self.zk.policy.denied("setting the ACL", path)

    def state(self) -> dict[str, Any]:
        """Whether ACLs are in force on the tree, for ``aligner status``: ``mode`` is "policy" (grants made),
        "creator-only" (identities set, no grant yet) or "open" (created without an identity)."""
        grants, _ = self.grants()
        if grants is not None:
            readers = ", ".join(grants.readers) if grants.readers else "anyone"
            return {"in_force": True, "mode": "policy", "admin": grants.admin, "identities": len(grants.identities),
                    "line": f"in force: admin {grants.admin!r}, {len(grants.identities)} identities, "
                            f"reading by {readers}"}
        try:
            acls, _stat = self.zk.get_acls(self.root)
        except NoNodeError:
            return {"in_force": False, "mode": "open", "line": "no tree yet"}
        if any(a.id.scheme == "world" and a.perms == Permissions.ALL for a in acls):
            return {"in_force": False, "mode": "open",
                    "line": "off: nodes are open to anyone (set ALIGNER_ZK_AUTH and make the first grant, "
                            "`aligner acl grant`, to apply the policy)"}
        return {"in_force": True, "mode": "creator-only",
                "line": "creator only: no grant yet, each node is writable by the identity that created it "
                        "(the admin's first grant applies the policy)"}

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
