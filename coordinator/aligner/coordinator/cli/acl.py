"""``aligner acl grant|show``: ZooKeeper ACLs, who may write which subjects and jobs."""

from __future__ import annotations

from typing import Annotated

import typer

from aligner.coordinator.cli.common import JsonFlag, check_names, emit, out, usage
from aligner.coordinator.cli.connect import ledger
from aligner.coordinator.cli.render import acl_table

app = typer.Typer(help="ZooKeeper ACLs: who may write which subjects and jobs.", no_args_is_help=True)


@app.command("grant")
def acl_grant(
    identity: Annotated[str | None, typer.Option(help="USER:PASSWORD, or USER once known (only a digest is stored)",
                                                 show_default=False)] = None,
    subject: Annotated[list[str] | None, typer.Option(callback=check_names, help="Subject it may commit (repeat)")
                       ] = None,
    job: Annotated[list[str] | None, typer.Option(callback=check_names, help="Job (or Spark query) it may run")
                   ] = None,
    reader: Annotated[bool, typer.Option("--reader", help="Make it a reader (then only readers read)")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Grant an identity subjects and jobs, and apply the ACLs to existing nodes. The first grant makes
    the --zk-auth identity the admin (coordinator) and secures the whole tree."""
    from aligner.acl import AclLedger, grants_json
    from aligner.settings import zk_security

    if identity is None and (subject or job or reader):
        usage("--subject, --job and --reader need --identity")
    with ledger() as led:
        grants = AclLedger(led).grant(zk_security().auth, identity, subject or (), job or (), reader)
    if not emit(grants_json(grants), as_json):
        out.print(f"admin {grants.admin}; " + (f"{identity.split(':', 1)[0]} granted" if identity else "ACLs applied"),
                  markup=False)


@app.command("show")
def acl_show(
    path: Annotated[str | None, typer.Argument(help="A ZooKeeper path (default: the root)", show_default=False)] = None,
    depth: Annotated[int, typer.Option(min=0, help="Levels of children to show")] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Print the ACLs of a node and its children, and the grants."""
    from aligner.acl import AclLedger, grants_json

    with ledger() as led:
        acls = AclLedger(led)
        rows = acls.show(path or led.layout.root, depth)
        grants, _ = acls.grants()
    if emit({**grants_json(grants), "acls": {p: [{"id": w, "perms": perms} for w, perms in a] for p, a in rows}},
            as_json):
        return
    acl_table(rows)
    if grants is None:
        out.print("no grants: nodes are created open (`aligner --zk-auth digest:ADMIN:PW acl grant` secures them)")
