"""``aligner stack up|status|down|env``: the embedded ZooKeeper + Tansu stack."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from aligner.coordinator import stack as stack_mod
from aligner.coordinator.cli.common import JsonFlag, emit, err, out
from aligner.coordinator.cli.connect import state
from aligner.errors import StackError

app = typer.Typer(help="The embedded ZooKeeper + Tansu stack.", no_args_is_help=True)


@app.command("up")
def stack_up(
    as_json: JsonFlag = False,
    zk_tls: Annotated[bool, typer.Option("--zk-tls", help="ZooKeeper on a TLS client port only (a throwaway "
                                         "CA and certificates in the stack's data dir; `stack env` exports them)")
                      ] = False,
    retention: Annotated[bool, typer.Option("--retention/--no-retention", help="Also run the coordinator's "
                                            "retention loop (`aligner retention run`) with a new stack")] = True,
) -> None:
    """Start ZooKeeper and Tansu (and with --retention the retention loop, which keeps ZooKeeper bounded by
    ALIGNER_RETENTION_*: 24 h, >= 1,000 epochs), or restart only the components that are down (same port
    and data)."""
    info, actions = stack_mod.stack_up(state.settings.home, zk_tls=zk_tls, retention=retention,
                                       root=state.settings.root)
    if emit({**asdict(info), "actions": actions}, as_json):
        return
    for comp in stack_mod.components(info):
        tls = " over TLS" if comp.name == stack_mod.ZOOKEEPER and info.zk_tls else ""
        tls = f" (metrics; collects {info.root})" if comp.name == stack_mod.RETENTION else tls
        out.print(f"{comp.label} {comp.address}{tls}: {actions[comp.name]} (pid {comp.pid}, {comp.state})",
                  soft_wrap=True)
    if actions.get(stack_mod.KAFKA) == "restarted":
        err.print("note: the restarted broker starts empty (Tansu keeps topics in memory)", soft_wrap=True)
    out.print('eval "$(aligner stack env)" points other shells at it')


@app.command("status")
def stack_status(as_json: JsonFlag = False) -> None:
    """Each component of the embedded stack: up or down, pid, port, data dir and log."""
    home = state.settings.home
    info = stack_mod.read_stack(home)
    if info is None:
        raise StackError(f"no embedded stack in {home}: `aligner stack up` starts one")
    comps = stack_mod.components(info)
    if emit({"home": str(home), "workdir": info.workdir, "components": [asdict(c) for c in comps]}, as_json):
        return
    width = max(len(c.label) for c in comps)
    for c in comps:
        colour = "green" if c.up else "red"
        out.print(f"{c.label:<{width}}  [{colour}]{c.state:<13}[/] pid {c.pid:<7} {c.address}  data {c.data}  "
                  f"log {c.log}", soft_wrap=True)
    if not all(c.up for c in comps):
        out.print("`aligner stack up` restarts what is down, on its own port and data")


@app.command("down")
def stack_down(as_json: JsonFlag = False) -> None:
    """Stop the embedded stack and remove its data; the only command that removes stack state."""
    done = stack_mod.stack_down(state.settings.home)
    if emit({"stopped": bool(done), "removed": done}, as_json):
        return
    if not done:
        out.print("no stack was running; nothing removed")
        return
    out.print("stack stopped:")
    for line in done:
        out.print(f"  {line}", markup=False, soft_wrap=True)


@app.command("env")
def stack_env(as_json: JsonFlag = False) -> None:
    """Print the connection settings of the embedded stack as shell exports."""
    info = stack_mod.read_stack(state.settings.home)
    if info is None:
        raise StackError("no embedded stack is running: `aligner stack up` starts one")
    down = [c for c in stack_mod.components(info) if c.state == "down"]
    if down:
        err.print(f"warning: {', '.join(c.label for c in down)} down: `aligner stack up` restarts it",
                  markup=False, soft_wrap=True)
    if not emit(info.env(), as_json):
        for k, v in info.env().items():
            print(f"export {k}={v}")
