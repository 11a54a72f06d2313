"""Network namespaces for the embedded stack and the chaos checker: one namespace per component, joined by
veth pairs to a bridge, so a fault can cut, slow or drop the traffic between two components while both run.

The lab is made and removed by its owner (``ip netns``, ``ip link``, root only) and uses one private /24 of
its own: the bridge holds ``.1`` (the owner's own process reaches every component through it), each
component one more address. Nothing else on the machine is touched. Faults are applied inside a
component's namespace, so they never reach another one:

- a *cut* drops (silently, as a partition does) every packet between the namespace and some addresses
  (nftables, a table ``inet chaos`` of the namespace's own);
- a *slow, lossy link* limits the namespace's outgoing rate (``tc`` token bucket: packets queue, so they
  arrive late, and are dropped past a latency bound) and drops a share of its packets both ways at random
  (nftables ``numgen random``). ``tc netem`` would add a fixed delay, but this machine's kernel has no netem
  qdisc (``Specified qdisc kind is unknown``); a rate limit delays whatever a component sends in bulk.

Processes are started in a namespace with ``ip netns exec NS argv...``, which execs the program: the pid a
caller spawns is the component's own (signals, pauses and kills work as without namespaces).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from aligner.embedded.processes import _alive
from aligner.errors import StackError

PREFIX = "aln"
"""Namespaces, bridges and veths of every lab start with it, then the owner's pid: ``aln12345-...``."""
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
"""The private range labs draw their /24 from (one not in use on the machine)."""
_OWNED = re.compile(rf"^{PREFIX}(\d+)(?:-|br$|v\d+$)")
DETACHED = f"{PREFIX}s"
"""Tag (and a number) of a lab outliving its maker (``stack up --netns``): no pid, so only ``stack down`` removes it."""


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> str:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise StackError(f"{argv[0]} not found: network namespaces need iproute2 and nftables "
                         "(apt-get install -y iproute2 nftables)") from None
    if check and done.returncode != 0:
        raise StackError(f"{' '.join(argv)} failed: {done.stderr.strip()[:300]}")
    return done.stdout


