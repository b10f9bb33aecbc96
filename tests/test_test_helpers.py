"""The test suites' helpers have one home each, and interop_tests/ stands on its own.

- interop_tests/ imports nothing of tests/. What both suites use (a real etcd or ZooKeeper, a TCP
  forwarder to cut, waiting) lives in interop_tests/, which is about real processes, and the unit
  tests import it from there: one direction only.
- Waiting for something is interop_tests/waiting.py's (`poll`, `wait_until`, `wait_until_async`):
  no other module defines a function of those names, or of the names its copies had.
- There is one ClusterNode, in interop_tests/cluster_nodes.py.
- Opening a client connection is pika_helpers.connect and aio_pika_helpers.connect: no other
  module defines a function `connect` (a method of that name is a class's own business: a cluster
  node's preset, a protocol double's handshake).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("tests", "interop_tests")
WAITING = "interop_tests/waiting.py"
# The waiting module's names, and those of the copies it replaced: a function of one of these
# names elsewhere is a second wait.
WAITING_NAMES = {"poll", "wait_until", "wait_until_async", "wait_for", "until", "_until", "_wait_until", "eventually"}
HOMES = {
    "ClusterNode": {"interop_tests/cluster_nodes.py"},
    "connect": {"interop_tests/pika_helpers.py", "interop_tests/aio_pika_helpers.py"},
}


def suite_files(*suites: str) -> list[Path]:
    return sorted(path for suite in suites for path in (ROOT / suite).rglob("*.py")
                  if "node_modules" not in path.parts)


def functions_outside_classes(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function defined at module level or inside another function (not a method)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        if not isinstance(node, ast.ClassDef):
            yield from functions_outside_classes(node)


def definitions(path: Path) -> set[tuple[int, str, str]]:
    """(line, "class" or "def", name) of the classes `path` defines, and of its functions that
    may have one of the names with one home."""
    tree = ast.parse(path.read_text(), str(path))
    found = {(node.lineno, "class", node.name) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found |= {(node.lineno, "def", node.name) for node in ast.walk(tree)  # not even as a method
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "wait_until"}
    found |= {(function.lineno, "def", function.name) for function in functions_outside_classes(tree)}
    return found


def test_interop_tests_import_nothing_of_tests() -> None:
    files = suite_files("interop_tests")
    assert files
    wrong = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            wrong.extend(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                         for name in names if name.split(".")[0] == "tests")
    assert wrong == []


def test_each_helper_is_defined_in_its_home_only() -> None:
    files = suite_files(*SUITES)
    assert files
    found: dict[str, set[str]] = {}
    wrong = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        for line, kind, name in sorted(definitions(path)):
            if name in WAITING_NAMES:
                homes = {WAITING}
            elif name in HOMES:
                homes = HOMES[name]
            else:
                continue
            found.setdefault(name, set()).add(relative)
            if relative not in homes:
                wrong.append(f"{relative}:{line} {kind} {name} (its home: {', '.join(sorted(homes))})")
    assert wrong == []
    # The homes are where this test says: each helper is found there.
    assert found["wait_until"] == found["poll"] == found["wait_until_async"] == {WAITING}
    assert found["ClusterNode"] == HOMES["ClusterNode"]
    assert found["connect"] == HOMES["connect"]
