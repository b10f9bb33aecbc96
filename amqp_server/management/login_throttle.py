"""Failed management logins counted per client address, to slow password guessing.

Each address gets `limit` failed logins per window of `window` seconds, counted from its
first failure; once it reaches the limit, the API answers 429 to its logins, without checking
the password, until that window ends. A successful login does not reset the count (a guesser
with one valid account would otherwise reset it between guesses), and other addresses are
not affected. IPv6 clients are counted by /64, the block one host usually holds. The table
keeps at most `max_addresses` entries, dropping the least recently failed, so a flood of
addresses costs bounded memory (docs/security.md, "Management API").
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_ADDRESSES = 10_000
IPV6_BLOCK_PREFIX = 64


@dataclass
class _Window:
    started: float
    failures: int


def client_key(remote: str | None) -> str:
    """The address a failure is counted against: IPv4 as is (also when IPv4-mapped), IPv6 by /64."""
    if not remote:
        return ""
    try:
        address = ipaddress.ip_address(remote.split("%")[0])
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_BLOCK_PREFIX), strict=False))
    return str(address)


class LoginThrottle:
    """`limit` 0 turns throttling off."""

    def __init__(self, limit: int, window: float, max_addresses: int = MAX_ADDRESSES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.max_addresses = max_addresses
        self._clock = clock
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def retry_after(self, remote: str | None) -> int | None:
        """Whole seconds until `remote` may try to log in again; None if it may now."""
        if not self.limit:
            return None
        key = client_key(remote)
        window = self._windows.get(key)
        if window is None:
            return None
        remaining = window.started + self.window - self._clock()
        if remaining <= 0:
            del self._windows[key]
            return None
        return math.ceil(remaining) if window.failures >= self.limit else None

    def record_failure(self, remote: str | None) -> None:
        if not self.limit:
            return
        key = client_key(remote)
        now = self._clock()
        window = self._windows.pop(key, None)
        if window is None or now - window.started >= self.window:
            window = _Window(now, 0)
        window.failures += 1
        self._windows[key] = window  # re-inserted last: the most recently failed
        if window.failures == self.limit:
            log.warning("management API: %d failed logins from %s within %d s; refusing its logins for the "
                        "rest of the window", window.failures, key, self.window)
        while len(self._windows) > self.max_addresses:
            self._windows.popitem(last=False)

    @property
    def tracked_addresses(self) -> int:
        return len(self._windows)
