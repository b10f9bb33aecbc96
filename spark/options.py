"""Reading the data source's options, which Spark passes as text: a bad value is an error that
names the option, never a guess."""

from __future__ import annotations

from typing import Any, Mapping


class Options:
    """Options by name, in any case (Spark lowercases their names; the docs write them in camel
    case: ``startingOffsets``)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._values = {str(name).lower(): value for name, value in options.items()}

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name.lower(), default)

    def names(self) -> list[str]:
        return sorted(self._values)


def parse_boolean(options: Mapping[str, Any] | Options, name: str, default: bool) -> bool:
    """A true/false option; anything else is an error naming it."""
    value = options.get(name)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"amqp-queue option {name} must be true or false, not {value!r}")
    return text == "true"


def parse_positive(options: Mapping[str, Any] | Options, name: str, default: int, what: str = "number") -> int:
    """A positive whole number option (``what`` says of what, for the error); anything else is an
    error that names the option."""
    number = parse_optional_positive(options, name, what)
    return default if number is None else number


def parse_optional_positive(options: Mapping[str, Any] | Options, name: str, what: str = "number") -> int | None:
    """A positive whole number option, None when it is not given."""
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"amqp-queue option {name} must be a positive {what}, not {value!r}")
    return number


def parse_nodes(path: str) -> tuple[tuple[str, str], ...]:
    """The ``path`` option: a data directory, or several separated by commas (``label=dir`` names
    a node; a bare directory is its own label), as (label, directory) pairs."""
    nodes = []
    for entry in str(path).split(","):
        entry = entry.strip()
        if not entry:
            continue
        label, _, directory = entry.partition("=") if "=" in entry else (entry, "", entry)
        if not label.strip() or not directory.strip():
            raise ValueError(f"amqp-queue option path: {entry!r} is not a directory or label=directory")
        nodes.append((label.strip(), directory.strip()))
    if not nodes:
        raise ValueError('amqp-queue needs a data directory: .load("/path/to/data_dir") or .option("path", ...)')
    labels = [label for label, _ in nodes]
    if len(set(labels)) != len(labels):
        raise ValueError(f"amqp-queue option path names a node twice: {path!r}")
    return tuple(nodes)