def available() -> str | None:
    """Why namespaces cannot be used here (None when they can): root and the tools are needed."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [t for t in ("ip", "nft", "tc") if shutil.which(t) is None]
    return f"{', '.join(missing)} not found (apt-get install -y iproute2 nftables)" if missing else None


def sweep() -> list[str]:
    """Remove the namespaces and bridges of labs whose owner is gone (a SIGKILLed checker cannot remove its
    own); returns what was removed. Labs of live owners are left alone."""
    removed = []
    for ns in _run(["ip", "netns", "list"], check=False).split():
        m = _OWNED.match(ns)
        if m and not _alive(int(m.group(1))):
            _run(["ip", "netns", "del", ns], check=False)
            removed.append(ns)
    for line in _run(["ip", "-o", "link", "show"], check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = _OWNED.match(name)
        if m and not _alive(int(m.group(1))):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class LabState:
    """What rebuilds a lab in another process (the detached stack's state file): its tag, its /24 and each
    component's address (the namespace, veth index and address follow from them)."""

    tag: str
    subnet: str
    hosts: tuple[tuple[str, str], ...]
    """(component, address) pairs."""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LabState:
        return cls(str(raw["tag"]), str(raw["subnet"]), tuple((str(n), str(ip)) for n, ip in raw["hosts"]))


@dataclass
class Host:
    """One component's namespace and address."""

    name: str
    ns: str
    ip: str
    index: int

    def prefix(self) -> list[str]:
        """What to put before a command line to run it in this namespace."""
        return ["ip", "netns", "exec", self.ns]


@dataclass
class NetLab:
    """A bridge and the namespaces of one owner's components; :meth:`close` removes them all."""

    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: dict[str, Host] = field(default_factory=dict)
    cuts: dict[str, set[str]] = field(default_factory=dict)
    """Per host, the hosts it cannot reach (and that cannot reach it)."""
    slow: dict[str, str] = field(default_factory=dict)
    """Per host, its rate limit (tc tbf settings)."""
    loss: dict[str, int] = field(default_factory=dict)
    """Per host, the packets per thousand it loses at random, both ways."""
    subnet: ipaddress.IPv4Network | None = None

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def gateway(self) -> str:
        """The bridge's address: where the owner's own connections come from."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    @classmethod
    def detached(cls) -> NetLab:
        """A lab (not opened yet) with the first free :data:`DETACHED` tag on this machine."""
        links, spaces = _run(["ip", "-o", "link", "show"], check=False), _run(["ip", "netns", "list"], check=False)
        n = next(n for n in itertools.count(1) if f"{DETACHED}{n}br" not in links and f"{DETACHED}{n}-" not in spaces)
        return cls(tag=f"{DETACHED}{n}")

    def state(self) -> LabState:
        assert self.subnet is not None, "open() the lab first"
        return LabState(self.tag, str(self.subnet), tuple((h.name, h.ip) for h in self.hosts.values()))

    @classmethod
    def restore(cls, state: LabState) -> NetLab:
        """The lab another process opened, as its :meth:`state` recorded it (its namespaces are not checked)."""
        subnet = ipaddress.IPv4Network(state.subnet)
        hosts = {name: Host(name, f"{state.tag}-{name}", ip, int(ipaddress.IPv4Address(ip)) - int(subnet[0]))
                 for name, ip in state.hosts}
        return cls(tag=state.tag, hosts=hosts, subnet=subnet)

    def exists(self, name: str) -> bool:
        """Whether component ``name``'s namespace is there (a reboot removes every namespace)."""
        return name in self.hosts and self.hosts[name].ns in _run(["ip", "netns", "list"], check=False).split()

    def open(self) -> NetLab:
        why = available()
        if why:
            raise StackError(why)
        sweep()
        used = _run(["ip", "-4", "-o", "addr"], check=False)
        free = [n for n in SUBNETS.subnets(new_prefix=24) if f" {n.network_address + 1}/" not in used
                and str(n.network_address)[:-1] not in used]
        if not free:
            raise StackError(f"no free /24 in {SUBNETS} for the network namespaces")
        self.subnet = random.choice(free)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        try:
            _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
        except BaseException:
            self.close()
            raise
        return self

    def add(self, name: str) -> Host:
        """Component ``name``'s namespace (made on first use): its own address, joined to the bridge."""
        if name in self.hosts:
            return self.hosts[name]
        assert self.subnet is not None, "open() the lab first"
        index = len(self.hosts) + 2
        if index > 250:
            raise StackError("a lab holds at most 249 components")
        ns, veth = f"{self.tag}-{name}", f"{self.tag}v{index}"
        ip = str(self.subnet.network_address + index)
        host = Host(name, ns, ip, index)
        self.hosts[name] = host
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
        for argv in (["ip", "addr", "add", f"{ip}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                     ["ip", "link", "set", "lo", "up"]):
            _run([*host.prefix(), *argv])
        return host

    def ip(self, name: str) -> str:
        return self.add(name).ip

    def prefix(self, name: str) -> list[str]:
        return self.add(name).prefix()

    # ---- faults ----------------------------------------------------------------------------------

    def _apply_cuts(self, name: str) -> None:
        """Write the namespace's nftables table from :attr:`cuts` and :attr:`loss` (replaced as a whole)."""
        host = self.hosts[name]
        peers = sorted(self.hosts[p].ip for p in self.cuts.get(name, ()))
        drop = [f"ip saddr {{ {', '.join(peers)} }} drop;" if peers else "",
                f"ip daddr {{ {', '.join(peers)} }} drop;" if peers else ""]
        lose = self.loss.get(name, 0)
        if lose:
            drop = [f"{rule} numgen random mod 1000 < {lose} drop;" for rule in drop]
        rules = "table inet chaos\ndelete table inet chaos\n"
        if peers or lose:
            rules += ("table inet chaos {\n"
                      f"  chain in {{ type filter hook input priority 0; policy accept; {drop[0]} }}\n"
                      f"  chain out {{ type filter hook output priority 0; policy accept; {drop[1]} }}\n"
                      "}\n")
        _run([*host.prefix(), "nft", "-f", "-"], stdin=rules)

    def cut(self, a: str, others: list[str]) -> None:
        """Drop every packet between ``a`` and each of ``others`` (both ways), until :meth:`join`."""
        for b in others:
            if b == a:
                continue
            self.cuts.setdefault(a, set()).add(b)
            self.cuts.setdefault(b, set()).add(a)
        for name in {a, *others}:
            self._apply_cuts(name)

    def join(self, a: str, others: list[str] | None = None) -> None:
        """Undo :meth:`cut` between ``a`` and ``others`` (default: everything ``a`` was cut from)."""
        peers = set(self.cuts.get(a, set())) if others is None else set(others)
        for b in peers:
            self.cuts.get(a, set()).discard(b)
            self.cuts.get(b, set()).discard(a)
        for name in {a, *peers}:
            if name in self.hosts:
                self._apply_cuts(name)

    def slow_link(self, name: str, kbit: int, loss_per_mille: int = 0) -> None:
        """Limit ``name``'s outgoing rate to ``kbit`` (packets queue up to 2 s, then drop) and lose
        ``loss_per_mille`` of its packets both ways, until :meth:`fast_link`."""
        spec = ["rate", f"{kbit}kbit", "burst", "16kbit", "latency", "2s"]
        _run([*self.prefix(name), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", *spec])
        self.slow[name] = " ".join(spec)
        self.loss[name] = loss_per_mille
        self._apply_cuts(name)

    def fast_link(self, name: str) -> None:
        if self.slow.pop(name, None) is not None:
            _run([*self.prefix(name), "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        if self.loss.pop(name, 0):
            self._apply_cuts(name)

    def heal(self) -> None:
        """Every cut joined, every link fast again."""
        for name in list(self.slow):
            self.fast_link(name)
        for name in list(self.cuts):
            self.cuts[name].clear()
            self._apply_cuts(name)

    def close(self) -> None:
        """Remove every namespace (its veth goes with it) and the bridge. Processes still inside keep their
        namespace alive until they end; callers stop them first."""
        while self.hosts:  # popped one at a time: a run's hard stop may close the lab while its unwinding does
            _, host = self.hosts.popitem()
            _run(["ip", "link", "del", f"{self.tag}v{host.index}"], check=False)  # both ends, whoever holds the ns
            _run(["ip", "netns", "del", host.ns], check=False)
        with contextlib.suppress(StackError):
            _run(["ip", "link", "del", self.bridge], check=False)

    def __enter__(self) -> NetLab:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
