"""The broker with a deliberately broken federation link, for the no-loss tests' control only.

`python -m interop_tests.broken_federation_broker ARGS` runs the broker as `python -m amqp_server
ARGS` does, except that a federation link acknowledges each message upstream as soon as it
receives it, and publishes it here only 0.3 s later (a build that acks before it stored). The
no-loss tests run their kill -9 scenario against it to show that they notice such a build: it
must lose messages. The switch lives here, in the test harness, never in the product.
"""

from __future__ import annotations

import asyncio
from typing import Any

from amqp_server.federation import links

DELAY_S = 0.3


def _ack_first(self: Any, tag: int, redelivered: bool, exchange: str, routing_key: str, raw_header: bytes,
               body: bytes) -> None:
    up = self._up
    if up is None:
        return
    up.ack(self._up_channel, tag)  # acknowledged before anything is stored here

    def publish_later() -> None:
        down = self._down
        if down is None:
            return  # the session ended meanwhile: the message is gone
        header = self._forwarded_header(raw_header, redelivered, exchange, routing_key)
        if header is not None:
            down.publish(self._down_channel, *self._destination(routing_key), header, body)

    asyncio.get_running_loop().call_later(DELAY_S, publish_later)


links._Link.delivered = _ack_first  # type: ignore[method-assign]

if __name__ == "__main__":
    from amqp_server.runtime.cli import main

    raise SystemExit(main())
