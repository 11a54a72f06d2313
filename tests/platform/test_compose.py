"""The Docker Compose stack (``docker-compose.yml``, ``docker-compose.sasl.yml``) checked against the product.

No Docker engine runs on the machines that build and test the product, so the compose stack is never started
here; what can break in it without a run is checked from the files:

- images: none from Bitnami (its free images are gone), every tag pinned (no ``latest``, none missing, the
  Dockerfile's base image too), the project image tagged with the project's version; Kafka is ``apache/kafka`` 4.x
  in KRaft mode (process roles, one controller quorum every node agrees on, no ZooKeeper setting), and ZooKeeper is
  a release past the ones that can forget acknowledged writes;
- every service has a health check, or is a one-shot run that says why it has none (``x-one-shot``);
- every ``ALIGNER_*`` variable the files set is one the product reads (collected from the source at test time, so
  a renamed variable fails here) with a value the product accepts, and the product's containers are pointed at
  exactly the ZooKeeper servers and brokers the file runs;
- every command a service runs parses against the real command line (``aligner``, ``aligner-worker``, the
  experiments, the demo, Spark's launcher) with nothing run and nothing connected;
- the files mounted from ``./deploy``, and the paths the containers are told to read in them, exist;
- the SASL variant authenticates every Kafka listener and every ZooKeeper session, with client settings that
  match the brokers'.

Each check runs on every shape: one ZooKeeper server and one broker, the cluster profile of
``deploy/cluster.env`` (three of each), and both with the SASL variant on top.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from aligner.retention_policy import RetentionPolicy
from aligner.settings import Settings, kafka_properties, parse_properties, parse_zk_auth


def _repository_root() -> Path:
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").exists() and (folder / "docker-compose.yml").exists():
            return folder
    raise RuntimeError("no repository root above this test")


ROOT = _repository_root()
BASE = ROOT / "docker-compose.yml"
SASL = ROOT / "docker-compose.sasl.yml"
CLUSTER_ENV = ROOT / "deploy" / "cluster.env"
GEN_CERTS = ROOT / "deploy" / "sasl" / "gen-certs.sh"
"""Makes what the SASL variant mounts from ``deploy/sasl/certs`` (not in the repository)."""

PRODUCT_SOURCES = ("aligner", "connectors", "coordinator", "experiments")
"""The code the project image runs: the library's three roots and the demo and experiments the services start."""
NOT_SOURCES = {"results", ".peer-venv", "__pycache__"}

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# ---- reading the files as Compose does -------------------------------------------------------------------


def env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, optional quotes), as ``docker compose --env-file`` reads them."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip("\"'")
    return out


_VARIABLE = re.compile(r"\$(?:\$|\{(\w+)(?:(:?-)([^}]*))?\}|(\w+))")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``$$``, ``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``${NAME-default}`` in every string value."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1) or m.group(4), m.group(2), m.group(3)
        if (op == ":-" and not env.get(name)) or (op == "-" and name not in env):
            return default
        return env.get(name, "")

    return _VARIABLE.sub(one, value)


def _normalized(service: dict[str, Any]) -> dict[str, Any]:
    """List forms of ``environment`` and ``depends_on`` as mappings, as Compose reads them."""
    service = dict(service)
    env = service.get("environment")
    if isinstance(env, list):
        service["environment"] = dict(item.partition("=")[::2] for item in env)
    deps = service.get("depends_on")
    if isinstance(deps, list):
        service["depends_on"] = {name: {"condition": "service_started"} for name in deps}
    return service


def _target(volume: Any) -> str:
    """The container path of a volume (long or short syntax; an anonymous volume is only that path)."""
    if isinstance(volume, dict):
        return str(volume["target"])
    parts = str(volume).split(":")
    return parts[1] if len(parts) > 1 else parts[0]


def _merge(base: Any, over: Any, key: str = "") -> Any:
    """An override file on its base: mappings merge, ``ports`` add up, ``volumes`` replace by container path,
    everything else (commands, health check tests) is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base[k], v, k) if k in base else v for k, v in over.items()}}
    if key == "ports" and isinstance(base, list) and isinstance(over, list):
        return base + [p for p in over if p not in base]
    if key == "volumes" and isinstance(base, list) and isinstance(over, list):
        replaced = {_target(v) for v in over}
        return [v for v in base if _target(v) not in replaced] + over
    return over


def load(files: tuple[Path, ...], env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every service of the files merged in order and interpolated with ``env``, whatever its profiles."""
    services: dict[str, Any] = {}
    for path in files:
        document = yaml.safe_load(path.read_text())
        for name, service in document["services"].items():
            service = _normalized(service)
            services[name] = _merge(services[name], service) if name in services else service
    return interpolate(services, env)


