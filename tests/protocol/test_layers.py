"""Layer guard: the rules of the layout, checked on the syntax tree (comments and strings never count).

Layers only look down: experiments -> coordinator -> connectors -> aligner. ZooKeeper is reached
only through the ledger layer in aligner/; every error class lives in aligner/errors.py; no code
decides anything on the text of an exception.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("aligner", "connectors", "coordinator")
"""Folders installed as aligner, aligner.connectors and aligner.coordinator."""

ZK_ALLOWED: set[str] = set()
"""Files allowed to reach the ZooKeeper client outside aligner/: none (every access goes through the ledger layer)."""

def sources(*folders: str) -> Iterator[tuple[str, ast.Module]]:
    """(path relative to the repository, parsed module) of every Python file under ``folders``."""
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # a virtual environment inside the tree (experiments/.peer-venv): not ours
            yield rel, ast.parse(path.read_text(), filename=rel)


def imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every module an import statement names, anywhere in the file (function-level imports too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # `from aligner import connectors` imports aligner.connectors
                yield node.lineno, f"{node.module}.{alias.name}"


def names_module(module: str, banned: tuple[str, ...]) -> bool:
    return any(module == b or module.startswith(f"{b}.") for b in banned)


def test_aligner_imports_no_layer_above_and_no_engine() -> None:
    banned = ("aligner.connectors", "aligner.coordinator", "aligner.embedded", "connectors", "coordinator", "pyspark",
              "faust")
    found = [f"{rel}:{line} imports {mod}" for rel, tree in sources("aligner")
             for line, mod in imported_modules(tree) if names_module(mod, banned)]
    assert found == [], "aligner/ is the bottom layer (protocol and ledger), framework free:\n" + "\n".join(found)


def test_connectors_never_import_the_coordinator() -> None:
    banned = ("aligner.coordinator", "coordinator", "aligner.embedded")
    found = [f"{rel}:{line} imports {mod}" for rel, tree in sources("connectors")
             for line, mod in imported_modules(tree) if names_module(mod, banned)]
    assert found == [], "connectors sit below the coordinator and the embedded stack:\n" + "\n".join(found)


def test_the_embedded_stack_is_beside_the_coordinator_not_inside_it() -> None:
    """The embedded stack (ZooKeeper, Tansu, a Spark cluster for the demo and the tests) needs only the
    protocol layer's settings and errors: the coordinator drives it, it never reaches into the coordinator
    or an engine, so a production install can ignore it."""
    banned = ("aligner.coordinator", "aligner.connectors", "coordinator", "connectors")
    found = [f"{rel}:{line} imports {mod}" for rel, tree in sources("coordinator/aligner/embedded")
             for line, mod in imported_modules(tree) if names_module(mod, banned)]
    assert found == [], "the embedded stack imports only aligner/:\n" + "\n".join(found)
    assert not (ROOT / "coordinator/aligner/coordinator/stack.py").exists()


ENGINES = ("aligner.connectors.spark", "aligner.connectors.faust", "pyspark", "pyarrow", "pandas", "faust")
"""Engine adapters and the libraries behind the optional extras spark and faust."""


def test_the_coordinator_imports_no_engine() -> None:
    """The CLI, the exporter, alignment and hot-swap work on a plain install (no extras): engines only
    record their progress in the ledger, and the coordinator reads it there (aligner.lineage)."""
    found = [f"{rel}:{line} imports {mod}" for rel, tree in sources("coordinator")
             for line, mod in imported_modules(tree) if names_module(mod, ENGINES)]
    assert found == [], "the coordinator must not import an engine adapter:\n" + "\n".join(found)


def test_engine_import_detector() -> None:
    code = ("import json\ndef f():\n    from aligner.connectors.spark.lineage import cut\n"
            "from aligner import connectors\nimport pyspark.sql as ps\nfrom aligner.connectors import faust\n")
    lines = {line for line, mod in imported_modules(ast.parse(code)) if names_module(mod, ENGINES)}
    assert lines == {3, 5, 6}  # the function-local import too; json and `from aligner import connectors` pass


def test_zookeeper_only_through_the_ledger_layer() -> None:
    """No `X.zk.Y` outside aligner/: reads, writes and watches are ledger methods (with retries)."""
    found = []
    for rel, tree in sources("connectors", "coordinator", "experiments"):
        if rel in ZK_ALLOWED:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "zk":
                found.append(f"{rel}:{node.lineno} .zk.{node.attr}")
    assert found == [], "ZooKeeper access outside aligner/ (add a ledger method instead):\n" + "\n".join(found)


def _error_names() -> set[str]:
    tree = ast.parse((ROOT / "aligner" / "aligner" / "errors.py").read_text())
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return None


def exception_classes(modules: list[tuple[str, ast.Module]], known: set[str]) -> set[str]:
    """``path:Class`` of every class deriving from an exception: a builtin one, one named in ``known``,
    a library error (kazoo's, Kafka's: named ...Error / ...Exception), or another such class here."""
    classes = [(rel, node) for rel, tree in modules for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    found: dict[str, str] = {}  # path:Class -> Class
    changed = True
    while changed:  # to a fixpoint: class B(A) where A(AlignerError) is found first
        changed = False
        for rel, node in classes:
            key = f"{rel}:{node.name}"
            bases = {b for b in map(_base_name, node.bases) if b is not None}
            if key not in found and any(b in known or b in found.values() or b.endswith(("Error", "Exception"))
                                        for b in bases):
                found[key] = node.name
                changed = True
    return set(found)


def test_every_error_class_lives_in_aligner_errors() -> None:
    known = _error_names() | {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                              and issubclass(getattr(builtins, n), BaseException)}
    modules = [(rel, tree) for rel, tree in sources(*PRODUCT) if rel != "aligner/aligner/errors.py"]
    stray = sorted(exception_classes(modules, known))
    assert stray == [], "define error classes in aligner/errors.py (one hierarchy):\n" + "\n".join(stray)


def test_exception_class_detector() -> None:
    code = ("class A(AlignerError): ...\nclass B(A): ...\nclass C(kazoo.NoNodeError): ...\n"
            "class D(ValueError): ...\nclass E(Node): ...\nclass F(StrEnum): ...\n")
    assert exception_classes([("m.py", ast.parse(code))], {"AlignerError", "ValueError"}) == \
        {"m.py:A", "m.py:B", "m.py:C", "m.py:D"}


TEXT_METHODS = {"startswith", "endswith", "find", "rfind", "index", "rindex", "count", "__contains__"}
ERRORISH = ("exc", "err", "error", "e", "ex", "failure", "cause")


def _handler_names(tree: ast.Module) -> set[str]:
    return {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}


def _is_text_of(node: ast.expr, names: set[str]) -> bool:
    """``str(X)``, ``repr(X)``, ``format(X)``, ``X.args[...]`` or ``f"{X}"`` for an exception name X."""
    def is_error(n: ast.expr) -> bool:
        return isinstance(n, ast.Name) and (n.id in names or n.id in ERRORISH or n.id.endswith(("_exc", "_error")))

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"str", "repr", "format"}:
        return len(node.args) == 1 and is_error(node.args[0])
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "args":
        return is_error(node.value.value) and not isinstance(node.ctx, ast.Store)
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) and is_error(v.value) for v in node.values)
    return False


def message_decisions(tree: ast.Module) -> Iterator[int]:
    """Lines where control flow depends on an exception's message text."""
    names = _handler_names(tree)
    texts: set[str] = set()  # names bound to an exception's text: msg = str(exc)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_text_of(node.value, names):
            texts |= {t.id for t in node.targets if isinstance(t, ast.Name)}

    def text(n: ast.expr) -> bool:
        return _is_text_of(n, names) or (isinstance(n, ast.Name) and n.id in texts)

    def compares_text(node: ast.Compare) -> bool:
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
            literal = any(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (left, right))
            if (isinstance(op, (ast.In, ast.NotIn)) and text(right)) or \
                    (isinstance(op, (ast.Eq, ast.NotEq)) and literal and (text(left) or text(right))):
                return True
        return False

    def searches_text(node: ast.Call) -> bool:
        func = node.func
        if not isinstance(func, ast.Attribute):
            return False
        regex = isinstance(func.value, ast.Name) and func.value.id == "re" and any(text(a) for a in node.args)
        return regex or (func.attr in TEXT_METHODS and text(func.value))

    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and compares_text(node)) or \
                (isinstance(node, ast.Call) and searches_text(node)):
            yield node.lineno

