"""Run the broker with every garbage-collection pass timed: `python bench/gc_timed_broker.py OUT -- ARGS`.

ARGS are `python -m amqp_server`'s. A `gc.callbacks` hook records each full (generation 2) pass:
when it started (time.monotonic, the clock the benchmark's client processes read too), how
long it took on the wall clock and in the broker thread's CPU time (which a loaded machine does
not inflate: time spent descheduled is not counted), and how many objects it freed. Passes of
the younger generations are summed. When the broker stops, OUT gets one JSON document.

Run as a file, not as a module, so that the broker it imports is the one on PYTHONPATH (an old
checkout for a before/after comparison), whichever checkout this file is in.
"""

from __future__ import annotations

import gc
import json
import sys
import time


class PassTimer:
    """The gc.callbacks hook: full passes one by one, younger ones summed per generation."""

    def __init__(self) -> None:
        self.full_passes: list[dict[str, float]] = []
        self.younger = {0: {"passes": 0, "max_ms": 0.0}, 1: {"passes": 0, "max_ms": 0.0}}
        self._started = 0.0
        self._started_cpu = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.monotonic()
            self._started_cpu = time.thread_time()
            return
        wall_ms = (time.monotonic() - self._started) * 1000
        generation = info["generation"]
        if generation == 2:
            cpu_ms = (time.thread_time() - self._started_cpu) * 1000
            self.full_passes.append(
                {"at": self._started, "wall_ms": wall_ms, "cpu_ms": cpu_ms, "collected": info["collected"]}
            )
        else:
            summary = self.younger[generation]
            summary["passes"] += 1
            summary["max_ms"] = max(summary["max_ms"], wall_ms)


def main(argv: list[str]) -> int:
    out, separator, broker_args = argv[0], argv[1], argv[2:]
    if separator != "--":
        raise SystemExit("usage: gc_timed_broker.py OUT -- BROKER-ARGS")
    timer = PassTimer()
    gc.callbacks.append(timer)
    from amqp_server.runtime.cli import main as broker_main

    try:
        return broker_main(broker_args)
    finally:
        gc.callbacks.remove(timer)
        with open(out, "w") as file:
            json.dump({"full_passes": timer.full_passes, "younger": timer.younger}, file)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
