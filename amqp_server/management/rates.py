"""Per-second rates for the management API's `*_details: {"rate": r}` fields.

RabbitMQ samples its statistics every 5 s (collect_statistics_interval). So does this: a task
records each object's counters every `INTERVAL` seconds, and a rate is the change since the
older of the last two samples, divided by the time between. No sample yet means rate 0.0.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

INTERVAL = 5.0

Sample = tuple[float, dict[str, int]]


class RateSampler:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._samples: dict[Hashable, deque[Sample]] = {}

    def record(self, samples: Iterable[tuple[Hashable, dict[str, int]]]) -> None:
        """One sampling round; objects absent from it (deleted) are forgotten."""
        now = self.clock()
        seen = set()
        for key, values in samples:
            seen.add(key)
            history = self._samples.get(key)
            if history is None:
                history = self._samples[key] = deque(maxlen=2)
            history.append((now, dict(values)))
        for key in [key for key in self._samples if key not in seen]:
            del self._samples[key]

    def rate(self, key: Hashable, field: str, current: int) -> float:
        history = self._samples.get(key)
        if not history:
            return 0.0
        then, values = history[0]
        elapsed = self.clock() - then
        if elapsed <= 0 or field not in values:
            return 0.0
        return round((current - values[field]) / elapsed, 1)

    def details(self, key: Hashable, counts: dict[str, int]) -> dict[str, Any]:
        """`counts` with a `<name>_details: {"rate": r}` beside each count, as RabbitMQ writes them."""
        shown: dict[str, Any] = {}
        for field, value in counts.items():
            shown[field] = value
            shown[field + "_details"] = {"rate": self.rate(key, field, value)}
        return shown

    async def run(self, collect: Callable[[], Iterable[tuple[Hashable, dict[str, int]]]]) -> None:
        """Sample forever (cancel the task to stop)."""
        while True:
            self.record(collect())
            await asyncio.sleep(INTERVAL)
