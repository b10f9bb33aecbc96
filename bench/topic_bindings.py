"""The topic scenario's bindings and routing keys: a fixed, seeded mix of exact and wildcard patterns.

Keys look like `r3.s17.e42` (10 regions x 20 services x 50 events = 10,000 possible
keys). Bindings mix, in these proportions: exact keys 60%, `rA.sB.*` 20%,
`*.sB.eC` 15%, `rA.*.eC` 4%, `#.eC` 1%. Published keys are drawn half from the
exactly-bound keys and half at random, so a message typically reaches one or
two queues: selective routing, not a disguised fanout.
"""

from __future__ import annotations

import random
import re

REGIONS, SERVICES, EVENTS = 10, 20, 50
_MIX = (("exact", 0.60), ("rs*", 0.20), ("*se", 0.15), ("r*e", 0.04), ("#e", 0.01))


def _random_key(rng: random.Random) -> str:
    return f"r{rng.randrange(REGIONS)}.s{rng.randrange(SERVICES)}.e{rng.randrange(EVENTS)}"


def _pattern(kind: str, rng: random.Random) -> str:
    r, s, e = rng.randrange(REGIONS), rng.randrange(SERVICES), rng.randrange(EVENTS)
    return {
        "exact": f"r{r}.s{s}.e{e}",
        "rs*": f"r{r}.s{s}.*",
        "*se": f"*.s{s}.e{e}",
        "r*e": f"r{r}.*.e{e}",
        "#e": f"#.e{e}",
    }[kind]


def make_bindings(count: int, queues: int, seed: int = 7) -> list[tuple[int, str]]:
    """`count` distinct (queue index, binding pattern) pairs."""
    rng = random.Random(seed)
    bindings: list[tuple[int, str]] = []
    seen: set[tuple[int, str]] = set()
    for kind, share in _MIX:
        want = round(count * share) if kind != _MIX[-1][0] else count - len(bindings)
        made = 0
        while made < want:
            pair = (rng.randrange(queues), _pattern(kind, rng))
            if pair not in seen:
                seen.add(pair)
                bindings.append(pair)
                made += 1
    return bindings


def make_keys(bindings: list[tuple[int, str]], count: int = 1000, seed: int = 11) -> list[str]:
    """Routing keys to publish with, cycling: half exactly-bound keys, half random keys."""
    rng = random.Random(seed)
    exact = sorted({p for _, p in bindings if "*" not in p and "#" not in p})
    return [rng.choice(exact) if i % 2 == 0 and exact else _random_key(rng) for i in range(count)]


def _regex(pattern: str) -> re.Pattern:
    # Matched against "." + key, so every word, '#' included, can own its leading dot.
    parts = []
    for word in pattern.split("."):
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + re.escape(word))
    return re.compile("".join(parts) + r"\Z")


def queues_matched(bindings: list[tuple[int, str]], keys: list[str]) -> list[int]:
    """For each key, how many distinct queues a broker routes it to (AMQP topic semantics)."""
    compiled = [(q, _regex(p)) for q, p in bindings]
    return [len({q for q, rx in compiled if rx.match("." + key)}) for key in keys]
