"""The benchmark scenarios. Each expands into variants; a variant runs against one target and returns rows.

Every variant declares its own uniquely named queues/exchanges, runs, and deletes
them again, so targets can take turns without leftovers influencing each other.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench import memory, topic_bindings
from bench.lean_client import AMQPError, LeanChannel, LeanConnection
from bench.orchestrator import Outcome, percentile, run_workers
from bench.targets import Target
from bench.workers import ConsumerSpec, PublisherSpec, Timing

Row = tuple[str, str, float]
"""(metric, unit, value)"""


@dataclass(frozen=True)
class Options:
    size: int = 100
    duration_s: float | None = 5.0
    warmup_s: float = 1.0
    count: int | None = None
    publishers: int = 1
    consumers: int = 1
    consumer_procs: int = 1
    prefetch: int = 100
    confirm_windows: tuple[int, ...] = (1, 16, 256)
    rates: tuple[int, ...] = (1000, 5000)
    connections: int = 1000
    fanout_queues: int = 10
    topic_bindings: int = 1000
    topic_queues: int = 10
    settle_s: float = 2.0
    spread_queues: int = 16
    publisher_procs: int = 1
    placed_window: int = 64  # spread, hot-queue: unconfirmed messages per publisher (0: flood, no confirms)
    queue_type: str = "classic"  # confirms: the durable queue's x-queue-type
    # streams (bench/streams.py): the readers' stream, its fill's window first, then timed windows
    stream_messages: int = 1_000_000
    stream_windows: tuple[int, ...] = (256, 1)
    stream_prefetch: int = 1000
    stream_consumers: int = 10
    stream_retention_bytes: int = 100_000_000
    stream_segment_bytes: int = 10_000_000
    stream_retention_publish_bytes: int = 300_000_000
    stream_retention_body: int = 1000

    @property
    def timing(self) -> Timing:
        return Timing(self.warmup_s, None if self.count else self.duration_s, self.count)


@dataclass(frozen=True)
class Variant:
    scenario: str
    name: str
    run: Callable[[Target], list[Row]]
    repeatable: bool = True  # False: a second round would measure a different thing (a warmed-up heap)


# ---- helpers ------------------------------------------------------------------------


def _unique(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


def _with_channel(url: str, action: Callable[[LeanChannel], Awaitable[None]]) -> None:
    async def run() -> None:
        conn = await LeanConnection.open(url, name="bench-setup")
        try:
            await action(await conn.channel())
        finally:
            await conn.close()

    asyncio.run(run())


def _cleanup(url: str, queues: list[str], exchanges: list[str] = ()) -> None:
    async def delete(chan: LeanChannel) -> None:
        for name in queues:
            await chan.queue_delete(name)
        for name in exchanges:
            await chan.exchange_delete(name)

    _with_channel(url, delete)


def _await_visible(target: Target, queue: str, within_s: float = 10.0) -> None:
    """With publishers on another cluster node: wait until that node knows the queue."""
    if target.publish_via is not None:
        _await_known((target.publish_via,), [queue], within_s)


def _consumer_groups(specs: list[ConsumerSpec], procs: int) -> list[list[ConsumerSpec]]:
    """Spread consumer connections round-robin over at most `procs` processes."""
    procs = max(1, min(procs, len(specs)))
    return [specs[i::procs] for i in range(procs)] if specs else []


def _row(metric: str, unit: str, value: float | None) -> list[Row]:
    return [] if value is None else [(metric, unit, value)]


def _throughput(outcome: Outcome, publish_metric: str = "published", deliveries: bool = True) -> list[Row]:
    rows = _row(publish_metric, "msg/s", outcome.publish_rate)
    if deliveries:
        rows += _row("delivered", "msg/s", outcome.delivery_rate)
    return rows + _cpu_rows(outcome)


def _cpu_rows(outcome: Outcome) -> list[Row]:
    """Broker CPU, and the busiest client process's CPU: near 1.00 means the client may be the limit."""
    return (_row("broker CPU", "cores", outcome.broker_cpu_cores)
            + _row("client CPU, busiest publisher", "cores", outcome.client_cpu_cores("publisher"))
            + _row("client CPU, busiest consumer", "cores", outcome.client_cpu_cores("consumer")))


