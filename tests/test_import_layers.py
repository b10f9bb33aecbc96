"""Imports flow one way: every product module imports only its own layer or a lower one.

The layers, lowest first (issue 22):

 1  persistence, exchanges   the store and the routing tables; they know nothing of each other
    then spark               reads the store's files (amqp_server.broker uses spark.side_files)
 2  queues                   a queue; what it needs of routing comes in as Protocols (dead_letter's
                             Router, delays' Vhost), so it imports no exchange, nor Spark
 3  amqp_server.wire         frames, methods, reply codes, state tables
 4  amqp_server.config       what the operator configured
 5  amqp_server.broker       vhosts, routing, policies, access, limits, alarms, stats
 6  amqp_server.channel
 7  amqp_server.connection
 8  amqp_server.peer_link     a connection to another broker by AMQP URI (a small 0-9-1 client on
                             the wire's codec), shared by shovels and federation
 9  amqp_server.shovel, amqp_server.federation
                             plug-ins the runtime starts: each acts on
                             its runtime parameters (broker/runtime_parameters.py) and moves
                             messages over peer links
10  cluster, amqp_server.management, amqp_server.metrics, amqp_server.ctl
                             the cluster plug-in imports only the layers below it; management and
                             metrics read the broker and never import the cluster; ctl is an HTTP
                             client and imports nothing of the broker's model
11  amqp_server.runtime      the only layer that starts things, and the only one that loads the
                             cluster plug-in (when --cluster is given)

What a lower layer needs of a higher one comes in as a Protocol it defines (channel/ports.py,
broker/ports.py, connection/ports.py, ...) or as a callback. Every import counts: a
`TYPE_CHECKING` import (a type-only import of an upper layer is the first step of a real one),
an import inside a function, a relative import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("amqp_server", "exchanges", "queues", "persistence", "spark", "cluster")
TOP_LEVEL_MODULES = ("pyspark_amqp_queue",)  # Spark's entry to the data source (docs/spark.md)

# Lowest first; the units of one entry share a layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("persistence", "exchanges"),
    ("spark", "pyspark_amqp_queue"),
    ("queues",),
    ("amqp_server.wire",),
    ("amqp_server.config",),
    ("amqp_server.broker",),
    ("amqp_server.channel",),
    ("amqp_server.connection",),
    ("amqp_server.peer_link",),
    ("amqp_server.shovel", "amqp_server.federation"),
    ("cluster", "amqp_server.management", "amqp_server.metrics", "amqp_server.ctl"),
    ("amqp_server.runtime", "amqp_server.__main__"),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
# amqp_server/__init__.py: every amqp_server module imports it first, so it imports nothing.
PACKAGE_ROOT = "amqp_server"

# Imports the ranks allow that a unit still must not make: importer -> {imported: why}.
FORBIDDEN: dict[str, dict[str, str]] = {
    "persistence": {"exchanges": "the store knows nothing of routing"},
    "exchanges": {"persistence": "exchanges are routing tables, the store is not theirs"},
    "queues": {
        "exchanges": "what a queue needs of routing comes in as a Protocol",
        "spark": "a queue knows nothing of Spark, which reads its files",
    },
    "cluster": {
        unit: "the cluster plug-in imports only the layers below it"
        for unit in ("amqp_server.management", "amqp_server.metrics", "amqp_server.ctl")
    },
}
# Units that may import the cluster plug-in: itself, and the runtime that loads it.
CLUSTER_IMPORTERS = {"cluster", "amqp_server.runtime"}
# ctl talks to the management API over HTTP: of the product it imports only itself and the
# configuration's vocabulary (config/limit_definitions.py's check of a limits definition).
CTL_MAY_IMPORT = {"amqp_server.ctl", "amqp_server.config"}

MAX_CIRCLE = 4  # files in one import circle (strongly connected component)
MAX_MODULES_IN_AMQP_SERVER = 15  # files standing directly in amqp_server/

# Imports the other branches of issue 22 remove; the lead deletes this list once they are
# merged. (importer, imported, who removes it and how). Each must still exist (a stale entry
# fails test_known_until_merge_is_exact), and nothing else is excused.
KNOWN_UNTIL_MERGE: list[tuple[str, str, str]] = [
]


def product_modules() -> dict[str, Path]:
    """Module name -> file, for every product source file."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    for name in TOP_LEVEL_MODULES:
        modules[name] = ROOT / f"{name}.py"
    return modules


