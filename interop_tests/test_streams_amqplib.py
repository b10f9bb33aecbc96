"""A stream queue through amqplib (Node.js), as RabbitMQ 3.10.8 answers it.

The scenario is interop_tests/node/stream_offsets.js; it prints its observations as JSON and the
assertions live here. Running this file with INTEROP_BROKER_URL checks it against RabbitMQ itself.
"""

from __future__ import annotations

from interop_tests.node_runner import run_scenario


def deliveries(bodies_and_offsets: list[tuple[str, int]]) -> list[dict]:
    return [{"body": body, "offset": offset, "offsetType": "number", "redelivered": False}
            for body, offset in bodies_and_offsets]


def test_a_stream_read_from_offsets_and_its_refusals(broker) -> None:
    report = run_scenario("stream_offsets.js", broker.url())
    queue = report["queue"]
    stored = [(f"m{index}", index) for index in range(10)]

    assert report["declared"] == report["again"] == {"queue": queue, "messageCount": 0, "consumerCount": 0}
    assert report["confirmed"] == [body for body, _ in stored]  # every publish acked, none nacked
    assert report["fromFirst"] == deliveries(stored)
    assert report["fromFour"] == deliveries(stored[4:])  # prefetch 2: each ack returned the credit
    assert report["fromLast"] == deliveries(stored[9:])
    assert report["fromPast"] == deliveries(stored)  # a timestamp of 2000-01-01
    assert report["fromInterval"] == deliveries(stored)  # "1h"
    assert report["fromTail"] == deliveries([("n0", 10), ("n1", 11)])  # no offset: next

    prefetch_text = f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{queue}' in vhost '/''"
    assert report["noPrefetch"]["code"] == report["noPrefetchEvent"]["code"] == 406
    assert report["noPrefetchEvent"]["message"] == (
        f'Channel closed by server: 406 (PRECONDITION-FAILED) with message "{prefetch_text}"')
    assert report["get"]["closeCode"] == 540
    assert report["get"]["closeMessage"] == (
        "Connection closed: 540 (NOT-IMPLEMENTED) with message "
        f"\"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{queue}' in vhost '/'\"")
    assert report["noAck"]["closeCode"] == 540
    assert report["noAck"]["closeMessage"] == (
        "Connection closed: 540 (NOT-IMPLEMENTED) with message "
        f"\"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '{queue}' in vhost '/'\"")
    assert report["deleted"] == {"messageCount": 0}