# ---- 1. publish only ------------------------------------------------------------------


def publish_only(target: Target, opts: Options) -> list[Row]:
    queue = _unique("publish-only")
    _with_channel(target.url, lambda ch: ch.queue_declare(queue))
    _await_visible(target, queue)
    try:
        pubs = [PublisherSpec(target.publish_url, "", (queue,), opts.size) for _ in range(opts.publishers)]
        outcome = run_workers(pubs, [], opts.timing, target.pid)
    finally:
        _cleanup(target.url, [queue])
    return _throughput(outcome, deliveries=False)


# ---- 2. one queue, publish and consume ----------------------------------------------------


def pubsub(target: Target, opts: Options, no_ack: bool) -> list[Row]:
    queue = _unique("pubsub")
    _with_channel(target.url, lambda ch: ch.queue_declare(queue))
    _await_visible(target, queue)
    try:
        pubs = [PublisherSpec(target.publish_url, "", (queue,), opts.size) for _ in range(opts.publishers)]
        cons = [ConsumerSpec(target.url, queue, no_ack, opts.prefetch) for _ in range(opts.consumers)]
        expected = opts.count * opts.publishers if opts.count else None
        outcome = run_workers(pubs, _consumer_groups(cons, opts.consumer_procs), opts.timing, target.pid, expected)
    finally:
        _cleanup(target.url, [queue])
    return _throughput(outcome)


# ---- 3. persistent + confirms ---------------------------------------------------------------


def confirms(target: Target, opts: Options, window: int) -> list[Row]:
    queue = _unique("confirms")
    arguments = {"x-queue-type": opts.queue_type} if opts.queue_type != "classic" else None
    _with_channel(target.url, lambda ch: ch.queue_declare(queue, durable=True, arguments=arguments))
    _await_visible(target, queue)
    try:
        pubs = [PublisherSpec(target.publish_url, "", (queue,), opts.size, persistent=True, confirm_window=window)
                for _ in range(opts.publishers)]
        outcome = run_workers(pubs, [], opts.timing, target.pid)
    finally:
        _cleanup(target.url, [queue])
    latencies = outcome.confirm_latencies_ms()
    return (_row("confirmed", "msg/s", outcome.publish_rate)
            + _row("confirm p50", "ms", percentile(latencies, 50))
            + _row("confirm p99", "ms", percentile(latencies, 99))
            + _cpu_rows(outcome))


# ---- 4. fanout -------------------------------------------------------------------------------


def fanout(target: Target, opts: Options) -> list[Row]:
    exchange = _unique("fanout")
    queues = [f"{exchange}-q{i}" for i in range(opts.fanout_queues)]

    async def setup(ch: LeanChannel) -> None:
        await ch.exchange_declare(exchange, "fanout")
        for queue in queues:
            await ch.queue_declare(queue)
            await ch.queue_bind(queue, exchange, "")

    _with_channel(target.url, setup)
    try:
        pubs = [PublisherSpec(target.url, exchange, ("",), opts.size) for _ in range(opts.publishers)]
        cons = [ConsumerSpec(target.url, q, False, opts.prefetch) for q in queues]
        expected = opts.count * opts.publishers * len(queues) if opts.count else None
        outcome = run_workers(pubs, _consumer_groups(cons, opts.consumer_procs), opts.timing, target.pid, expected)
    finally:
        _cleanup(target.url, queues, [exchange])
    return _throughput(outcome)


# ---- 5. topic ---------------------------------------------------------------------------------


def topic(target: Target, opts: Options) -> list[Row]:
    exchange = _unique("topic")
    queues = [f"{exchange}-q{i}" for i in range(opts.topic_queues)]
    bindings = topic_bindings.make_bindings(opts.topic_bindings, len(queues))
    keys = topic_bindings.make_keys(bindings)

    async def setup(ch: LeanChannel) -> None:
        await ch.exchange_declare(exchange, "topic")
        for queue in queues:
            await ch.queue_declare(queue)
        for index, pattern in bindings:
            await ch.queue_bind(queues[index], exchange, pattern)

    _with_channel(target.url, setup)
    try:
        pubs = [PublisherSpec(target.url, exchange, tuple(keys), opts.size) for _ in range(opts.publishers)]
        cons = [ConsumerSpec(target.url, q, False, opts.prefetch) for q in queues]
        expected = None
        if opts.count:
            matched = topic_bindings.queues_matched(bindings, keys)
            expected = opts.publishers * sum(matched[i % len(keys)] for i in range(opts.count))
        outcome = run_workers(pubs, _consumer_groups(cons, opts.consumer_procs), opts.timing, target.pid, expected)
    finally:
        _cleanup(target.url, queues, [exchange])
    return _throughput(outcome)


