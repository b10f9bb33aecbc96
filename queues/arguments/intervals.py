"""Intervals written with a unit, as x-max-age and an interval x-stream-offset take them ("7D").

RabbitMQ's units (rabbit_amqqueue:check_max_age): Y (365 days), M (30 days), D, h, m, s, after a
positive integer.
"""

from __future__ import annotations

import re

UNIT_MS = {
    "Y": 365 * 86_400_000,
    "M": 30 * 86_400_000,
    "D": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
}
_INTERVAL = re.compile(r"^([0-9]+)([YMDhms])$")


def interval_ms(text: str) -> int | None:
    """The milliseconds `text` stands for ("30m": 1,800,000); None if it is not an interval."""
    match = _INTERVAL.match(text)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1)) * UNIT_MS[match.group(2)]
