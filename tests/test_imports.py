"""The import graph of klalm: no circle between modules, and no package importing a package above it.

Every `import klalm...` / `from klalm... import` is read with `ast`, function-local ones included (a lazy import is
still an arrow). The kernels in the top-level kernels/ are `klalm.kernels` and sit beside `klalm.ops`, whose fast
paths they are. `__main__` modules are entry scripts, like the console scripts of `klalm.cli`, and may import
anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lowest layer first. A package may import the root modules and any package of a lower layer; two packages of one
# layer import neither each other (save ONE_UNIT). Root modules (`klalm.markdown`, `klalm.config_checks`, `klalm.loss`,
# `klalm.param_names`, `klalm.provenance`, `klalm.errors`, `klalm.fileio`) are the bottom: they import nothing of klalm.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"ops", "kernels"}),
    frozenset({"models"}),
    frozenset({"data"}),
    frozenset({"train", "eval"}),
    frozenset({"tasks"}),
    frozenset({"study"}),
    frozenset({"cli"}),
)
ROOT_MODULES = frozenset(
    {
        "klalm.markdown",
        "klalm.config_checks",
        "klalm.provenance",
        "klalm.loss",
        "klalm.param_names",
        "klalm.errors",
        "klalm.fileio",
    }
)
# A kernel is the fast path of its op: kernels/ and ops/ import each other (module by module, without a circle).
ONE_UNIT = frozenset({"ops", "kernels"})
# `klalm` itself: the import hook that registers the HF classes once transformers loads.
STRING_IMPORTERS = frozenset({"klalm"})


def _module_files() -> dict[str, Path]:
    files = {}
    for path in (ROOT / "src" / "klalm").rglob("*.py"):
        parts = path.relative_to(ROOT / "src").with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in (ROOT / "kernels").glob("*.py"):
        files["klalm.kernels" if path.stem == "__init__" else f"klalm.kernels.{path.stem}"] = path
    return files


MODULES = _module_files()


def _imports(path: Path) -> set[str]:
    """The klalm modules a file imports (a `from package import module` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("klalm")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("klalm"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES}
    return found


GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def _package(module: str) -> str | None:
    """`ops` for `klalm.ops.scan`; None for the root package and its modules (`klalm`, `klalm.markdown`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and module not in ROOT_MODULES) else None


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_module_is_found_and_every_klalm_import_resolves():
    assert "klalm.ops.scan" in MODULES and "klalm.kernels.mobius_scan" in MODULES
    unknown = sorted(
        f"{name} imports {m}" for name, path in MODULES.items() for m in _imports(path) if m not in MODULES
    )
    assert not unknown, unknown


def test_every_package_has_a_layer():
    packages = {_package(name) for name in MODULES} - {None}
    assert packages == set().union(*LAYERS), "add the new package to LAYERS"


def _cycle() -> list[str] | None:
    """One import circle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    cycle = _cycle()
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def _arrow_allowed(source: str, target: str) -> bool:
    if source.endswith(".__main__"):
        return True
    if source in ROOT_MODULES:
        return False
    src_pkg, dst_pkg = _package(source), _package(target)
    if dst_pkg is None:
        return target in ROOT_MODULES
    if src_pkg is None or src_pkg == dst_pkg or {src_pkg, dst_pkg} <= ONE_UNIT:
        return src_pkg is not None
    return _layer(dst_pkg) < _layer(src_pkg)


@pytest.mark.parametrize("source", sorted(GRAPH))
def test_no_upward_or_sideways_import(source):
    bad = sorted(target for target in GRAPH[source] if not _arrow_allowed(source, target))
    assert not bad, f"{source} imports {bad}, which are not below it (LAYERS)"


def test_no_import_by_string():
    """`importlib.import_module("klalm....")` hides an arrow from readers and from this test."""
    hits = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("klalm")
                and name not in STRING_IMPORTERS
            ):
                hits.append(f"{name}: import_module({node.args[0].value!r})")
    assert not hits, hits
