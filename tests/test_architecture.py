"""The module graph of udf_agent and spark_backend: floors, no import circles, no private names across modules.

Floors, top to bottom (a module imports from its own floor or below, never above):
tools and the CLI → the deployments (serve: socket server, shared server, relay) → runtime and
spark_backend → compute and the built-in library → api and options → wire. See
docs/architecture.md.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("udf_agent", "spark_backend")

# (prefix, floor): the longest matching prefix decides.
FLOORS = {
    "udf_agent.udf_pb2": 0,
    "udf_agent.errors": 0,
    "udf_agent.wire": 0,
    "udf_agent.options": 1,
    "udf_agent.api": 1,
    "udf_agent": 1,  # the package itself re-exports the public API
    "udf_agent.compute": 2,
    "udf_agent.library": 2,
    "udf_agent.targets": 2,
    "udf_agent.runtime": 3,
    "spark_backend": 3,
    "udf_agent.serve": 4,
    "udf_agent.tools": 5,
    "udf_agent.testing": 5,
    "udf_agent.cli": 5,
    "udf_agent.entry": 5,
    "udf_agent.__main__": 5,
}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _floor(module: str) -> int:
    prefix = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[prefix]


def _imports(module: str, path: pathlib.Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import of ours, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names if alias.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                # `from package import module` imports the module; anything else, a name of it.
                found.append((submodule, "", node.lineno) if submodule in MODULES else (node.module, alias.name, node.lineno))
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_the_graph_was_read():
    assert len(MODULES) > 40 and "udf_agent.runtime.agent" in MODULES
    assert any(target == "udf_agent.runtime.session" for target, _, _ in GRAPH["udf_agent.runtime.agent"])


def test_every_import_goes_to_its_own_floor_or_below():
    upward = [
        f"{module}:{line} imports {target} (floor {_floor(target)} above {_floor(module)})"
        for module, imports in GRAPH.items()
        for target, _, line in imports
        if _floor(target) > _floor(module)
    ]
    assert upward == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), as sorted lists."""
    edges = {m: sorted({t for t, _, _ in imports if t in MODULES and t != m}) for m, imports in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def test_no_import_circles():
    assert _cycles() == []


def test_no_private_name_is_imported_across_modules():
    private = [
        f"{module}:{line} imports {target}.{name}"
        for module, imports in GRAPH.items()
        for target, name, line in imports
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []
