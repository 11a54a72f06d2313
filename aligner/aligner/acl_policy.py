"""The ACL policy of the aligner tree: who may do what at a path, as the layout declares it (pure).

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

The permissions of each node are in its declaration (:data:`aligner.layout.NODES`); this module turns
a declaration and the grants into a ZooKeeper ACL. It sits below the ZooKeeper client (which gives
every node it creates the ACL of its path); the grants themselves are read and written by the grant
service above the ledger (:mod:`aligner.acl`). Without ``ALIGNER_ZK_AUTH`` nodes are created open, as
ZooKeeper does; with it and no grants yet, writable by their creator only (:data:`CREATOR_ONLY`).
"""

from __future__ import annotations

import logging
import threading

from kazoo.security import ACL, Permissions, make_acl, make_digest_acl_credential
from pydantic import BaseModel, Field

from aligner.errors import AccessDeniedError, AlignerError, MalformedNodeError
from aligner.layout import CONTAINERS, Layout, declared
from aligner.settings import ZkAuth

log = logging.getLogger(__name__)

GRANTS = "acl"
"""Name of the grants node under the root (``Layout.grants``)."""

__all__ = ["ALL", "CONTAINERS", "CREATOR_ONLY", "GRANTS", "NOT_SET_UP", "AclPolicy", "Grants", "acl_for", "describe",
           "digest_id", "parse_identity", "rule"]


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

CREATOR_ONLY = [make_acl("auth", "", all=True), make_acl("world", "anyone", read=True)]
"""Before the first grant, with an identity set: every permission for the creating identity (ZooKeeper's
``auth`` scheme), reading for anyone. The admin's first grant replaces it by the policy's ACLs."""
NOT_SET_UP = ("ACLs are not set up yet: with ALIGNER_ZK_AUTH set, a node is writable by the identity that "
              "created it only, until the admin identity makes the first grant (`aligner acl grant`); make "
              "it before other identities write")

_OTHER = "rwcd"
"""Nodes under a subject or job that no declaration names: its grantees own them."""


def rule(root: str, path: str) -> tuple[str, str | None, str]:
    """(scope, name, perms) of a path: the identities granted ``name`` in ``scope`` ("subject", "job";
    "subjects"/"jobs" for any grantee of that kind; "" for nobody but the admin) get ``perms``."""
    found = declared(root, path)
    if found is None:
        return "", None, ""
    node, values = found
    if node.who == "admin":
        return "", None, ""
    if node.who in ("subjects", "jobs"):
        return node.who, None, node.perms
    name = next(iter(values.values()))  # the subject, job (or Spark query) the node belongs to
    exact = len(node.parts) == len([p for p in path[len(root):].split("/") if p])
    return node.who, name, node.perms if exact else _OTHER


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


def acl_for(root: str, path: str, grants: Grants | None, identified: bool = False) -> list[ACL] | None:
    """The ACL a node at ``path`` gets when created (and when grants are re-applied). Without grants: with
    an identity (``identified``), writable by its creator only and readable by anyone, so there is no window
    in which the tree is open; without one, None (kazoo's open ACL, as ZooKeeper does)."""
    if grants is None:
        return CREATOR_ONLY if identified else None
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
        return Layout(self.root).grants

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
        return acl_for(self.root, path, self.grants, identified=self.auth is not None)

    def denied(self, op: str, path: str) -> AccessDeniedError:
        """The one-line error of a refused request; before the first grant it says why."""
        return AccessDeniedError(op, path, self.identity, NOT_SET_UP if self.grants is None else None)


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