# ---- 6. latency at a fixed rate ---------------------------------------------------------------------


def latency(target: Target, opts: Options, rate: int) -> list[Row]:
    queue = _unique("latency")
    _with_channel(target.url, lambda ch: ch.queue_declare(queue))
    _await_visible(target, queue)
    try:
        pubs = [PublisherSpec(target.url, "", (queue,), opts.size, rate=rate)]
        cons = [ConsumerSpec(target.url, queue, False, opts.prefetch, latency=True)]
        expected = opts.count if opts.count else None
        outcome = run_workers(pubs, [cons], opts.timing, target.pid, expected)
    finally:
        _cleanup(target.url, [queue])
    latencies = outcome.delivery_latencies_ms()
    return (_row("delivered", "msg/s", outcome.delivery_rate)
            + _row("end-to-end p50", "ms", percentile(latencies, 50))
            + _row("end-to-end p99", "ms", percentile(latencies, 99))
            + _row("end-to-end max", "ms", latencies[-1] if latencies else None)
            + _cpu_rows(outcome))


# ---- 7. idle connections ---------------------------------------------------------------------------


def idle_connections(target: Target, opts: Options) -> list[Row]:
    return memory.measure_idle_connections(target, opts.connections, opts.settle_s)


# ---- 8. many queues, many connections; 9. one hot queue: where clients land in a cluster -------------

SHARED_PORT, OWNER_LOCAL, OWNER_REMOTE = "shared port", "owner-local", "owner-remote"
PLACEMENTS = (SHARED_PORT, OWNER_LOCAL, OWNER_REMOTE)


def placed(target: Target, opts: Options, queues: int, publishers: int, consumers: int, placement: str) -> list[Row]:
    """`queues` queues, each with `publishers` flooding publishers and `consumers` manual-ack
    consumers, a connection each. SHARED_PORT: everything goes to the target's URL, each queue
    declared through a connection of its own, so behind a shared port (`--workers N`) the kernel
    picks each queue's owner and each client's node, and a worker hands a client whose queue
    another worker owns to that worker (docs/cluster.md, "Handing the client's socket"). With the
    target's `nodes`: OWNER_LOCAL puts queue i on node i mod n and its clients there too (where
    the hand-over puts them, with no hand-over to make); OWNER_REMOTE puts its clients on the next
    node's own port, whose connections never move (every message forwarded)."""
    nodes = target.nodes
    if placement != SHARED_PORT and len(nodes) < 2:
        return []  # a single node: every placement is SHARED_PORT's
    names = [_unique("placed") for _ in range(queues)]

    def home(i: int) -> str:
        return target.url if placement == SHARED_PORT else nodes[i % len(nodes)]

    def client(i: int) -> str:
        return nodes[(i + 1) % len(nodes)] if placement == OWNER_REMOTE else home(i)

    for i, name in enumerate(names):
        _with_channel(home(i), lambda ch, name=name: ch.queue_declare(name))
    _await_known(nodes, names)
    try:
        window = opts.placed_window or None
        pubs = [PublisherSpec(client(i), "", (name,), opts.size, confirm_window=window) for i, name in enumerate(names)
                for _ in range(publishers)]
        cons = [ConsumerSpec(client(i), name, False, opts.prefetch) for i, name in enumerate(names)
                for _ in range(consumers)]
        procs = max(1, min(opts.publisher_procs, len(pubs)))
        outcome = run_workers([pubs[i::procs] for i in range(procs)], _consumer_groups(cons, opts.consumer_procs),
                              opts.timing, target.pid)
    finally:
        _cleanup(target.url, names)
    rows = _throughput(outcome, "confirmed" if window else "published")
    if outcome.broker_cpu_cores is not None and outcome.delivery_rate:
        # What a message costs the broker (every worker) in CPU: steadier than the rates on a
        # machine whose other load takes cores away, and what forwarding adds shows directly.
        rows.append(("broker CPU per delivered message", "µs", outcome.broker_cpu_cores / outcome.delivery_rate * 1e6))
    return rows