def active(services: dict[str, dict[str, Any]], env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The services ``up`` starts: those without profiles and those of ``COMPOSE_PROFILES``."""
    profiles = {p for p in env.get("COMPOSE_PROFILES", "").split(",") if p}
    return {n: s for n, s in services.items() if not s.get("profiles") or profiles & set(s["profiles"])}


SHAPES = {
    "one-server": ((BASE,), {}),
    "cluster": ((BASE,), env_file(CLUSTER_ENV)),
    "sasl": ((BASE, SASL), {}),
    "sasl-cluster": ((BASE, SASL), env_file(CLUSTER_ENV)),
}


@pytest.fixture(params=list(SHAPES))
def shape(request: pytest.FixtureRequest) -> tuple[str, dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(name, every service, the services ``up`` starts) of one shape of the stack."""
    files, env = SHAPES[request.param]
    services = load(files, env)
    return request.param, services, active(services, env)


def image(service: dict[str, Any]) -> tuple[str, str]:
    """``repository, tag`` of a service's image ('' when it has no tag)."""
    ref = service["image"].split("@")[0]
    head, _, last = ref.rpartition("/")
    name, _, tag = last.partition(":")
    return f"{head}/{name}" if head else name, tag


def of_image(services: dict[str, dict[str, Any]], repository: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if "image" in s and image(s)[0] == repository}


def project_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services built from the project's Dockerfile."""
    return {n: s for n, s in services.items() if "build" in s}


def env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def listeners(spec: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    out = {}
    for item in spec.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        out[name] = (host, int(port))
    return out


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source on the host, path in the container) of a service's bind mounts from the repository."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                out.append((volume["source"], volume["target"]))
        elif str(volume).startswith("."):
            source, target = str(volume).split(":")[:2]
            out.append((source, target))
    return out


def host_path(service: dict[str, Any], path: str) -> Path | None:
    """Where a path the container reads comes from on the host, when a bind mount from the repository holds it."""
    for source, target in bind_mounts(service):
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return (ROOT / source / path[len(target):].lstrip("/")).resolve()
    return None


# ---- what the product reads ------------------------------------------------------------------------------

_NAME = re.compile(r"ALIGNER_[A-Z0-9_]*[A-Z0-9]")


def _settings_fields(cls: ast.ClassDef) -> set[str]:
    """``env_prefix`` + field of a pydantic-settings model (``model_config = SettingsConfigDict(env_prefix=...)``)."""
    prefix = ""
    for stmt in cls.body:
        if (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "model_config"
                                                 for t in stmt.targets) and isinstance(stmt.value, ast.Call)):
            for keyword in stmt.value.keywords:
                if keyword.arg == "env_prefix" and isinstance(keyword.value, ast.Constant):
                    prefix = str(keyword.value.value)
    if not prefix.startswith("ALIGNER_"):
        return set()
    return {prefix + stmt.target.id.upper() for stmt in cls.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}


def product_variables() -> set[str]:
    """Every ``ALIGNER_*`` name the product's code looks up: string constants that are exactly such a name
    (``os.environ.get("ALIGNER_ZK_AUTH")``, a table of names) and the fields of its settings models."""
    names: set[str] = set()
    for folder in PRODUCT_SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            if NOT_SOURCES & set(path.relative_to(ROOT).parts):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.fullmatch(node.value):
                    names.add(node.value)
                elif isinstance(node, ast.ClassDef):
                    names |= _settings_fields(node)
    return names


READ = product_variables()


def test_the_variables_are_collected_from_the_code() -> None:
    """The collector is not vacuous: it finds every field of the product's settings models."""
    models = {f"ALIGNER_{f.upper()}" for f in Settings.model_fields}
    models |= {f"ALIGNER_RETENTION_{f.upper()}" for f in RetentionPolicy.model_fields}
    assert models <= READ, f"not found in the code: {sorted(models - READ)}"
    assert {"ALIGNER_ZK_AUTH", "ALIGNER_KAFKA_CONFIG", "ALIGNER_ZK_TLS_CA"} <= READ


