"""The import graph keeps the house's shape (docs/architecture.md, "Packages").

Dependencies point one way, between the packages and inside the engine, lowest first:

    instances <- launcher <- estimators <- engine.core <- engine.decide
        <- engine.sim, engine.service (neither imports the other) <- engine.cli

A part may import the parts below it, never one above it or beside it; nothing but the
engine itself imports the engine; no two modules import each other, directly or around a
circle; inside ``engine/cli/commands`` no command imports another command (their shared
helpers live in ``engine/cli``).

Every import counts: inside functions (still a dependency) and under ``if
TYPE_CHECKING:`` (a type-only import is still a dependency of the code's meaning, and a
circle through it is still a circle). Plug-ins reached through a registry's discovery
are not static imports, so a registry and its plug-ins form no circle.

Run as a script, ``python -m tests.test_architecture [ROOT]`` prints the structure
numbers: the graph of the parts with the number of imports on each arrow, the arrows
against the layering, the circles, the largest file and the largest function.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("instances", "launcher", "estimators", "engine")
# the parts, lowest layer first; a part imports only parts of lower layers
LAYERS: tuple[tuple[str, ...], ...] = (
    ("instances",), ("launcher",), ("estimators",),
    ("engine.core",), ("engine.decide",), ("engine.sim", "engine.service"), ("engine.cli",))
LEVEL = {part: i for i, layer in enumerate(LAYERS) for part in layer}
COMMANDS = "engine.cli.commands"
SHOWN = 12                      # lines of each list the script prints


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str], root: Path = ROOT, type_only: bool = True) -> set[str]:
    """Project modules that ``path`` imports (resolved to the longest known module);
    with ``type_only=False`` without those under ``if TYPE_CHECKING:``."""
    name = _module_name(path, root)
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
            if not type_only and isinstance(child, ast.If) and _is_type_checking(child):
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


def _files(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def _graph(root: Path = ROOT, type_only: bool = True) -> dict[str, set[str]]:
    """Each module's imports of project modules (``type_only``: those under ``if
    TYPE_CHECKING:`` too)."""
    files = _files(root)
    modules = {_module_name(p, root) for p in files}
    return {_module_name(p, root): _imports(p, modules, root, type_only) for p in files}


def part(module: str) -> str:
    """The part of the house a module belongs to: a layer's part (``engine.decide``
    for ``engine.decide.policies.milp``), else its top package, or ``engine.X`` for a
    module of an engine subpackage outside the layers."""
    for name in sorted(LEVEL, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    bits = module.split(".")
    if bits[0] == "engine" and len(bits) > 2:
        return ".".join(bits[:2])
    return bits[0]


def part_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], int]:
    """Arrows between parts: (importer's part, imported part) -> number of module imports."""
    arrows: dict[tuple[str, str], int] = {}
    for mod, deps in graph.items():
        for d in deps:
            a, b = part(mod), part(d)
            if a != b:
                arrows[(a, b)] = arrows.get((a, b), 0) + 1
    return arrows


def against_layering(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up or sideways (or come from a module outside every part)."""
    bad = []
    for mod, deps in graph.items():
        if mod == "engine":             # the package itself (a docstring)
            continue
        a = part(mod)
        for d in deps:
            b = part(d)
            if a == b:
                continue
            if a not in LEVEL or b not in LEVEL or LEVEL[b] >= LEVEL[a]:
                bad.append(f"{mod} ({a}) imports {d} ({b})")
    return sorted(bad)


def loose_modules(graph: dict[str, set[str]]) -> list[str]:
    """Modules that belong to no part (an engine module beside the parts)."""
    return sorted(m for m in graph if m != "engine" and part(m) not in LEVEL)


def _command(module: str) -> str | None:
    if not module.startswith(COMMANDS + "."):
        return None
    return module[len(COMMANDS) + 1:].split(".")[0]


def commands_importing_commands(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in graph.items():
        c = _command(mod)
        for d in deps:
            if c is not None and _command(d) not in (None, c):
                bad.append(f"{mod} imports {d}")
    return sorted(bad)


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


def _file_graph(graph: dict[str, set[str]], root: Path = ROOT) -> dict[str, set[str]]:
    """Module imports without the package ``__init__`` re-exports (a package importing its
    own modules to re-export them is not a circle between files)."""
    inits = {m for m in graph if (root / m.replace(".", "/") / "__init__.py").exists()}
    g: dict[str, set[str]] = {}
    for m, deps in graph.items():
        if m in inits:
            continue
        g[m] = {d for d in deps if d not in inits}
    return g


def _part_adjacency(arrows: dict[tuple[str, str], int]) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for a, b in arrows:
        g.setdefault(a, set()).add(b)
    return g


def largest_file(root: Path = ROOT) -> tuple[int, str]:
    return max((len(p.read_text().splitlines()), str(p.relative_to(root))) for p in _files(root))


def largest_function(root: Path = ROOT) -> tuple[int, str]:
    """(lines, FILE:LINE NAME) of the longest function or method, from ``def`` to its end."""
    best = (0, "")
    for p in _files(root):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > best[0]:
                    best = (n, f"{p.relative_to(root)}:{node.lineno} {node.name}")
    return best


def structure(root: Path = ROOT) -> dict:
    """The structure numbers (``python -m tests.test_architecture``)."""
    graph = _graph(root)
    runtime = _graph(root, type_only=False)
    arrows = part_graph(graph)
    upward = against_layering(graph)
    return {
        "modules": len(graph),
        "arrows": {f"{a} -> {b}": n for (a, b), n in sorted(arrows.items())},
        "type_only_imports": sum(len(graph[m] - runtime[m]) for m in graph),
        "against_layering": upward,
        "loose_modules": loose_modules(graph),
        "command_imports_command": commands_importing_commands(graph),
        "part_circles": [" <-> ".join(c) for c in _cycles(_part_adjacency(arrows))],
        "circles": [" <-> ".join(c) for c in _cycles(_file_graph(graph, root))],
        "circles_without_type_only": [" <-> ".join(c) for c in _cycles(_file_graph(runtime, root))],
        "largest_file": "%d lines: %s" % largest_file(root),
        "largest_function": "%d lines: %s" % largest_function(root),
    }


def test_dependencies_point_one_way():
    graph = _graph()
    assert not loose_modules(graph), "modules outside every part: " + ", ".join(loose_modules(graph))
    bad = against_layering(graph)
    assert not bad, f"{len(bad)} import(s) against the layering:\n" + "\n".join(bad)
    assert {p for m in graph for p in [part(m)] if m != "engine"} == set(LEVEL)     # every part has modules


def test_no_command_imports_another():
    bad = commands_importing_commands(_graph())
    assert not bad, "commands importing another command (shared helpers go to engine/cli):\n" + "\n".join(bad)


def test_no_import_circles():
    cycles = _cycles(_file_graph(_graph()))
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checks_see_a_circle_and_a_layer_violation():
    # the checker itself can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert against_layering({"engine.core.x": {"engine.decide.y"}, "engine.decide.y": {"engine.core.x"},
                             "engine.sim.a": {"engine.service.b"}, "launcher.m": {"estimators.n"}}) == [
        "engine.core.x (engine.core) imports engine.decide.y (engine.decide)",
        "engine.sim.a (engine.sim) imports engine.service.b (engine.service)",
        "launcher.m (launcher) imports estimators.n (estimators)"]
    assert commands_importing_commands({"engine.cli.commands.bench.seeds": {"engine.cli.commands.bench.runs",
                                                                            "engine.cli.commands.simulate",
                                                                            "engine.cli.common"}}) == [
        "engine.cli.commands.bench.seeds imports engine.cli.commands.simulate"]
    g = _graph()
    assert "instances.grid" in g["engine.core.context"]
    assert any(d.startswith("launcher") for d in g["estimators.profiler"])
    # a type-only import is seen (the runtime graph leaves it out)
    assert "engine.core.reconfig" in g["engine.core.context"]
    assert "engine.core.reconfig" not in _graph(type_only=False)["engine.core.context"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]).resolve() if argv else ROOT
    s = structure(root)
    print(f"structure of {root} ({s['modules']} modules, {s['type_only_imports']} type-only imports counted)")
    print("arrows between parts (module imports on each):")
    for arrow, n in s["arrows"].items():
        print(f"  {arrow}: {n}")
    for key in ("loose_modules", "against_layering", "command_imports_command", "part_circles", "circles",
                "circles_without_type_only"):
        print(f"{key.replace('_', ' ')}: {len(s[key])}")
        for line in s[key][:SHOWN]:
            print(f"  {line}")
        if len(s[key]) > SHOWN:
            print(f"  ... and {len(s[key]) - SHOWN} more")
    print(f"largest file: {s['largest_file']}")
    print(f"largest function: {s['largest_function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
