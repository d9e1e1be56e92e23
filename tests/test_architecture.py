"""The module graph of udf_agent and spark_backend: floors, no import circles, no private names across modules.

Floors, top to bottom (a module imports from its own floor or below, never above):
tools and the CLI → the deployments (serve: socket server, shared server, relay) → runtime and
spark_backend → compute and the built-in library → api and options → wire. See
docs/architecture.md.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("udf_agent", "spark_backend")


def _floors_from_the_docs() -> dict[str, tuple[int, bool]]:
    """module or package: (floor, whether a package, whose modules share its floor), from the
    table of floors in docs/architecture.md, the one place they are written: each backticked
    path in a row's second cell (``pkg/`` a package, ``pkg/mod.py`` a module) is on its floor."""
    floors = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        row = re.match(r"\| (\d) \| (.*?) \|", line)
        if row:
            for path in re.findall(r"`([^`]+)`", row.group(2)):
                module = path.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                floors[module] = (int(row.group(1)), path.endswith("/"))
    return floors


FLOORS = _floors_from_the_docs()


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
    """The floor of ``module``, or of the innermost package of the table that holds it."""
    holders = [name for name, (_, package) in FLOORS.items() if module == name or (package and module.startswith(name + "."))]
    assert holders, f"{module} is on no floor: add it to the table in docs/architecture.md"
    return FLOORS[max(holders, key=len)][0]


def _imports(module: str, path: pathlib.Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import of ours, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names if alias.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # relative: from the module's own package up
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule, "", node.lineno) if submodule in MODULES else (base, alias.name, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                # `from package import module` imports the module; anything else, a name of it.
                found.append((submodule, "", node.lineno) if submodule in MODULES else (node.module, alias.name, node.lineno))
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_the_graph_and_the_floors_were_read():
    assert (_floor("udf_agent.wire.frames"), _floor("udf_agent"), _floor("udf_agent.cli.tasks"), _floor("spark_backend.engine")) == (0, 1, 5, 3)
    assert all(_floor(module) >= 0 for module in MODULES)  # each module on a floor of the table
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


def test_the_runtime_and_the_spark_engine_never_import_each_other():
    """They meet only through ``compute.Engine``: the Spark engine is built above both (``cli/engines.py``)."""
    crossing = [
        f"{module}:{line} imports {target}"
        for module, imports in GRAPH.items()
        for target, _, line in imports
        for mine, theirs in (("udf_agent.runtime", "spark_backend"), ("spark_backend", "udf_agent.runtime"))
        if (module == mine or module.startswith(mine + ".")) and (target == theirs or target.startswith(theirs + "."))
    ]
    assert not crossing, crossing
