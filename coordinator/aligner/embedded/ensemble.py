"""A ZooKeeper ensemble on loopback: N servers of Debian's ZooKeeper with quorum and election ports, the
shape users deploy (three or five servers), for tests, the chaos checker and ``aligner stack up --zk-servers``.

Each server has its own data directory (``zk-{i}/``, with its ``myid``), configuration and log, and can be
killed, paused and restarted alone: a restarted server rejoins the quorum from its data. The leader is found
with the ``srvr`` four-letter word, as an operator would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aligner.embedded.processes import (
    _java,
    _kill_group,
    _spawn,
    free_port,
    wait_for,
    zk_classpath,
)
from aligner.errors import NoQuorumError, StackError

if TYPE_CHECKING:
    from aligner.embedded.netns import NetLab

ZK_LOGGING = ("/usr/share/java/maven3-slf4j-provider.jar", "/usr/share/java/maven-shared-utils.jar")
"""An SLF4J binding Debian ships (Maven's simple logger): with it each server's log says what the quorum did
(elections, syncs, truncations); without it ZooKeeper logs nothing (SLF4J's no-op logger)."""

ENSEMBLE_HEAP = "256m"
"""Heap of each server (fixed and touched at start, as the single embedded server's): three of them on a
2-core machine stay at ~300 MB each."""


@dataclass(frozen=True)
class ServerPorts:
    client: int
    quorum: int
    election: int


def _mode(port: int, host: str = "127.0.0.1") -> str | None:
    """``leader``, ``follower`` (or ``standalone``) from ``srvr``; None when the server does not serve."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"srvr")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def server_dir(workdir: Path, i: int) -> Path:
    """Server ``i``'s directory (0-based): its zoo.cfg, data (with ``myid``) and log."""
    return workdir / f"zk-{i}"


def _logging() -> tuple[str, ...]:
    return ZK_LOGGING if all(Path(p).exists() for p in ZK_LOGGING) else ()


def spawn_server(workdir: Path, i: int, tie_to_parent: bool,
                 prefix: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start server ``i`` of the ensemble in ``workdir`` on its existing zoo.cfg and data (``prefix``: in its
    network namespace)."""
    home = server_dir(workdir, i)
    argv = [_java(), f"-Xms{ENSEMBLE_HEAP}", f"-Xmx{ENSEMBLE_HEAP}", "-XX:+AlwaysPreTouch",
            f"-Dzookeeper.log.dir={home}", "-cp", ":".join((*zk_classpath(), *_logging())),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(home / "zoo.cfg")]
    return _spawn([*(prefix or []), *argv], home, SERVER_LOG, tie_to_parent)


SERVER_LOG = "zookeeper.log"

REFUSED = b"Unable to load database on disk"
"""What ZooKeeper logs, then exits, when its snapshots or transaction log fail to load (a CRC check failed)."""


def log_size(workdir: Path, i: int) -> int:
    """Server ``i``'s log size now: a start's own lines are what follows it (the log is appended to)."""
    log = server_dir(workdir, i) / SERVER_LOG
    return log.stat().st_size if log.exists() else 0


def refused_its_data(workdir: Path, i: int, since: int) -> bool:
    """Whether server ``i``, started when its log had ``since`` bytes, refused to load its data on disk."""
    try:
        with open(server_dir(workdir, i) / SERVER_LOG, "rb") as f:
            f.seek(since)
            return REFUSED in f.read()
    except OSError:
        return False


def move_data_aside(workdir: Path, i: int) -> Path:
    """The operator's procedure for a member whose disk is damaged: its snapshots and logs moved aside (kept
    for a post-mortem; ``myid`` stays), so it starts empty and takes a snapshot from the leader. Safe only
    while the other members hold a quorum, which acknowledged every committed write: callers check."""
    data = server_dir(workdir, i) / "data" / "version-2"
    aside = data.with_name(f"{data.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    if data.exists():
        data.rename(aside)
    return aside


def quorum_without(ports: list[int], i: int, hosts: list[str] | None = None) -> bool:
    """Whether the ensemble's other members serve with a leader among them (client ports, 0-based ``i``)."""
    modes = [_mode(p, hosts[j] if hosts else "127.0.0.1") for j, p in enumerate(ports) if j != i]
    return "leader" in modes and sum(m in ("leader", "follower") for m in modes) > len(ports) // 2


class ZkEnsemble:
    """``servers`` ZooKeeper servers on loopback forming one ensemble; its children die with the caller
    unless ``tie_to_parent`` is False."""

    def __init__(self, workdir: Path, servers: int = 3, tie_to_parent: bool = True,
                 netns: NetLab | None = None) -> None:
        """``netns``: each server in a network namespace of its own (``zk1``, ``zk2``, ...) of that lab."""
        if servers < 3 or servers % 2 == 0:
            raise StackError(f"a ZooKeeper ensemble has an odd number of servers, at least 3 (got {servers})")
        self.workdir = Path(workdir).resolve()  # each server runs in its own directory: paths must be absolute
        self.servers = servers
        self.tie_to_parent = tie_to_parent
        self.netns = netns
        self.ports = [ServerPorts(free_port(), free_port(), free_port()) for _ in range(servers)]
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._log_at: dict[int, int] = {}
        """Size of each server's log when it was last started."""

    @staticmethod
    def name(i: int) -> str:
        """Server ``i``'s namespace name in a lab."""
        return f"zk{i + 1}"

    def host(self, i: int) -> str:
        """Server ``i``'s address: loopback, or its own namespace's."""
        return self.netns.ip(self.name(i)) if self.netns is not None else "127.0.0.1"

    @property
    def hosts(self) -> str:
        """The client connect string naming every server."""
        return ",".join(f"{self.host(i)}:{p.client}" for i, p in enumerate(self.ports))

    def _dir(self, i: int) -> Path:
        return server_dir(self.workdir, i)

    def _write_cfg(self, i: int) -> Path:
        data = self._dir(i) / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{i + 1}\n")
        cfg = self._dir(i) / "zoo.cfg"
        peers = "".join(f"server.{j + 1}={self.host(j)}:{p.quorum}:{p.election}\n" for j, p in enumerate(self.ports))
        cfg.write_text(
            "tickTime=500\ninitLimit=20\nsyncLimit=10\n"
            f"dataDir={data}\nclientPort={self.ports[i].client}\nclientPortAddress={self.host(i)}\n"
            "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr,cons\n"
            "autopurge.snapRetainCount=3\nautopurge.purgeInterval=1\n"
            "maxClientCnxns=0\nminSessionTimeout=1000\nforceSync=no\n"
            f"{peers}"
        )
        return cfg

    def start_server(self, i: int) -> None:
        """Start server ``i`` again without waiting (a caller's loop watches it rejoin)."""
        if self.pid(i) is None:
            self._start_one(i)

    def _start_one(self, i: int) -> None:
        if not (self._dir(i) / "zoo.cfg").exists():
            self._write_cfg(i)
        self._log_at[i] = log_size(self.workdir, i)
        prefix = self.netns.prefix(self.name(i)) if self.netns is not None else None
        self._procs[i] = spawn_server(self.workdir, i, self.tie_to_parent, prefix)

    def start(self, timeout: float = 120.0) -> str:
        """Start every server; returns once a quorum serves (a leader and every other server following)."""
        try:
            for i in range(self.servers):
                self._dir(i).mkdir(parents=True, exist_ok=True)
                self._start_one(i)
            self.wait_serving(timeout)
        except BaseException:
            self.stop()
            raise
        return self.hosts

    def wait_serving(self, timeout: float, servers: list[int] | None = None) -> None:
        """Until a leader serves and each of ``servers`` (default: every live one) answers as a member."""
        def ready() -> bool:
            for i in servers or []:
                proc = self._procs[i]
                if proc.poll() is not None:
                    raise StackError(f"ZooKeeper server {i + 1} exited (code {proc.returncode}); "
                                     f"see {self._dir(i) / SERVER_LOG}")
            wanted = servers if servers is not None else [i for i in self._procs if self.pid(i) is not None]
            modes = {i: self.mode(i) for i in range(self.servers)}
            return "leader" in modes.values() and all(modes[i] in ("leader", "follower") for i in wanted)

        wait_for(ready, timeout, f"a ZooKeeper ensemble of {self.servers} to elect a leader", interval=0.2)

    def data_dir(self, i: int) -> Path:
        """Server ``i``'s snapshots and transaction logs (ZooKeeper's ``version-2`` directory)."""
        return self._dir(i) / "data" / "version-2"

    def pid(self, i: int) -> int | None:
        proc = self._procs.get(i)
        return proc.pid if proc is not None and proc.poll() is None else None

    def pids(self) -> list[int]:
        return [p for i in range(self.servers) if (p := self.pid(i)) is not None]

    def mode(self, i: int) -> str | None:
        return _mode(self.ports[i].client, self.host(i))

    def leader(self) -> int:
        """Index of the serving leader (raises when there is none right now)."""
        for i in range(self.servers):
            if self.pid(i) is not None and self.mode(i) == "leader":
                return i
        raise StackError("no ZooKeeper server is the leader right now")

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (its data stays: :meth:`restart` brings it back)."""
        proc = self._procs.get(i)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def pause(self, i: int) -> None:
        pid = self.pid(i)
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        pid = self.pid(i)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def restart(self, i: int, timeout: float = 120.0) -> None:
        """Start server ``i`` again on its data; returns once it serves as a member of the quorum. A server
        that cannot load its data (a checksum failed) is rebuilt from the quorum (:meth:`rebuild`)."""
        if self.pid(i) is not None:
            raise StackError(f"ZooKeeper server {i + 1} is still running (pid {self.pid(i)})")
        self.start_server(i)
        try:
            self.wait_serving(timeout, [i])
        except StackError:
            if not self.damaged(i):
                raise
            if not quorum_without([p.client for p in self.ports], i, [self.host(j) for j in range(self.servers)]):
                raise NoQuorumError(f"ZooKeeper server {i + 1} refuses its damaged data and the other servers "
                                    "hold no quorum to rebuild it from; its data is left as it is") from None
            self.rebuild(i)
            self.wait_serving(timeout, [i])

    def damaged(self, i: int) -> bool:
        """Whether server ``i`` exited because its data on disk failed to load (ZooKeeper's own words)."""
        proc = self._procs.get(i)
        if proc is None or proc.poll() is None:
            return False
        return refused_its_data(self.workdir, i, self._log_at.get(i, 0))

    def rebuild(self, i: int) -> Path:
        """Start server ``i`` on empty data, its damaged data moved aside (:func:`move_data_aside`)."""
        if self.pid(i) is not None:
            raise StackError(f"ZooKeeper server {i + 1} is still running (pid {self.pid(i)})")
        aside = move_data_aside(self.workdir, i)
        self.start_server(i)
        return aside

    def stop(self) -> None:
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            _kill_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):  # killed: reaped by whoever waits last
                proc.wait(timeout=5)
        self._procs.clear()
