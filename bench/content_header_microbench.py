"""What the content header check costs per publish, for the headers clients really send.

Run: python bench/content_header_microbench.py        (from the repo root; a few seconds)

Each case is a content header as a client library encodes it (pamqp, which aio-pika uses; pika
and kombu produce the same bytes for these). The check runs once per publish, on the event
loop, before the body is read (amqp_server/wire/codec.py, with the field types of
persistence/properties_format.py). For scale, the "decode" column is what decoding the same
properties with pamqp costs, which the check must stay well below.
"""

from __future__ import annotations

import datetime
import timeit

from pamqp import commands

from amqp_server.wire.codec import check_content_header
from queues.message import content_header, decode_properties

Properties = commands.Basic.Properties
CASES = {
    "no properties (bench's transient publish)": Properties(),
    "delivery_mode=2 (bench's persistent publish)": Properties(delivery_mode=2),
    "pika typical: content_type, delivery_mode, message_id, timestamp": Properties(
        content_type="application/json", delivery_mode=2, message_id="6f1c2a1e-5b0e-4a3c-9d7e-0b4a9f1c2d3e",
        timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)),
    "3 string headers": Properties(headers={"tenant": "acme", "trace-id": "abc123", "kind": "order"}),
    "Celery task message (12 headers, nested)": Properties(
        content_type="application/json", content_encoding="utf-8", delivery_mode=2, priority=0,
        correlation_id="c1", reply_to="r1", headers={
            "lang": "py", "task": "proj.tasks.add", "id": "c1", "shadow": None, "eta": None, "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": "c1",
            "parent_id": None, "argsrepr": "(2, 2)", "kwargsrepr": "{}", "origin": "gen1@host",
            "ignore_result": False}),
    "x-death after two dead-letterings": Properties(headers={"x-death": [
        {"count": 1, "reason": "rejected", "queue": "q", "time": datetime.datetime(2026, 1, 1),
         "exchange": "", "routing-keys": ["q"]},
        {"count": 1, "reason": "expired", "queue": "retry", "time": datetime.datetime(2026, 1, 1),
         "exchange": "", "routing-keys": ["retry"]}]}),
}


def per_call_ns(function, argument, number: int) -> float:
    best = min(timeit.repeat(lambda: function(argument), number=number, repeat=5))
    return best / number * 1e9


def main() -> None:
    print(f"| headers | bytes | check (ns) | pamqp decode (ns) |")
    print("|---|---:|---:|---:|")
    for label, properties in CASES.items():
        raw = properties.marshal()
        header = content_header(100, raw)
        check_ns = per_call_ns(check_content_header, header, 20_000)
        decode_ns = per_call_ns(decode_properties, raw, 2_000)
        print(f"| {label} | {len(header)} | {check_ns:,.0f} | {decode_ns:,.0f} |")


if __name__ == "__main__":
    main()
