"""The import graph keeps the house's shape: dependencies point one way
(instances <- launcher <- estimators <- engine), nothing but the engine itself imports
the engine, and no two modules import each other, directly or around a circle.

Imports inside functions count (they are still dependencies); imports under
``if TYPE_CHECKING:`` do not (they exist for the type checker only). Plug-ins reached
through a registry's discovery are not static imports, so a registry and its plug-ins
form no circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("instances", "launcher", "estimators", "engine")
# what each package may import (besides itself)
ALLOWED = {"instances": set(), "launcher": {"instances"}, "estimators": {"instances", "launcher"},
           "engine": {"instances", "launcher", "estimators"}}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Project modules that ``path`` imports (resolved to the longest known module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target.split(".")[0] in PACKAGES:
            found.add(target)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    resolve(a.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)] if child.level > 1 else base
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                for a in child.names:           # "from pkg import module" imports the module
                    if f"{mod}.{a.name}" in modules:
                        resolve(f"{mod}.{a.name}")
                    else:
                        resolve(mod)
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules) for p in files}


def test_dependencies_point_one_way():
    bad = []
    for mod, deps in _graph().items():
        pkg = mod.split(".")[0]
        for d in deps:
            other = d.split(".")[0]
            if other != pkg and other not in ALLOWED[pkg]:
                bad.append(f"{mod} imports {d}")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _file_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module imports without the package ``__init__`` re-exports (a package importing its
    own modules to re-export them is not a circle between files)."""
    inits = {m for m in graph if (ROOT / m.replace(".", "/") / "__init__.py").exists()}
    g: dict[str, set[str]] = {}
    for m, deps in graph.items():
        if m in inits:
            continue
        g[m] = {d for d in deps if d not in inits}
    return g


def test_no_import_circles():
    cycles = _cycles(_file_graph(_graph()))
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checks_see_a_circle_and_a_layer_violation():
    # the checker itself can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    g = _graph()
    assert "instances.grid" in g["engine.context"]
    assert any(d.startswith("launcher") for d in g["estimators.profiler"])