def test_no_decision_on_exception_message_text() -> None:
    found = [f"{rel}:{line}" for rel, tree in sources(*PRODUCT, "experiments") for line in message_decisions(tree)]
    assert found == [], "decide on the exception's type (aligner/errors.py), never its text:\n" + "\n".join(found)


@pytest.mark.parametrize(("code", "hits"), [
    ('try:\n    f()\nexcept OSError as exc:\n    if "no such epoch" in str(exc):\n        pass\n', 1),
    ('try:\n    f()\nexcept OSError as boom:\n    msg = str(boom)\n    if msg.startswith("x"):\n        pass\n', 1),
    ('try:\n    f()\nexcept OSError as exc:\n    if exc.args[0] == "gone":\n        pass\n', 1),
    ('try:\n    f()\nexcept OSError as exc:\n    log(str(exc))\n    raise Wrapped(str(exc))\n', 0),
    ('try:\n    f()\nexcept KafkaException as exc:\n    if exc.args[0].code() == 3:\n        pass\n', 0),
    ('if "x" in str(path):\n    pass\n', 0),
])
def test_message_decision_detector(code: str, hits: int) -> None:
    """The detector itself: it finds message-text decisions and passes type and code decisions."""
    assert len(list(message_decisions(ast.parse(code)))) == hits


