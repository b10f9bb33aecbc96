"""Reaching a peer by a list of URIs, again and again: the reconnect policy of shovels and federation links.

`connect_first(addresses, ...)` opens a `PeerConnection` to the first address that answers,
trying them in order from the one that worked last (so a host list fails over, and comes back
to a recovered first host only when the one in use fails). `Reconnects` keeps what an operator
needs to see of a link that keeps failing: how many times it reconnected, the last error and
when, and the delay before the next try (RabbitMQ's `reconnect-delay`, in seconds; 0 means a
failed link is not retried, as RabbitMQ stops such a shovel).

Errors are sorted in two: a refused login (403), a vhost the user may not enter (530), a
resource missing or refused (404, 405, 406) are *permanent*: retrying changes nothing until
someone fixes a definition, so a shovel or link stops with the error (a restart retries). A
network error, a server closing with 320 (shutdown), 541 or 50x is *transient*: retried
after the delay, and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from amqp_server.peer_link.client import LinkError, LinkHandler, LocalOpener, PeerConnection
from amqp_server.peer_link.uri import PeerAddress
from amqp_server.wire import errors

DEFAULT_RECONNECT_DELAY_S = 1.0
# Reply codes that say retrying cannot help (see the module docstring).
PERMANENT_CODES = frozenset((errors.ACCESS_REFUSED, errors.NOT_ALLOWED, errors.NOT_FOUND, errors.RESOURCE_LOCKED,
                             errors.PRECONDITION_FAILED))


def is_permanent(error: LinkError) -> bool:
    """Retrying `error` cannot help (see the module docstring)."""
    return error.code in PERMANENT_CODES


@dataclass
class Reconnects:
    """A link's reconnect count, its last error and when it happened (time.time())."""

    delay_s: float = DEFAULT_RECONNECT_DELAY_S
    count: int = 0
    last_error: str | None = None
    last_error_at: float | None = None

    def failed(self, error: LinkError | str) -> None:
        self.last_error = error.text if isinstance(error, LinkError) else error
        self.last_error_at = time.time()

    def retrying(self) -> None:
        """A new attempt after a failure."""
        self.count += 1

    def as_json(self) -> dict[str, object]:
        """The status fields an operator sees (`/api/shovels`, `/api/federation-links`)."""
        status: dict[str, object] = {"reconnects": self.count, "reconnect_delay": self.delay_s}
        if self.last_error is not None:
            status["last_error"] = self.last_error
            status["last_error_time"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.last_error_at))
        return status


class AddressCycle:
    """The addresses of one end, tried in order from the last that worked."""

    def __init__(self, addresses: list[PeerAddress]) -> None:
        if not addresses:
            raise ValueError("an end needs at least one address")
        self._addresses = list(addresses)
        self._start = 0
        self.current: PeerAddress = self._addresses[0]

    def in_order(self) -> list[PeerAddress]:
        return self._addresses[self._start:] + self._addresses[:self._start]

    def worked(self, address: PeerAddress) -> None:
        self._start = self._addresses.index(address)
        self.current = address


async def connect_first(cycle: AddressCycle, handler: LinkHandler, connection_name: str = "",
                        local_opener: LocalOpener | None = None,
                        local_credentials: tuple[str, str] | None = None) -> PeerConnection:
    """An open connection to the first of `cycle`'s addresses that answers; the last error
    (each address's named in it) when none does. A permanent refusal of one address ends the
    attempt there: the others are the same broker's nodes and say the same."""
    failures: list[str] = []
    last: LinkError | None = None
    for address in cycle.in_order():
        connection = PeerConnection(address, handler, connection_name, local_opener, local_credentials)
        try:
            await connection.open()
        except LinkError as error:
            failures.append(error.text)
            last = error
            if is_permanent(error):
                break
            continue
        cycle.worked(address)
        return connection
    assert last is not None
    if len(failures) > 1:
        raise LinkError("; ".join(failures), last.code)
    raise last