# ---- images ------------------------------------------------------------------------------------------------


def test_images_are_pinned_and_none_is_bitnami(shape: Any) -> None:
    _, services, _ = shape
    for name, service in services.items():
        repository, tag = image(service)
        assert "bitnami" not in repository, f"{name}: {service['image']}: Bitnami's free images are gone"
        assert tag and tag != "latest", f"{name}: {service['image']}: pin a tag"
    for name, service in project_services(services).items():
        assert service["image"] == f"epoch-aligner:{PROJECT['version']}", \
            f"{name}: the project image is tagged with the project's version ({PROJECT['version']})"


def test_the_dockerfile_base_image_is_pinned() -> None:
    bases = re.findall(r"^FROM\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert bases
    for base in bases:
        tag = base.rpartition("/")[2].partition(":")[2]
        assert "bitnami" not in base and tag and tag != "latest", f"Dockerfile: FROM {base}: pin a tag"


# ---- Kafka: apache/kafka 4.x in KRaft mode -------------------------------------------------------------------


def test_kafka_is_apache_kafka_4_in_kraft_mode(shape: Any) -> None:
    name, services, up = shape
    kafka_like = {n for n, s in services.items() if "kafka" in image(s)[0].rsplit("/", 1)[-1]}
    brokers = of_image(up, "apache/kafka")
    assert kafka_like == set(of_image(services, "apache/kafka")), "every Kafka is apache/kafka"
    assert len(brokers) == (3 if "cluster" in name else 1), f"{name}: brokers {sorted(brokers)}"
    voters = set()
    for node, service in brokers.items():
        assert re.fullmatch(r"4\.\d+\.\d+", image(service)[1]), f"{node}: {service['image']}: Kafka 4.x"
        e = env(service)
        zk = [k for k in e if "ZOOKEEPER" in k or "ZK_" in k] + [d for d in service.get("depends_on", {})
                                                                  if d.startswith("zookeeper")]
        assert not zk, f"{node}: a ZooKeeper setting on Kafka 4 (KRaft only): {zk}"
        assert set(e["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, f"{node}: combined mode"
        bound, advertised = listeners(e["KAFKA_LISTENERS"]), listeners(e["KAFKA_ADVERTISED_LISTENERS"])
        protocols = dict(p.split(":") for p in e["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        controller, inter_broker = e["KAFKA_CONTROLLER_LISTENER_NAMES"], e["KAFKA_INTER_BROKER_LISTENER_NAME"]
        assert set(bound) == set(protocols), f"{node}: every listener has a security protocol"
        assert controller in bound and controller not in advertised, f"{node}: the controller listener"
        assert inter_broker in advertised, f"{node}: the inter-broker listener is advertised"
        for listener, (host, port) in advertised.items():
            assert port == bound[listener][1], f"{node}: {listener} advertised on another port than it binds"
            if host == "localhost":
                assert f"{port}:{port}" in service.get("ports", []), f"{node}: {listener} :{port} is not published"
            else:
                assert host == node, f"{node}: {listener} advertises {host}"
        voters.add(e["KAFKA_CONTROLLER_QUORUM_VOTERS"])
        quorum = dict(v.split("@") for v in e["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
        assert quorum.get(e["KAFKA_NODE_ID"]) == f"{node}:{bound[controller][1]}", \
            f"{node}: node {e['KAFKA_NODE_ID']} is not a voter at its controller listener: {quorum}"
        replicas = int(e["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"])
        assert int(e["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) <= replicas <= len(brokers), f"{node}: replication"
    assert len(voters) == 1, f"the nodes disagree on the controller quorum: {voters}"
    quorum = dict(v.split("@") for v in voters.pop().split(","))
    assert sorted(h.split(":")[0] for h in quorum.values()) == sorted(brokers), "the quorum is the brokers"
    assert len({env(s)["CLUSTER_ID"] for s in brokers.values()}) == 1, "one cluster id"


def client_addresses(brokers: dict[str, dict[str, Any]]) -> dict[str, str]:
    """host:port -> listener, for every listener the brokers advertise to clients (not between brokers)."""
    out = {}
    for service in brokers.values():
        e = env(service)
        for listener, (host, port) in listeners(e["KAFKA_ADVERTISED_LISTENERS"]).items():
            if listener != e["KAFKA_INTER_BROKER_LISTENER_NAME"]:
                out[f"{host}:{port}"] = listener
    return out


# ---- ZooKeeper: a release that keeps what it acknowledged -----------------------------------------------------


def test_zookeeper_is_a_safe_release_and_one_ensemble(shape: Any) -> None:
    name, _, up = shape
    servers = of_image(up, "zookeeper")
    assert len(servers) == (3 if "cluster" in name else 1), f"{name}: ZooKeeper servers {sorted(servers)}"
    ensembles = set()
    for node, service in servers.items():
        version = tuple(int(p) for p in image(service)[1].split(".")[:3])
        assert version >= (3, 8, 4) and not (3, 9) <= version < (3, 9, 4), \
            f"{node}: {service['image']}: 3.8.0-3.8.3 and 3.9.0-3.9.3 can forget acknowledged writes"
        e = env(service)
        members = dict(s.split("=") for s in e["ZOO_SERVERS"].split())
        assert members.get(f"server.{e['ZOO_MY_ID']}", "").startswith(f"{node}:"), f"{node}: not in {members}"
        ensembles.add(e["ZOO_SERVERS"])
    assert len(ensembles) == 1, f"the servers disagree on the ensemble: {ensembles}"
    members = dict(s.split("=") for s in ensembles.pop().split())
    assert sorted(m.split(":")[0] for m in members.values()) == sorted(servers)


def test_the_product_is_pointed_at_the_stack_it_runs_with(shape: Any) -> None:
    _, services, up = shape
    ensemble = {f"{node}:2181" for node in of_image(up, "zookeeper")}
    clients = client_addresses(of_image(up, "apache/kafka"))
    for name, service in project_services(services).items():
        e = env(service)
        assert set(e["ALIGNER_ZK"].split(",")) == ensemble, f"{name}: ALIGNER_ZK {e['ALIGNER_ZK']}"
        bootstrap = e["ALIGNER_KAFKA"].split(",")
        assert set(bootstrap) <= set(clients), f"{name}: ALIGNER_KAFKA {bootstrap} is not advertised to clients"
        assert len({clients[b] for b in bootstrap}) == 1, f"{name}: ALIGNER_KAFKA mixes listeners"
        assert len(bootstrap) == len(of_image(up, "apache/kafka")), f"{name}: ALIGNER_KAFKA names every broker"


# ---- health checks -------------------------------------------------------------------------------------------


def test_every_service_has_a_health_check_or_says_why_not(shape: Any) -> None:
    _, services, _ = shape
    for name, service in services.items():
        check = service.get("healthcheck")
        if check is None:
            reason = service.get("x-one-shot")
            assert isinstance(reason, str) and reason.strip(), f"{name}: no health check and no x-one-shot reason"
            assert service.get("profiles") and "restart" not in service, \
                f"{name}: a one-shot run is started on purpose (a profile, `run`), never restarted"
            continue
        assert not check.get("disable") and check.get("test"), f"{name}: an empty health check"
        test = check["test"]
        if test[:3] == ["CMD", "python", "-c"]:
            compile(test[3], f"{name} health check", "exec")


# ---- ALIGNER_* variables and their values ---------------------------------------------------------------------


def test_every_aligner_variable_is_one_the_product_reads(shape: Any) -> None:
    _, services, _ = shape
    for name, service in services.items():
        e = env(service)
        unknown = sorted(k for k in e if k.startswith("ALIGNER_") and k not in READ)
        assert not unknown, f"{name}: the product reads no {unknown} (it reads {sorted(READ)})"
        fields = {f: e[f"ALIGNER_{f.upper()}"] for f in ("zk", "kafka", "root") if f"ALIGNER_{f.upper()}" in e}
        Settings.model_validate(fields)  # the product's own validation (an absolute root, ...)
        if "ALIGNER_ZK_AUTH" in e:
            parse_zk_auth(e["ALIGNER_ZK_AUTH"])
        if "ALIGNER_KAFKA_CONFIG" in e:
            path = host_path(service, e["ALIGNER_KAFKA_CONFIG"])
            assert path is not None and path.is_file(), \
                f"{name}: ALIGNER_KAFKA_CONFIG {e['ALIGNER_KAFKA_CONFIG']} is not a file mounted from the repository"
            assert kafka_properties(path), f"{name}: {path} sets nothing"


# ---- commands -----------------------------------------------------------------------------------------------


def _entry_point_app(script: str) -> typer.Typer:
    """The typer app behind a console script of pyproject.toml (``aligner``, ``aligner-worker``)."""
    module = PROJECT["scripts"][script].partition(":")[0]
    app = importlib.import_module(module).app
    assert isinstance(app, typer.Typer)
    return app


def _silence(command: Any) -> None:
    """Every callback of a command tree replaced, so that parsing runs and nothing else does."""
    command.callback = lambda **_: None
    for sub in getattr(command, "commands", {}).values():
        _silence(sub)


def parse_typer(app: typer.Typer, prog: str, args: list[str]) -> None:
    """``args`` name a command (not a group) and its options exist (``--help`` after them), and the values parse
    (the real parser, with every callback silenced)."""
    shown = CliRunner().invoke(app, [*args, "--help"], prog_name=prog)
    assert shown.exit_code == 0, f"{prog} {shlex.join(args)}:\n{shown.output}"
    usage = next(line for line in shown.output.splitlines() if "Usage:" in line)
    assert "COMMAND [ARGS]" not in usage, f"{prog} {shlex.join(args)} names a group of commands, not a command"
    command = typer.main.get_command(app)
    _silence(command)
    command.main(args=list(args), prog_name=prog, standalone_mode=False)


def check_spark_launcher(script: str) -> None:
    """``exec $SPARK_HOME/bin/spark-class CLASS ...``: the Dockerfile's SPARK_HOME is the pyspark package, which
    has the launcher and the class."""
    words = shlex.split(script)
    assert words[:2] == ["exec", "$SPARK_HOME/bin/spark-class"], script
    assert re.search(r"SPARK_HOME=\S*/site-packages/pyspark\b", (ROOT / "Dockerfile").read_text())
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None, "pyspark (the spark extra) is not installed"
    home = Path(spec.origin).parent
    assert (home / "bin" / "spark-class").is_file()
    entry = words[2].replace(".", "/") + ".class"
    jars = list((home / "jars").glob("spark-core_*.jar"))
    assert any(entry in zipfile.ZipFile(jar).namelist() for jar in jars), f"no {words[2]} in {jars}"


def check_command(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    match argv:
        case ["aligner" | "aligner-worker" as script, *args]:
            parse_typer(_entry_point_app(script), script, args)
        case ["python", "-m", "experiments.suite", *args]:
            parse_typer(importlib.import_module("experiments.suite").app, "experiments.suite", args)
        case ["python", "-m", "experiments.demo", *args]:
            demo = importlib.import_module("experiments.demo")
            monkeypatch.setattr(demo, "_main", lambda _args: 0)  # parse the options, run nothing
            monkeypatch.setattr(demo, "SparkCluster", None)  # --spark-workers would start one: fail instead
            monkeypatch.delenv("ALIGNER_SPARK_MASTER", raising=False)
            assert demo.main(list(args)) == 0
        case ["bash", "-c", script]:
            check_spark_launcher(script)
        case _:
            pytest.fail(f"no check for the command {argv}: add one to tests/platform/test_compose.py")


def commands() -> Iterator[tuple[str, list[str]]]:
    for name, service in load((BASE, SASL), {}).items():
        command = service.get("command")
        if command and "build" in service:
            yield name, command if isinstance(command, list) else shlex.split(command)


COMMANDS = list(commands())


@pytest.mark.parametrize(("service", "argv"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_command_parses_against_the_real_command_line(service: str, argv: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    check_command(argv, monkeypatch)


def test_the_commands_are_checked() -> None:
    names = {n for n, _ in COMMANDS}
    assert {"coordinator", "exporter", "demo", "experiments", "spark-master", "spark-worker"} <= names


# ---- files from ./deploy --------------------------------------------------------------------------------------


def _generated(path: Path) -> bool:
    """A file deploy/sasl/gen-certs.sh makes (certificates are never in the repository)."""
    return path.parent == GEN_CERTS.parent / "certs" and path.name in GEN_CERTS.read_text()


@pytest.mark.parametrize("compose", [BASE, SASL], ids=lambda p: p.name)
def test_every_mount_from_deploy_exists(compose: Path) -> None:
    for name, service in yaml.safe_load(compose.read_text())["services"].items():
        if not isinstance(service, dict):
            continue
        for source, _ in bind_mounts(service):
            if source.startswith("./deploy"):
                assert (ROOT / source).exists(), f"{compose.name}: {name} mounts {source}, which does not exist"


def test_every_path_read_from_a_mount_exists(shape: Any) -> None:
    """Paths the containers are told to read (settings, health checks, the client files' own paths) exist in the
    mounted folder, or are made by deploy/sasl/gen-certs.sh."""
    _, services, _ = shape
    for name, service in services.items():
        texts = [*env(service).values(), *map(str, service.get("healthcheck", {}).get("test", []))]
        for path in {p for text in texts for p in re.findall(r"(/[\w./-]+)", text)}:
            local = host_path(service, path)
            if local is None:
                continue
            assert local.exists() or _generated(local), f"{name}: {path} ({local.relative_to(ROOT)}) is missing"
            if local.suffix == ".properties":
                for value in parse_properties(local.read_text(), str(local)).values():
                    inner = host_path(service, value) if value.startswith("/") else None
                    assert inner is None or inner.exists() or _generated(inner), f"{local}: {value} is missing"


# ---- the SASL variant -----------------------------------------------------------------------------------------


def _jaas_users(text: str) -> tuple[set[str], str]:
    """The users a PLAIN JAAS section accepts (``user_NAME=``) and the one it logs in as (``username=``)."""
    login = re.search(r'\busername="([^"]+)"', text)
    assert login is not None, "the JAAS section has no username= (what the brokers log in as)"
    return set(re.findall(r'\buser_(\w+)="', text)), login[1]


@pytest.mark.parametrize("cluster", [False, True], ids=["one-server", "cluster"])
def test_the_sasl_variant_authenticates_every_listener_and_session(cluster: bool) -> None:
    environment = env_file(CLUSTER_ENV) if cluster else {}
    up = active(load((BASE, SASL), environment), environment)
    brokers = of_image(up, "apache/kafka")
    for node, service in of_image(up, "zookeeper").items():
        extra = dict(item.split("=") for item in env(service).get("ZOO_CFG_EXTRA", "").split())
        assert extra.get("enforce.auth.enabled") == "true" and "digest" in extra.get("enforce.auth.schemes", ""), \
            f"{node}: ZooKeeper takes sessions that did not authenticate"
    clients = client_addresses(brokers)
    for node, service in brokers.items():
        e = env(service)
        protocols = dict(p.split(":") for p in e["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert all(p.startswith("SASL_") for p in protocols.values()), f"{node}: unauthenticated listeners"
        assert all(protocols[listener] == "SASL_SSL" for listener in set(clients.values())), \
            f"{node}: client listeners without TLS"
        mechanisms = set(e["KAFKA_SASL_ENABLED_MECHANISMS"].split(","))
        assert {e["KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL"], e["KAFKA_SASL_MECHANISM_CONTROLLER_PROTOCOL"]} \
            <= mechanisms
        jaas = host_path(service, e["KAFKA_OPTS"].partition("java.security.auth.login.config=")[2].split()[0])
        assert jaas is not None and jaas.is_file(), f"{node}: KAFKA_OPTS names no mounted JAAS file"
        accepted, broker_user = _jaas_users(jaas.read_text())
        assert broker_user in accepted, f"{node}: the brokers log in as {broker_user}, a user they do not accept"
    for name, service in project_services(up).items():
        e = env(service)
        assert e["ALIGNER_ZK_AUTH"].startswith("digest:"), f"{name}: no ZooKeeper identity"
        path = host_path(service, e["ALIGNER_KAFKA_CONFIG"])
        assert path is not None
        props = kafka_properties(path)
        listener = clients[e["ALIGNER_KAFKA"].split(",")[0]]
        protocol = dict(p.split(":") for p in env(brokers["kafka"])["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
                        .split(","))[listener]
        assert props["security.protocol"] == protocol, f"{name}: {path.name} for a {protocol} listener"
        assert props["sasl.mechanism"] in env(brokers["kafka"])["KAFKA_SASL_ENABLED_MECHANISMS"].split(",")
        assert props["sasl.username"] in accepted, f"{name}: user {props['sasl.username']} is not a Kafka user"
    host = kafka_properties(ROOT / "deploy" / "sasl" / "client.properties")
    assert host["security.protocol"] == "SASL_SSL" and host["sasl.username"] in accepted
    assert any(address.startswith("localhost:") for address in clients), "no listener for the host"