MODULES = product_modules()


def _resolve(name: str) -> str | None:
    """The product module `name` is, or is in (a class or function imported from it)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> Iterator[tuple[int, str]]:
    """(line, product module) of every import in `module`'s file, wherever it stands."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target)
            if resolved is not None and resolved != module:
                yield node.lineno, resolved


def unit_of(module: str) -> str | None:
    """The LAYERS unit `module` belongs to (None: it has no layer)."""
    if module == PACKAGE_ROOT:
        return PACKAGE_ROOT
    found = None
    for unit in RANK:
        if (module == unit or module.startswith(unit + ".")) and (found is None or len(unit) > len(found)):
            found = unit
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """importer -> {imported: first line}, over every product module."""
    graph: dict[str, dict[str, int]] = {}
    for module in MODULES:
        edges = graph.setdefault(module, {})
        for line, imported in imports_of(module):
            edges.setdefault(imported, line)
    return graph


GRAPH = import_graph()
KNOWN = {(importer, imported): reason for importer, imported, reason in KNOWN_UNTIL_MERGE}


def why_not(importer: str, imported: str) -> str | None:
    """Why `importer` must not import `imported`; None when it may."""
    if importer == PACKAGE_ROOT:
        return "amqp_server/__init__.py is imported by every amqp_server module: it imports nothing"
    if imported == PACKAGE_ROOT:
        return None
    source, target = unit_of(importer), unit_of(imported)
    assert source is not None and target is not None, (importer, imported)  # test_every_module_has_a_layer
    if source == target:
        return None
    if target == "cluster" and source not in CLUSTER_IMPORTERS:
        return "only the runtime loads the cluster plug-in (and only with --cluster)"
    if source == "amqp_server.ctl" and target not in CTL_MAY_IMPORT:
        return "ctl is an HTTP client: it imports nothing of the broker's model"
    if target in FORBIDDEN.get(source, {}):
        return FORBIDDEN[source][target]
    if RANK[target] > RANK[source]:
        return f"{target} is in a higher layer than {source}"
    return None


def test_every_product_module_has_a_layer() -> None:
    assert len(MODULES) > 200
    assert [module for module in MODULES if unit_of(module) is None] == []


@pytest.mark.parametrize("unit", [PACKAGE_ROOT, *RANK])
def test_a_module_imports_only_its_own_layer_or_a_lower_one(unit: str) -> None:
    modules = [module for module in MODULES if unit_of(module) == unit]
    assert modules
    wrong = [
        f"{MODULES[importer].relative_to(ROOT)}:{line} imports {imported}: {reason}"
        for importer in modules
        for imported, line in GRAPH[importer].items()
        if (reason := why_not(importer, imported)) is not None and (importer, imported) not in KNOWN
    ]
    assert wrong == []


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_is_wider_than_four_files() -> None:
    graph = {
        importer: {imported: line for imported, line in edges.items() if (importer, imported) not in KNOWN}
        for importer, edges in GRAPH.items()
    }
    assert [circle for circle in circles(graph) if len(circle) > MAX_CIRCLE] == []


def test_at_most_15_modules_stand_directly_in_amqp_server() -> None:
    standing = sorted(path.name for path in (ROOT / "amqp_server").glob("*.py"))
    assert len(standing) <= MAX_MODULES_IN_AMQP_SERVER, standing


def test_known_until_merge_is_exact() -> None:
    """Every excused import still exists (delete the entries a merge made stale), and is one the
    layers or the circle limit would refuse."""
    assert len(KNOWN) == len(KNOWN_UNTIL_MERGE)
    stale = [pair for pair in KNOWN if pair[1] not in GRAPH.get(pair[0], {})]
    assert stale == []
    same_unit = {pair for pair in KNOWN if unit_of(pair[0]) == unit_of(pair[1])}  # excused for the circle test
    assert [pair for pair in KNOWN if pair not in same_unit and why_not(*pair) is None] == []
