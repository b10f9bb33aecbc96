"""The clients of a fault run, recording everything they see in a `History`.

In a thread of its own (an asyncio loop with aio-pika clients):

- publishers, one per node to start with, publish persistent messages with unique ids to the
  quorum queue with confirms, ``window`` in flight, at most ``rate`` a second each; a nack, a
  confirm that does not come within ``confirm_timeout`` (5 s, as an application's would), or a
  lost connection makes one move to the next node (one that did not answer, a connection or a
  confirm, is passed over for AVOID_S). A message that was not confirmed is never
  published again under its id (its fate is unknown: the checker allows it to be consumed or not);
- consumers (prefetch 20, manual acks) record each delivery with its redelivered flag before
  acking it, and move to another node now and then (``stay``) and whenever their connection or
  channel fails or the broker cancels them (basic.cancel), so deliveries held at a failover are
  redelivered;
- an observer (another thread) asks every node about its replica of the queue twice a second.

On a stream (``stream=True``) the publishers are the same; each consumer reads the whole stream
from its first record (``x-stream-offset: first``, prefetch 50, acks returning credit), records
each delivery with its offset, and after any reconnection (a failure, a basic.cancel, or
``stay``) goes on at the next offset it has not seen, on the next node.

`drain` keeps the consumers going after the faults until the queue is empty and nothing has
arrived for a while; then the history is complete for the checker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import aio_pika.exceptions
from pamqp import commands

from interop_tests.faults.history import History

# A node that does not open a connection this fast is passed over (paused, cut off): the next one.
CONNECT_TIMEOUT_S = 1.5

# A node that failed a client (no connection, no confirm in time) is passed over for this long.
AVOID_S = 5.0

# The clients fail on purpose, all the time: their libraries' own warnings would drown the run's log.
for _noisy in ("aiormq", "aio_pika"):
    logging.getLogger(_noisy).setLevel(logging.CRITICAL)


class Workload:
    def __init__(self, urls: dict[str, str], queue: str, history: History, *, publishers: int = 3, consumers: int = 2,
                 window: int = 4, rate: float = 40.0, confirm_timeout: float = 5.0, stay: float = 8.0,
                 observe: Callable[[], None] | None = None, stream: bool = False) -> None:
        self.urls = urls
        self.queue = queue
        self.history = history
        self.publishers = publishers
        self.consumers = consumers
        self.window = window
        self.rate = rate
        self.confirm_timeout = confirm_timeout
        self.stay = stay
        self._observe = observe
        self._names = list(urls)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._observer: threading.Thread | None = None
        self._publishing = threading.Event()
        self._consuming = threading.Event()
        self._stopped = threading.Event()
        self.last_delivery = 0.0
        self.errors: list[str] = []
        self._avoid_until: dict[str, float] = {}  # node -> passed over until (monotonic)
        self.stream = stream
        self.next_offsets: dict[int, int] = {}  # a stream's consumer -> the offset it reads next

    # -- control, from the test's thread -----------------------------------------------------

    def start(self) -> None:
        self._publishing.set()
        self._consuming.set()
        self._thread = threading.Thread(target=self._run, name="fault-workload", daemon=True)
        self._thread.start()
        if self._observe is not None:
            self._observer = threading.Thread(target=self._observing, name="fault-observer", daemon=True)
            self._observer.start()

    def stop_publishing(self) -> None:
        self._publishing.clear()

    def stop(self) -> None:
        self._publishing.clear()
        self._consuming.clear()
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._observer is not None:
            self._observer.join(10)

    def confirms(self) -> int:
        return sum(1 for event in self.history.events if event["type"] == "ack")

    # -- the clients --------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        tasks = [asyncio.create_task(self._publisher(i)) for i in range(self.publishers)]
        tasks += [asyncio.create_task(self._consumer(i)) for i in range(self.consumers)]
        while not self._stopped.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _order(self, start: int) -> itertools.cycle[str]:
        names = self._names[start % len(self._names):] + self._names[:start % len(self._names)]
        return itertools.cycle(names)

    async def _connect(self, node: str) -> aio_pika.abc.AbstractConnection | None:
        """A connection to `node`; None when it does not open one (refused, cut off, paused): the
        node is then passed over (`_avoid`), after a short pause before the caller tries the next."""
        try:
            return await asyncio.wait_for(aio_pika.connect(self.urls[node], timeout=CONNECT_TIMEOUT_S),
                                          CONNECT_TIMEOUT_S + 1)
        except Exception:
            self._avoid(node)
            await asyncio.sleep(0.3)
            return None

    async def _close(self, connection: aio_pika.abc.AbstractConnection) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 2)

    def _avoid(self, node: str) -> None:
        """`node` did not answer (no connection, no confirm in time): the clients pass it over for
        AVOID_S, as a client with a list of addresses passes over one that just failed it."""
        self._avoid_until[node] = time.monotonic() + AVOID_S

    def _avoided(self, node: str) -> bool:
        """Pass `node` over now? (Not when every other node is passed over too.)"""
        now = time.monotonic()
        if self._avoid_until.get(node, 0.0) <= now:
            return False
        return any(self._avoid_until.get(other, 0.0) <= now for other in self._names if other != node)

    async def _publisher(self, number: int) -> None:
        sequence = itertools.count(1)
        for node in self._order(number):
            if not self._publishing.is_set():
                await asyncio.sleep(0.1)
                continue
            if self._avoided(node):
                continue
            connection = await self._connect(node)
            if connection is None:
                continue
            try:
                channel = await asyncio.wait_for(connection.channel(publisher_confirms=True), CONNECT_TIMEOUT_S)
                exchange = channel.default_exchange
                while self._publishing.is_set():
                    began = time.monotonic()
                    ids = [f"p{number}-{next(sequence)}" for _ in range(self.window)]
                    outcomes = await asyncio.gather(*(self._publish(exchange, node, m) for m in ids))
                    if not all(outcomes):
                        break  # a nack, a timeout or an error: the next node
                    pause = self.window / self.rate - (time.monotonic() - began)
                    if pause > 0:
                        await asyncio.sleep(pause)
            except Exception:
                pass
            finally:
                await self._close(connection)
            await asyncio.sleep(0.2)

    async def _publish(self, exchange: Any, node: str, message_id: str) -> bool:
        self.history.add("publish", id=message_id, node=node)
        try:
            confirmation = await exchange.publish(
                aio_pika.Message(message_id.encode(), message_id=message_id,
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=self.queue, timeout=self.confirm_timeout)
        except asyncio.TimeoutError:
            self.history.add("timeout", id=message_id, node=node)
            self._avoid(node)
            return False
        except aio_pika.exceptions.DeliveryError:  # aiormq's form of a basic.nack
            self.history.add("nack", id=message_id, node=node)
            return False
        except Exception as error:  # the connection or channel went: the outcome is unknown
            self.history.add("error", id=message_id, node=node, error=type(error).__name__)
            return False
        if isinstance(confirmation, commands.Basic.Nack):
            self.history.add("nack", id=message_id, node=node)
            return False
        self.history.add("ack", id=message_id, node=node)
        return True

    async def _consumer(self, number: int) -> None:
        self.next_offsets[number] = 0
        for node in self._order(number + 1):
            if not self._consuming.is_set():
                return
            if self._avoided(node):
                await asyncio.sleep(0.05)
                continue
            connection = await self._connect(node)
            if connection is None:
                continue
            try:
                await self._consume_on(connection, node, number)
            except Exception:
                pass
            finally:
                await self._close(connection)
            await asyncio.sleep(0.2)

    async def _consume_on(self, connection: aio_pika.abc.AbstractConnection, node: str, number: int) -> None:
        """Consume on `connection` until it or its channel fails, the broker cancels the consumer
        (a node that cannot reach the queue's leader), or it is time to move (`stay`)."""
        failed = asyncio.Event()
        connection.close_callbacks.add(lambda *_: failed.set())
        channel = await asyncio.wait_for(connection.channel(), CONNECT_TIMEOUT_S)
        channel.close_callbacks.add(lambda *_: failed.set())
        await channel.set_qos(prefetch_count=50 if self.stream else 20)
        queue = await asyncio.wait_for(channel.declare_queue(self.queue, passive=True), CONNECT_TIMEOUT_S)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            message_id = message.message_id or message.body.decode()
            if self.stream:
                offset = int((message.headers or {})["x-stream-offset"])  # type: ignore[call-overload]
                self.history.add("deliver", id=message_id, node=node, offset=offset, consumer=number)
                self.next_offsets[number] = max(self.next_offsets[number], offset + 1)
            else:
                self.history.add("deliver", id=message_id, node=node, redelivered=bool(message.redelivered),
                                 consumer=number)
            self.last_delivery = time.monotonic()
            with contextlib.suppress(Exception):
                await message.ack()

        # A stream's reader goes on at the next offset it has not seen (`first` to begin with).
        arguments = {"x-stream-offset": self.next_offsets[number] or "first"} if self.stream else None
        tag = await asyncio.wait_for(queue.consume(on_message, arguments=arguments), CONNECT_TIMEOUT_S)
        underlay = await channel.get_underlay_channel()
        until = time.monotonic() + self.stay
        while tag in underlay.consumers and not failed.is_set() and time.monotonic() < until:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(failed.wait(), 0.5)

    def _observing(self) -> None:
        while not self._stopped.is_set():
            began = time.monotonic()
            try:
                self._observe()  # type: ignore[misc]
            except Exception as error:  # an observer must not stop the run
                self.errors.append(repr(error))
            time.sleep(max(0.0, 0.5 - (time.monotonic() - began)))