def test_every_file_path_ends_with_its_module_path() -> None:
    """aligner/aligner/x.py is aligner.x, connectors/aligner/connectors/x.py is aligner.connectors.x: editors,
    type checkers and grep find what an import names, with no mapping to know."""
    import aligner.connectors
    import aligner.coordinator
    import aligner.models

    for module, folder in ((aligner.models, "aligner"), (aligner.connectors, "connectors"),
                           (aligner.coordinator, "coordinator")):
        path = Path(module.__file__ or "").resolve().relative_to(ROOT / folder)
        dotted = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
        assert dotted == module.__name__, f"{module.__name__} lives at {folder}/{path}"


@pytest.mark.parametrize("folder", ["connectors", "coordinator"])
def test_source_folders_are_not_a_second_import_name(folder: str) -> None:
    """From a bare checkout, `import connectors` must not give a second identity of the same files."""
    import importlib
    import sys

    sys.modules.pop(folder, None)
    with pytest.raises(ImportError, match=f"import aligner.{folder}"):
        importlib.import_module(folder)


CRASHING_CALLS = {"list_offsets"}
"""Client calls that crash the process with the pinned librdkafka (2.16: ``AdminClient.list_offsets`` locks a
NULL mutex in ``rd_kafka_ListOffsets``; the docs, Limits): offsets come from ``connectors/kafka.py::end_offsets``."""


def test_no_code_calls_a_client_method_known_to_crash() -> None:
    calls = [f"{rel}:{node.lineno}" for rel, tree in sources(*PRODUCT, "experiments", "tests")
             for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr in CRASHING_CALLS]
    assert not calls, f"calls known to crash the process: {calls}"


def test_the_ledger_holds_its_recipes_as_objects() -> None:
    """No inheritance chain: the ledger is its session, and each recipe an object over it, defined in the
    module a reader following ``ledger.<recipe>.<method>`` lands in."""
    from aligner.ledger import Ledger
    from aligner.recipes.claims import ClaimRecipes
    from aligner.recipes.commits import CommitRecipes
    from aligner.recipes.reads import EpochReads
    from aligner.recipes.spark import SparkBatchRecipes
    from aligner.recipes.store import Store
    from aligner.recipes.subjects import SubjectRecipes
    from aligner.recipes.watches import WatchRecipes

    assert Ledger.__mro__ == (Ledger, Store, object)
    for recipe in (SubjectRecipes, EpochReads, ClaimRecipes, CommitRecipes, WatchRecipes, SparkBatchRecipes):
        assert recipe.__mro__ == (recipe, object), f"{recipe.__name__} inherits {recipe.__mro__[1:-1]}"
    public = {name for name in vars(Ledger) if not name.startswith("_")}
    assert public <= {"connect"}, f"methods on Ledger beside its recipes: {sorted(public)}"


def test_the_recipes_of_a_ledger_share_its_store_and_keep_no_state_of_their_own() -> None:
    """What the single class used to remember (committed epochs, known buckets, watched writers and frontiers) must
    stay on the one store: a cache on a recipe object would be a second copy that the other recipes never see."""
    from kazoo.client import KazooClient

    from aligner.jobs import JobLedger
    from aligner.ledger import Ledger
    from aligner.recipes.spark import SparkBatchRecipes

    ledger = Ledger(KazooClient(hosts="127.0.0.1:1"))  # never started: no connection is made
    recipes = {"subjects": ledger.subjects, "epochs": ledger.epochs, "claims": ledger.claims,
               "commits": ledger.commits, "watches": ledger.watches,
               "spark": SparkBatchRecipes(ledger, ledger.commits)}
    shared = {id(ledger), *(id(r) for r in recipes.values())}
    for name, recipe in recipes.items():
        for attr, value in vars(recipe).items():
            assert id(value) in shared, f"ledger.{name}.{attr} is {type(value).__name__}, not the ledger's own"
    jobs = ledger.jobs
    assert isinstance(jobs, JobLedger) and jobs.ledger is ledger and jobs.subjects is ledger.subjects
    assert jobs.zk is ledger.zk and jobs.layout is ledger.layout
