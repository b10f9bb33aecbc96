"""Imports flow one way: amqp_server -> exchanges, queues -> persistence.

A queue knows nothing of connections, channels or the vhost that routes (what it needs of
them comes in as callbacks or Protocols: queues/dead_letter.py's Router, queues/delays'
Vhost); exchanges are pure routing; the store knows nothing of queues. Type-only imports
count too: a `TYPE_CHECKING` import of an upper layer is the first step of a real one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package -> the top-level packages it must not import
FORBIDDEN = {
    "queues": {"amqp_server", "exchanges", "cluster", "spark"},
    "exchanges": {"amqp_server", "queues", "persistence", "cluster", "spark"},
    "persistence": {"amqp_server", "queues", "exchanges", "cluster", "spark"},
}


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_lower_layer_never_imports_an_upper_one(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for path in files
        for line, imported in imported_packages(path)
        if imported in FORBIDDEN[package]
    ]
    assert wrong == []
