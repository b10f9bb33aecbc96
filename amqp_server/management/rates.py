"""Per-second rates for the management API's `*_details: {"rate": r}` fields, and the sample
history behind RabbitMQ's `samples` lists (the overview's charts).

RabbitMQ samples its statistics every 5 s (collect_statistics_interval). So does this: a task
records each object's counters every `INTERVAL` seconds, and a rate is the change since the
older of the last two samples, divided by the time between. No sample yet means rate 0.0.

Keys named in `history_keys` (the overview's) also keep `HISTORY_SECONDS` of samples, so that
`?msg_rates_age=3600&msg_rates_incr=60` answers an hour of counters, as RabbitMQ's basic
retention does for the overview. Other objects keep two samples: 10,000 queues with an hour
of history each would cost hundreds of MiB.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

INTERVAL = 5.0
HISTORY_SECONDS = 3600
MAX_SAMPLES_SHOWN = 1000  # a small incr over a long age must not make a huge reply

Sample = tuple[float, dict[str, int]]


@dataclass(frozen=True)
class SampleWindow:
    """RabbitMQ's `lengths_age`/`lengths_incr` and `msg_rates_age`/`msg_rates_incr` query
    parameters: samples over the last `age` seconds, `incr` seconds apart."""

    age: float
    incr: float


class RateSampler:
    def __init__(self, clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 history_keys: Iterable[Hashable] = ()) -> None:
        self.clock = clock
        self.wall_clock = wall_clock
        self._samples: dict[Hashable, deque[Sample]] = {}
        history_length = int(HISTORY_SECONDS / INTERVAL) + 2
        self._history: dict[Hashable, deque[Sample]] = {key: deque(maxlen=history_length) for key in history_keys}

    def record(self, samples: Iterable[tuple[Hashable, dict[str, int]]]) -> None:
        """One sampling round; objects absent from it (deleted) are forgotten."""
        now = self.clock()
        seen = set()
        for key, values in samples:
            seen.add(key)
            history = self._samples.get(key)
            if history is None:
                history = self._samples[key] = deque(maxlen=2)
            sample = (now, dict(values))
            history.append(sample)
            long_history = self._history.get(key)
            if long_history is not None:
                long_history.append(sample)
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

    def samples(self, key: Hashable, field: str, window: SampleWindow) -> list[dict[str, int]]:
        """RabbitMQ's `samples`: `[{"sample": value, "timestamp": ms since the epoch}]`, newest
        first: the latest recorded sample, then the latest at least `incr` seconds older than
        the one before, back to `age` seconds ago (as far as the history reaches). Empty for a
        key without history."""
        history = self._history.get(key)
        if history is None:
            return []
        now, wall_now = self.clock(), self.wall_clock()
        incr = max(window.incr, INTERVAL)
        oldest_wanted = now - min(window.age, HISTORY_SECONDS)
        shown: list[dict[str, int]] = []
        target = now
        for taken, values in reversed(history):
            if len(shown) >= MAX_SAMPLES_SHOWN or taken < oldest_wanted:
                break
            if taken > target or field not in values:
                continue
            shown.append({"sample": values[field], "timestamp": int((wall_now - (now - taken)) * 1000)})
            # Rounds are INTERVAL apart give or take the loop's lag: a tenth of it is tolerated.
            target = taken - incr + INTERVAL / 10
        return shown

    def details(self, key: Hashable, counts: dict[str, int], window: SampleWindow | None = None) -> dict[str, Any]:
        """`counts` with a `<name>_details: {"rate": r}` beside each count, as RabbitMQ writes them;
        with a `window`, each details object also holds the `samples` for it."""
        shown: dict[str, Any] = {}
        for field, value in counts.items():
            shown[field] = value
            details: dict[str, Any] = {"rate": self.rate(key, field, value)}
            if window is not None:
                details["samples"] = self.samples(key, field, window)
            shown[field + "_details"] = details
        return shown

    async def run(self, collect: Callable[[], Iterable[tuple[Hashable, dict[str, int]]]]) -> None:
        """Sample forever (cancel the task to stop)."""
        while True:
            self.record(collect())
            await asyncio.sleep(INTERVAL)
