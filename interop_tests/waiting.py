"""Waiting for what a test cannot be told about: call a check until it holds.

The one wait helper of both test suites (the unit tests in `tests/` import it too), in three
forms of one idea:

- `poll` returns the check's last value, true or not, for a caller that asserts on it with its
  own message, or that goes on either way;
- `wait_until` fails the test naming what did not happen, and returns the check's true value;
- `wait_until_async` is `wait_until` inside a running event loop (it sleeps with asyncio).

A check that raises OSError (a refused connection, a node that is restarting, an HTTP error
from `requests`) has not held yet; if its last call raised, that error is what the caller sees.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def poll(check: Callable[[], Any], within: float, *, every: float = 0.05,
         pump: Callable[[float], object] | None = None) -> Any:
    """Call `check()` until it returns something true or `within` seconds have passed; its last
    value. If its last call raised OSError, that error propagates.

    Between calls: sleep `every` seconds (at most what is left), or give that time to
    `pump(seconds)`, a client's I/O loop (pika's `connection.process_data_events`), so that the
    client's callbacks run while the test waits."""
    value, error = _poll(check, within, every, pump)
    if error is not None:
        raise error
    return value


def wait_until(check: Callable[[], Any], what: str, within: float = 15.0, *, every: float = 0.05,
               pump: Callable[[float], object] | None = None) -> Any:
    """The first true value `check()` returns; fails the test (AssertionError "not within
    `within` s: `what`") if none came within `within` seconds. `every` and `pump` as in `poll`."""
    value, error = _poll(check, within, every, pump)
    if not value:
        raise AssertionError(f"not within {within} s: {what}") from error
    return value


async def wait_until_async(check: Callable[[], Any], what: str, within: float = 10.0, *,
                           every: float = 0.01) -> Any:
    """`wait_until` for a test inside an event loop: between calls it yields to the loop for
    `every` seconds. (Its checks are in-process and cheap, hence the shorter defaults.)"""
    deadline = time.monotonic() + within
    while True:
        value, error = _call(check)
        left = deadline - time.monotonic()
        if value or left <= 0:
            break
        await asyncio.sleep(min(every, left))
    if not value:
        raise AssertionError(f"not within {within} s: {what}") from error
    return value


def _poll(check: Callable[[], Any], within: float, every: float,
          pump: Callable[[float], object] | None) -> tuple[Any, OSError | None]:
    """(the last value, the error its last call raised or None): the loop of `poll` and `wait_until`."""
    deadline = time.monotonic() + within
    while True:
        value, error = _call(check)
        left = deadline - time.monotonic()
        if value or left <= 0:
            return value, error
        if pump is None:
            time.sleep(min(every, left))
        else:
            pump(min(every, left))


def _call(check: Callable[[], Any]) -> tuple[Any, OSError | None]:
    try:
        return check(), None
    except OSError as error:  # what a check raises while the process it asks is not there yet
        return None, error
