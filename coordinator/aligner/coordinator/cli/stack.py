"""``aligner stack up|status|down|env``: the embedded ZooKeeper + Tansu stack."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aligner.coordinator.cli.common import JsonFlag, emit, err, out
from aligner.coordinator.cli.connect import state
from aligner.embedded import stack as stack_mod
from aligner.errors import StackError

if TYPE_CHECKING:
    from aligner.connectors.fetch_probe import ProbeResult

# The fetch probe (and the Kafka client) is imported where it is used: a usage error loads neither.

app = typer.Typer(help="The embedded ZooKeeper + Tansu stack.", no_args_is_help=True)


@app.command("up")
def stack_up(
    as_json: JsonFlag = False,
    zk_tls: Annotated[bool, typer.Option("--zk-tls", help="ZooKeeper on a TLS client port only (a throwaway "
                                         "CA and certificates in the stack's data dir; `stack env` exports them)")
                      ] = False,
    retention: Annotated[bool, typer.Option("--retention/--no-retention", help="Also run the coordinator's "
                                            "retention loop (`aligner retention run`) with a new stack")] = True,
    zk_servers: Annotated[int, typer.Option("--zk-servers", min=1, help="ZooKeeper servers of a new stack: 3 or 5 "
                                            "start an ensemble on loopback (quorum and election ports)")] = 1,
    netns: Annotated[bool | None, typer.Option("--netns/--no-netns", help="ZooKeeper (each server) and the "
                                               "broker of a new stack each in a network namespace of its own, "
                                               "reached from the host through a bridge (root, iproute2, "
                                               "nftables); a running stack keeps how it was started")] = None,
) -> None:
    """Start ZooKeeper and Tansu (and with --retention the retention loop, which keeps ZooKeeper bounded by
    ALIGNER_RETENTION_*: 24 h, >= 1,000 epochs), or restart only the components that are down (same port
    and data)."""
    if zk_servers > 1 and (zk_servers % 2 == 0 or zk_tls):
        raise typer.BadParameter("an ensemble has an odd number of servers (3, 5, ...), without --zk-tls",
                                 param_hint="--zk-servers")
    if netns and zk_tls:  # the stack's certificates name 127.0.0.1 only
        raise typer.BadParameter("ZooKeeper TLS serves on loopback only, not in a network namespace",
                                 param_hint="--netns")
    info, actions = stack_mod.stack_up(state.settings.home, zk_tls=zk_tls, retention=retention,
                                       root=state.settings.root, zk_servers=zk_servers, in_netns=netns)
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
def stack_status(
    as_json: JsonFlag = False,
    fetch_probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Time a fetch from the log start of "
                                              "each partition of the broker and warn about slow ones "
                                              "(over 100 ms; about 10 s at most)")] = True,
) -> None:
    """Each component of the embedded stack: up or down, pid, port, data dir and log; and each partition
    of the broker grown past the size where a fetch from its log start takes over 100 ms."""
    home = state.settings.home
    info = stack_mod.read_stack(home)
    if info is None:
        raise StackError(f"no embedded stack in {home}: `aligner stack up` starts one")
    comps = stack_mod.components(info)
    kafka_up = any(c.name == stack_mod.KAFKA and c.up for c in comps)
    result = _probe(info.kafka) if fetch_probe and kafka_up else None
    slow = [asdict(m) for m in result.slow] if result is not None and result.error is None else None
    if emit({"home": str(home), "workdir": info.workdir, "components": [asdict(c) for c in comps],
             "slow_partitions": slow,
             "fetch_probe": None if result is None else _probe_json(result)}, as_json):
        return
    width = max(len(c.label) for c in comps)
    for c in comps:
        colour = "green" if c.up else "red"
        where = f" (netns {c.netns})" if c.netns else ""
        out.print(f"{c.label:<{width}}  [{colour}]{c.state:<13}[/] pid {c.pid:<7} {c.address}{where}  data {c.data}  "
                  f"log {c.log}", soft_wrap=True)
    if not all(c.up for c in comps):
        out.print("`aligner stack up` restarts what is down, on its own port and data")
    if result is not None:
        _print_probe(result)


def _probe(bootstrap: str) -> ProbeResult:
    """The fetch probe, which never fails the command: the components above already say what is down."""
    from aligner.connectors.fetch_probe import SLOW_FETCH_S, ProbeResult, probe

    try:
        return probe(bootstrap)
    except Exception as exc:  # a status prints whatever the probe met, and goes on
        failed = ProbeResult(SLOW_FETCH_S)
        failed.error = f"{type(exc).__name__}: {exc}"
        return failed


def _probe_json(result: ProbeResult) -> dict[str, Any]:
    from aligner.connectors.fetch_probe import PROBE_FLOOR

    return {"threshold_s": result.threshold, "seconds": round(result.seconds, 3),
            "measured": [asdict(m) for m in result.measured], "small_partitions": result.small,
            "floor_offsets": PROBE_FLOOR, "skipped": result.skipped, "error": result.error}


def _print_probe(result: ProbeResult) -> None:
    from aligner.connectors.fetch_probe import PROBE_FLOOR

    if result.error is not None:
        err.print(f"note: fetch probe skipped: {result.error}", markup=False, soft_wrap=True)
        return
    for m in result.slow:
        took = f"in {m.seconds:.2f} s" if m.seconds is not None else f"nothing within {m.limit:.1f} s"
        err.print(f"warning: {m.name}: a fetch from its log start answered {took} (over "
                  f"{result.threshold * 1000:.0f} ms; offsets {m.low}..{m.high}): the embedded broker slows with "
                  "batches per partition: readers of old epochs and restores get slow; Apache Kafka has no such "
                  "curve; see the docs, The embedded stack", markup=False, soft_wrap=True)
    if result.skipped:
        err.print(f"note: fetch probe: {len(result.skipped)} partition(s) not measured: "
                  + "; ".join(f"{k}: {why}" for k, why in result.skipped.items()), markup=False, soft_wrap=True)
    if not result.measured and not result.skipped:
        out.print(f"fetch probe: no partition spans {PROBE_FLOOR:,} offsets or more ({result.small} smaller "
                  "not timed: too few batches to be slow)", markup=False, soft_wrap=True)
        return
    slowest = max(result.measured, key=lambda m: m.seconds if m.seconds is not None else float("inf"), default=None)
    took = "" if slowest is None else f"{slowest.seconds:.3f} s" if slowest.seconds is not None else "no answer"
    worst = "" if slowest is None else f", slowest {slowest.name} {took}"
    out.print(f"fetch probe: {len(result.measured)} partition(s) timed from their log start in {result.seconds:.1f} s"
              f"{worst}, {len(result.slow)} over {result.threshold * 1000:.0f} ms; {result.small} under "
              f"{PROBE_FLOOR:,} offsets not probed", markup=False, soft_wrap=True)


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
