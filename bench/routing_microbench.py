"""Routes per second of each exchange type, with realistic binding counts.

Run: python bench/routing_microbench.py   (from the repo root; about 10 s)

Topic is measured twice over 10,000 mixed bindings: with the routing cache
(traffic repeats 200 keys) and without it (cache disabled, every key walks the
trie). Each line also reports how many destinations an average route returned.
"""

from __future__ import annotations

import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exchanges import DirectExchange, FanoutExchange, HeadersExchange, TopicExchange  # noqa: E402

SECONDS_PER_CASE = 1.0
SERVICES = [f"svc{i}" for i in range(100)]
REGIONS = [f"region{i}" for i in range(20)]
EVENTS = ["created", "updated", "deleted", "error", "audit"]


def measure(label: str, route, messages: list) -> None:
    done = destinations = 0
    start = time.perf_counter()
    deadline = start + SECONDS_PER_CASE
    while time.perf_counter() < deadline:
        for key, headers in messages:
            destinations += len(route(key, headers))
        done += len(messages)
    elapsed = time.perf_counter() - start
    print(f"{label:<52} {done / elapsed:>12,.0f} routes/s   {destinations / done:6.1f} destinations/route")


def topic_patterns(rng: random.Random, count: int) -> list[str]:
    """Exact keys, single-word wildcards and multi-word wildcards, roughly 50/30/20."""
    shapes = [
        lambda: f"{rng.choice(SERVICES)}.{rng.choice(REGIONS)}.{rng.choice(EVENTS)}",
        lambda: f"{rng.choice(SERVICES)}.{rng.choice(REGIONS)}.{rng.choice(EVENTS)}.{rng.randrange(1000)}",
        lambda: f"{rng.choice(SERVICES)}.*.{rng.choice(EVENTS)}",
        lambda: f"*.{rng.choice(REGIONS)}.{rng.choice(EVENTS)}",
        lambda: f"{rng.choice(SERVICES)}.{rng.choice(REGIONS)}.#",
        lambda: f"#.{rng.choice(EVENTS)}.{rng.randrange(1000)}",
        lambda: f"{rng.choice(SERVICES)}.#.{rng.choice(EVENTS)}",
    ]
    weights = [30, 20, 15, 15, 8, 6, 6]
    patterns: set[str] = set()
    while len(patterns) < count:
        patterns.add(rng.choices(shapes, weights)[0]())
    return sorted(patterns)


def topic_keys(rng: random.Random, count: int) -> list[str]:
    return [f"{rng.choice(SERVICES)}.{rng.choice(REGIONS)}.{rng.choice(EVENTS)}" for _ in range(count)]


def main() -> None:
    rng = random.Random(1)
    print(f"python {sys.version.split()[0]}, {SECONDS_PER_CASE:.0f} s per case")

    patterns = topic_patterns(rng, 10_000)
    for cache_size, label, distinct_keys in ((4096, "topic, 10,000 bindings, cache hits (200 keys)", 200),
                                             (0, "topic, 10,000 bindings, no cache", 5000)):
        topic = TopicExchange("bench.topic", cache_size=cache_size)
        for i, pattern in enumerate(patterns):
            topic.bind(f"queue{i}", pattern, None)
        measure(label, topic.route, [(key, None) for key in topic_keys(rng, distinct_keys)])

    direct = DirectExchange("bench.direct")
    keys = [f"{rng.choice(SERVICES)}.key{i}" for i in range(10_000)]
    for i, key in enumerate(keys):
        direct.bind(f"queue{i}", key, None)
    measure("direct, 10,000 bindings", direct.route, [(rng.choice(keys), None) for _ in range(1000)])

    fanout = FanoutExchange("bench.fanout")
    for i in range(10):
        fanout.bind(f"queue{i}", "", None)
    measure("fanout, 10 bindings", fanout.route, [("", None)] * 1000)

    for count in (10, 100):
        headers = HeadersExchange("bench.headers")
        for i in range(count):
            mode = "all" if i % 2 else "any"
            headers.bind(f"queue{i}", "", {"x-match": mode, "service": rng.choice(SERVICES),
                                           "event": rng.choice(EVENTS)})
        messages = [("", {"service": rng.choice(SERVICES), "event": rng.choice(EVENTS), "n": 1})
                    for _ in range(1000)]
        measure(f"headers, {count} bindings (2 keys each)", headers.route, messages)


if __name__ == "__main__":
    main()
