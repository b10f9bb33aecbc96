"""The hot path with and without policies: route + enqueue + deliver, per message, in one process.

Run: python bench/policy_hot_path_microbench.py [SOURCE_TREE] [--policies N]
(SOURCE_TREE: the repository whose code to measure, default this one; about 5 s.)

A vhost with one direct exchange bound to one queue with a no-ack consumer: each message is
routed (VirtualHost.route), published to the queue and delivered at once, as a publish with a
consumer waiting is on the broker. `--policies N` (a tree that has policies) sets N policies
whose patterns match nothing and one that matches the queue with a key that changes nothing
(queue-version), to show that what a policy costs is paid when it is set, not per message.
Times are this process's CPU time (time.process_time), the minimum and median of 5 rounds of
200,000 messages; on a shared machine, compare trees in alternating runs, not figures from
different moments.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time

MESSAGES = 200_000
ROUNDS = 5


class CountingSink:
    """A channel stand-in that takes every delivery."""

    def __init__(self) -> None:
        self.delivered = 0

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer: object, entry: object) -> None:
        self.delivered += 1

    def consumer_cancelled(self, consumer: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tree", nargs="?", default=".")
    parser.add_argument("--policies", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    from amqp_server.broker.vhost import VirtualHost
    from queues.consumer import Consumer
    from queues.message import Message

    vhost = VirtualHost("/")
    if args.policies:
        from amqp_server.broker.policies import parse_policy

        for number in range(args.policies):
            vhost.set_policy(parse_policy("/", f"p{number}", {
                "pattern": f"^nomatch-{number}$", "definition": {"max-length": 10}, "priority": number}))
        vhost.set_policy(parse_policy("/", "every-queue", {
            "pattern": ".*", "definition": {"queue-version": 2}, "apply-to": "queues", "priority": -1}))
    exchange = vhost.declare_exchange("work", "direct")
    queue, _ = vhost.declare_queue("jobs", connection=None)
    vhost.bind(exchange, queue, "job", {})
    sink = CountingSink()
    queue.add_consumer(Consumer("c", queue, sink, no_ack=True))
    header = struct.pack(">HHQH", 60, 0, 100, 0)
    body = b"x" * 100
    costs = []
    for _round in range(ROUNDS):
        messages = [Message("work", "job", header, body) for _ in range(MESSAGES)]
        route = vhost.route
        start = time.process_time()  # this process's CPU time: less disturbed by a loaded machine
        for message in messages:
            for target in route(exchange, message):
                target.publish(message)
        costs.append((time.process_time() - start) / MESSAGES * 1e9)
    assert sink.delivered == MESSAGES * ROUNDS
    print(f"{args.tree} policies={args.policies}: min {min(costs):.0f}, median {statistics.median(costs):.0f} "
          f"ns/message of CPU (rounds: {', '.join(f'{cost:.0f}' for cost in costs)})")


if __name__ == "__main__":
    main()
