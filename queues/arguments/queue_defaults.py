"""Queue arguments set by the configuration: `[[queue_defaults]]` entries, by vhost and name pattern.

An entry names a vhost (or none: every vhost), a regular expression searched in the queue name
(RabbitMQ policy style; default: every queue) and lifecycle settings. Every matching entry
applies, in file order, a later one overriding an earlier one key by key; a queue's own
x-arguments override them all. docs/configuration.md documents the section.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from queues.arguments import InvalidArgument, QueueArguments

# Config key -> the x-argument it stands for.
SETTING_ARGUMENTS = {
    "delayed_retry_type": "x-delayed-retry-type",
    "delayed_retry_min": "x-delayed-retry-min",
    "delayed_retry_max": "x-delayed-retry-max",
    "delayed_retry_backoff": "x-delayed-retry-backoff",
    "delivery_limit": "x-delivery-limit",
    "consumer_timeout": "x-consumer-timeout",
}
ENTRY_KEYS = ("vhost", "pattern", *SETTING_ARGUMENTS)


@dataclass(frozen=True)
class QueueDefault:
    """One [[queue_defaults]] entry: where it applies and the x-arguments it gives."""

    vhost: str | None
    pattern: re.Pattern[str]
    arguments: dict[str, Any] = field(default_factory=dict)

    def applies_to(self, vhost: str, queue: str) -> bool:
        return (self.vhost is None or self.vhost == vhost) and self.pattern.search(queue) is not None


def parse_entry(entry: dict[str, Any], where: str) -> QueueDefault:
    """Validate one TOML table; raises ValueError with a message naming `where` and the key."""
    unknown = [key for key in entry if key not in ENTRY_KEYS]
    if unknown:
        raise ValueError(f"{where} has unknown key {unknown[0]!r} (known: {', '.join(ENTRY_KEYS)})")
    vhost = entry.get("vhost")
    if vhost is not None and (not isinstance(vhost, str) or not vhost):
        raise ValueError(f"{where} vhost must be a non-empty string")
    pattern_text = entry.get("pattern", "")
    if not isinstance(pattern_text, str):
        raise ValueError(f"{where} pattern must be a string")
    try:
        pattern = re.compile(pattern_text)
    except re.error as error:
        raise ValueError(f"{where} pattern is not a valid regular expression: {error}") from None
    arguments = {SETTING_ARGUMENTS[key]: value for key, value in entry.items() if key in SETTING_ARGUMENTS}
    try:
        QueueArguments.parse(arguments)
    except InvalidArgument as error:
        key = next(name for name, argument in SETTING_ARGUMENTS.items() if argument == error.key)
        raise ValueError(f"{where} {key} is invalid: {error.reason}") from None
    return QueueDefault(vhost, pattern, arguments)


def defaults_for(entries: list[QueueDefault], vhost: str, queue: str) -> dict[str, Any]:
    """The x-arguments the configuration gives queue `queue` of `vhost` ({} when none)."""
    merged: dict[str, Any] = {}
    for entry in entries:
        if entry.applies_to(vhost, queue):
            merged.update(entry.arguments)
    return merged
