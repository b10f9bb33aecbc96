"""Publishing through a federation link while brokers are killed and the network is cut, and
counting what arrived: lost (confirmed upstream, never arrived downstream) and duplicated.

`Publisher` publishes numbered persistent messages with confirms to the upstream in a thread of
its own, again and again until each is confirmed (a message whose confirm was lost with a killed
broker is published again: it may arrive twice, which counts as a duplicate, never as lost). The
test injects its faults meanwhile, then `drain` reads everything that reached the downstream
queue. A message the publisher saw confirmed and that never arrived is lost.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pika
from pika.exceptions import AMQPError

from interop_tests.federation_helpers import Site
from interop_tests.waiting import poll


@dataclass
class Tally:
    confirmed: set[int] = field(default_factory=set)
    arrived: Counter[int] = field(default_factory=Counter)

    @property
    def lost(self) -> list[int]:
        return sorted(n for n in self.confirmed if n not in self.arrived)

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in self.arrived.values() if count > 1)


class Publisher(threading.Thread):
    """Publishes 0..total-1 to `exchange` with `routing_key` on `site`, each until confirmed."""

    def __init__(self, site: Site, exchange: str, routing_key: str, total: int, tally: Tally,
                 pause_s: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.site = site
        self.exchange = exchange
        self.routing_key = routing_key
        self.total = total
        self.tally = tally
        self.pause_s = pause_s
        self.failures = 0
        self._stop_now = threading.Event()

    def run(self) -> None:
        number = 0
        connection = None
        channel: Any = None
        while number < self.total and not self._stop_now.is_set():
            try:
                if connection is None or not connection.is_open:
                    connection = pika.BlockingConnection(pika.URLParameters(self.site.amqp_url + "?heartbeat=5"))
                    channel = connection.channel()
                    channel.confirm_delivery()
                channel.basic_publish(self.exchange, self.routing_key, str(number).encode(),
                                      pika.BasicProperties(delivery_mode=2))
                self.tally.confirmed.add(number)
                number += 1
                if self.pause_s:
                    time.sleep(self.pause_s)
            except (AMQPError, OSError):  # the broker went: publish this one again once back
                self.failures += 1
                connection = None
                time.sleep(0.2)
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except (AMQPError, OSError):
                pass

    def stop(self) -> None:
        self._stop_now.set()


def drain(site: Site, queue: str, tally: Tally, expect_at_least: int, within: float = 60.0) -> None:
    """Read `queue` on `site` into `tally` until it holds every confirmed message (or `within`
    passes: then what is missing is lost), and a moment longer for late duplicates."""
    def read_all() -> bool:
        connection = pika.BlockingConnection(pika.URLParameters(site.amqp_url))
        try:
            channel = connection.channel()
            while True:
                method, _properties, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                tally.arrived[int(body)] += 1
        finally:
            connection.close()
        return len(tally.arrived) >= expect_at_least and not tally.lost

    try:
        poll(read_all, within, every=0.5)
    except (AMQPError, OSError):
        pass
