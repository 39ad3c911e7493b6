"""The import graph of the source tree, read with `ast`: no cycles, and the layers hold.

Every import counts, also those inside functions (imported late for start-up
time: they still form a cycle once both run), except under `if TYPE_CHECKING:`.
Importing `a.b.c` runs `a`, `a.b` and `a.b.c`, so an import is an edge to each
of them, save the packages that contain the importing module (the usual
`from . import x` of a package's own modules is not a cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("omnigent", "omnigent_client", "supervisor", "protocol")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (i for n in node.orelse for i in _imports_in(n))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The modules of ours that `node`, in `module`, names."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    yield base
    for alias in node.names:
        yield f"{base}.{alias.name}"  # `from package import module`


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges = graph.setdefault(module, set())
        containers = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(module, node):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in MODULES and name not in containers and name != module:
                        edges.add(name)
    return graph


GRAPH = _graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(GRAPH[v])
    return seen


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_graph_sees_the_imports_it_must():
    # guards the reader itself: a relative, a late and a `from package import module` import
    assert "omnigent.store.db" in GRAPH["omnigent.store.store"]
    assert "omnigent.repl.front" in GRAPH["omnigent.launch"]  # imported inside a function
    assert "omnigent.server.files" in GRAPH["omnigent.server.app"]  # `from . import files`
    assert "omnigent.client" in GRAPH["omnigent_client"]


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_cycles_are_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_form_layers():
    # `omnigent.<package>` as one node: the folder tree reads bottom-up without a loop
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "omnigent" and len(parts) > 1 else parts[0]

    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        packages.setdefault(package(module), set()).update(
            package(t) for t in targets if package(t) != package(module))
    for targets in list(packages.values()):
        for t in targets:
            packages.setdefault(t, set())
    assert _cycles(packages) == []


def test_supervisor_and_protocol_never_import_omnigent():
    offenders = {(m, t) for m, targets in GRAPH.items() if _under(m, "supervisor", "protocol")
                 for t in targets if _under(t, "omnigent", "omnigent_client")}
    assert offenders == set()


def test_the_runner_imports_no_server_side():
    # the runner's start-up is a product target, and it never opens the store
    forbidden = ("omnigent.server", "omnigent.store", "omnigent.host", "omnigent.tree", "omnigent.repl")
    for module in (m for m in MODULES if _under(m, "omnigent.runner")):
        assert {m for m in _reachable(module) if _under(m, *forbidden)} == set(), module


def test_lower_layers_do_not_import_upper_ones():
    # configuration, the channel helpers and the link are the bottom; the tree and the CLI the top
    below = {
        "omnigent.config": (),
        "omnigent.channels": (),
        "omnigent.link": ("omnigent.config",),
        # the SDK: of omnigent, only the plain-HTTP TLS context (and its empty package's __init__)
        "omnigent.client": ("omnigent.config.tls",),
    }
    for package, allowed in below.items():
        parents = {a.rsplit(".", 1)[0] for a in allowed} - {"omnigent"}  # the package itself, not its siblings
        for module in (m for m in MODULES if _under(m, package)):
            ours = {t for t in GRAPH[module]
                    if _under(t, "omnigent") and not _under(t, package, *allowed) and t not in parents}
            assert ours == set(), module
    for module, targets in GRAPH.items():
        if not _under(module, "omnigent.tree", "omnigent.cli", "omnigent.launch", "omnigent.__main__"):
            assert {t for t in targets if _under(t, "omnigent.tree", "omnigent.cli", "omnigent.launch")} == set(), module