def _await_known(urls: tuple[str, ...], queues: list[str], within_s: float = 10.0) -> None:
    """Wait until every node in `urls` knows every queue (shared definitions reached it)."""
    async def wait() -> None:
        deadline = time.monotonic() + within_s
        for url in urls:
            for queue in queues:
                while True:
                    conn = await LeanConnection.open(url, name="bench-setup")
                    try:
                        await (await conn.channel()).queue_declare(queue, passive=True)
                        break
                    except AMQPError:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.1)
                    finally:
                        await conn.close()

    asyncio.run(wait())


# ---- registry -----------------------------------------------------------------------------------------


def variants(name: str, opts: Options) -> list[Variant]:
    """The variants of scenario `name` under these options, named as the result table shows them."""
    pubs = "" if opts.publishers == 1 else f", {opts.publishers} publishers"
    if name == "publish-only":
        return [Variant("1 publish-only", f"transient, no confirms{pubs}", lambda t: publish_only(t, opts))]
    if name == "pubsub":
        shape = "" if opts.publishers == opts.consumers == 1 else f", {opts.publishers}p/{opts.consumers}c"
        return [Variant("2 queue pub/sub", f"auto-ack{shape}", lambda t: pubsub(t, opts, True)),
                Variant("2 queue pub/sub", f"manual ack, prefetch {opts.prefetch}{shape}",
                        lambda t: pubsub(t, opts, False))]
    if name == "confirms":
        return [Variant("3 persistent+confirms", f"{n} in flight{pubs}", lambda t, n=n: confirms(t, opts, n))
                for n in opts.confirm_windows]
    if name == "fanout":
        return [Variant("4 fanout", f"{opts.fanout_queues} queues, manual ack, prefetch {opts.prefetch}{pubs}",
                        lambda t: fanout(t, opts))]
    if name == "topic":
        return [Variant("5 topic", f"{opts.topic_bindings} bindings, {opts.topic_queues} queues{pubs}",
                        lambda t: topic(t, opts))]
    if name == "latency":
        return [Variant("6 latency", f"{r:,} msg/s, manual ack, prefetch {opts.prefetch}",
                        lambda t, r=r: latency(t, opts, r)) for r in opts.rates]
    if name == "idle-connections":
        return [Variant("7 idle connections", f"{opts.connections:,} connections, 1 channel each",
                        lambda t: idle_connections(t, opts), repeatable=False)]
    flow = f"{opts.placed_window} in flight" if opts.placed_window else "no confirms"
    if name == "spread":
        n = opts.spread_queues
        return [Variant("8 many queues", f"{n} queues, 1p/1c each, {flow}, prefetch {opts.prefetch}, {where}",
                        lambda t, where=where: placed(t, opts, n, 1, 1, where)) for where in PLACEMENTS]
    if name == "hot-queue":
        shape = f"{opts.publishers}p/{opts.consumers}c"
        return [Variant("9 one hot queue", f"{shape}, {flow}, prefetch {opts.prefetch}, {where}",
                        lambda t, where=where: placed(t, opts, 1, opts.publishers, opts.consumers, where))
                for where in PLACEMENTS]
    if name == "streams":
        from bench import streams  # it builds on this module's helpers

        return streams.variants(opts)
    raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIO_NAMES)}")


SCENARIO_NAMES = ("publish-only", "pubsub", "confirms", "fanout", "topic", "latency", "idle-connections",
                  "spread", "hot-queue", "streams")
ALL_ORDER = ("idle-connections",) + SCENARIO_NAMES[:-4]
"""`all` measures memory first: a broker that has just held a large backlog keeps that memory
(RSS does not shrink), and new connections would fit into it for free. Start brokers fresh."""
