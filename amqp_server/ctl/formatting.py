"""How rabbitmqctl prints values and tables, so scripts written against it parse our output.

Table rows are tab-separated; booleans print as true/false; a list prints as `[a, b]`; a
table (arguments, client properties) prints as Erlang-ish `[{"key",value},...]` with strings
quoted inside it; a missing value prints as nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO


def cell(value: Any) -> str:
    """One table cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _table(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(cell(item) for item in value) + "]"
    return str(value)


def _inner(value: Any) -> str:
    """A value inside a table: strings are quoted there."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return _table(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_inner(item) for item in value) + "]"
    return cell(value)


def _table(table: dict[str, Any]) -> str:
    return "[" + ",".join("{" + _inner(key) + "," + _inner(value) + "}" for key, value in table.items()) + "]"


def write_table(out: TextIO, columns: Sequence[str], rows: list[list[Any]], headers: bool = True) -> None:
    if headers:
        out.write("\t".join(columns) + "\n")
    for row in rows:
        out.write("\t".join(cell(value) for value in row) + "\n")


def write_json(out: TextIO, columns: Sequence[str], rows: list[list[Any]]) -> None:
    """rabbitmqctl's `--formatter json`: a JSON array, one object per line."""
    objects = [json.dumps(dict(zip(columns, row)), ensure_ascii=False, separators=(",", ":")) for row in rows]
    if not objects:
        out.write("[]\n")
        return
    out.write("[\n" + objects[0] + "\n" + "".join("," + item + "\n" for item in objects[1:]) + "]\n")


def write_rows(out: TextIO, formatter: str, columns: Sequence[str], rows: list[list[Any]], headers: bool = True
               ) -> None:
    """The rows as `--formatter` asks: "json" (write_json), else the table (write_table)."""
    if formatter == "json":
        write_json(out, columns, rows)
    else:
        write_table(out, columns, rows, headers)
