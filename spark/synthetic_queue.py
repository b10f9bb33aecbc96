"""Write a durable queue's files with made-up messages and fates, through the broker's own QueueStore
(and a stream's, through its StreamLog: ``write_synthetic_stream``).

For benchmarks (bench/spark_scan.py), demos and tests: no broker process is
needed, and the files are exactly what the broker writes (same store, same
record order: state records go to the newest segment, so the state of an old
segment's messages is often in a later segment).

Fates, drawn per message with a seeded RNG: 60% acked, 5% left with a consumer
(unacked), 5% dead-lettered (rejected), 30% ready; one ready message in ten was
delivered and requeued first (redelivered, delivery_count 1).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from pamqp import commands, header

from persistence.queue_store import QueueStore

ROUTING_KEYS = tuple(f"{kind}.{region}.{event}" for kind in ("order", "invoice") for region in ("eu", "us")
                     for event in ("created", "paid", "shipped", "cancelled", "refunded"))
_BLOCK = 1000  # messages published before their fates are written


def raw_properties(properties: commands.Basic.Properties) -> bytes:
    """The property flags and list of a content header, as the broker stores them."""
    return header.ContentHeader(0, 0, properties).marshal()[12:]


def write_synthetic_queue(
    data_dir: str | Path,
    queue: str,
    count: int,
    *,
    vhost: str = "/",
    segment_size: int = 64 * 1024 * 1024,
    seed: int = 1,
    start_ms: int = 1_700_000_000_000,
    spacing_ms: int = 1,
    archive: bool = False,
) -> Counter:
    """Write ``count`` messages to queue ``queue``; returns how many ended in each state."""
    rng = random.Random(seed)
    store = QueueStore.for_queue(Path(data_dir), vhost, queue, archive=archive, segment_size=segment_size)
    store.recover()
    states: Counter = Counter()
    templates = [_template(i) for i in range(8)]
    seq = store.next_seq
    try:
        for block_start in range(0, count, _BLOCK):
            block = []
            for i in range(block_start, min(count, block_start + _BLOCK)):
                published = start_ms + i * spacing_ms
                key = ROUTING_KEYS[rng.randrange(len(ROUTING_KEYS))]
                body = ('{"id": %d, "customer": "c%05d", "amount": %d.%02d, "note": "%s"}' % (
                    i, rng.randrange(100000), rng.randrange(1000), rng.randrange(100), "x" * rng.randrange(40))
                ).encode()
                props = _with_headers(templates[i % len(templates)], i, key)
                store.append_message(seq, published, "amq.topic", key, props, body)
                block.append((seq, published))
                seq += 1
            for s, published in block:
                states[_write_fate(store, rng, s, published)] += 1
            store.flush()
    finally:
        store.close()
    return states


def write_synthetic_stream(
    data_dir: str | Path,
    stream: str,
    count: int,
    *,
    vhost: str = "/",
    body_bytes: int | None = None,
    seed: int = 1,
    start_ms: int = 1_700_000_000_000,
    spacing_ms: int = 1,
) -> None:
    """Write ``count`` messages to the stream ``stream`` through the broker's own StreamLog: the
    messages of ``write_synthetic_queue`` (same routing keys, properties and bodies, bodies padded
    or cut to ``body_bytes`` if given), each timestamped ``spacing_ms`` after the one before."""
    from persistence.stream_log import StreamLog

    rng = random.Random(seed)
    log = StreamLog.open_in(Path(data_dir), vhost, stream)
    templates = [_template(i) for i in range(8)]
    try:
        for i in range(count):
            key = ROUTING_KEYS[rng.randrange(len(ROUTING_KEYS))]
            body = ('{"id": %d, "customer": "c%05d", "amount": %d.%02d, "note": "%s"}' % (
                i, rng.randrange(100000), rng.randrange(1000), rng.randrange(100), "x" * rng.randrange(40))
            ).encode()
            if body_bytes is not None:
                body = body[:body_bytes].ljust(body_bytes, b" ")
            log.append("amq.topic", key, _with_headers(templates[i % len(templates)], i, key), body,
                       timestamp_ms=start_ms + i * spacing_ms)
            if i % 10_000 == 9_999:
                log.sync_now()
    finally:
        log.close()


def _write_fate(store: QueueStore, rng: random.Random, seq: int, published: int) -> str:
    roll = rng.random()
    at = published + 50
    if roll < 0.60:
        store.append_state(seq, "delivered", at, delivery_count=1)
        store.append_state(seq, "acked", at + 5)
        return "acked"
    if roll < 0.65:
        store.append_state(seq, "delivered", at, delivery_count=1)
        return "unacked"
    if roll < 0.70:
        store.append_state(seq, "delivered", at, delivery_count=1)
        store.append_state(seq, "dead_lettered", at + 5, reason="rejected")
        return "dead_lettered"
    if roll < 0.73:
        store.append_state(seq, "delivered", at, delivery_count=1)
        store.append_state(seq, "requeued", at + 5, delivery_count=1)
    return "ready"


def _template(i: int) -> tuple[str, int]:
    return ("application/json", i % 10)


def _with_headers(template: tuple[str, int], i: int, key: str) -> bytes:
    content_type, priority = template
    return raw_properties(commands.Basic.Properties(
        content_type=content_type,
        delivery_mode=2,
        priority=priority,
        headers={"x-tenant": f"t{i % 7}", "x-trace": f"trace-{i:08d}", "x-attempt": i % 3},
        message_id=f"m-{i}",
        app_id="synthetic",
        timestamp=None,
        expiration="60000" if i % 5 == 0 else None,
    ))
