"""Topic exchange: RabbitMQ's pattern semantics, the trie index and its cache."""

import random
from functools import lru_cache

import pytest

from exchanges import TopicExchange

# Edge cases, each checked against RabbitMQ 3.10.
CASES = [
    # (pattern, routing key, matches)
    ("a.b", "a.b", True),
    ("a.b", "a.c", False),
    ("*", "a", True),
    ("*", "", False),          # "" has no words
    ("*", "a.b", False),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("", "", True),
    ("", ".", False),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "a", True),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.c", False),
    ("a.*.b", "a.b", False),
    ("a.*.b", "a..b", True),   # empty words are words
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    (".", ".", True),
    ("*.*", ".", True),
    ("*", ".", False),
    ("a.", "a", False),
    ("a.*", "a.", True),
    ("#.*", "", False),
    ("*.#", "a", True),
    ("#.*.#", "a", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("#.b.#", "a.b.c", True),
    ("a.b", "a.b.", False),
]


@pytest.mark.parametrize("pattern,key,matches", CASES)
def test_pattern_against_key(pattern, key, matches):
    exchange = TopicExchange("t")
    exchange.bind("q", pattern, None)
    assert (set(exchange.route(key, None)) == {"q"}) is matches


# For each routing key, the patterns RabbitMQ 3.10 matched when every pattern
# below was bound to its own queue (recorded with pika against a live broker).
PATTERNS = ["", "#", "*", "#.#", "*.*", "a.#", "#.a", "a.#.b", "a.*", "*.a", "#.*", "*.#", ".", "a.",
            ".a", "a..b", "a.*.b", "#.#.a", "a.#.#", "#.*.#", "*.#.*", "a", "*.*.*", "a.#.*", "#.b.#",
            "..", "*.", ".*", "#.", ".#", "a.#.#.b", "#.a.#"]
RABBITMQ_MATCHES = {
    "": ["", "#", "#.#"],
    ".": ["#", "#.", "#.#", "#.*", "#.*.#", "*.", "*.#", "*.#.*", "*.*", ".", ".#", ".*"],
    "a": ["#", "#.#", "#.#.a", "#.*", "#.*.#", "#.a", "#.a.#", "*", "*.#", "a", "a.#", "a.#.#"],
    "a.b": ["#", "#.#", "#.*", "#.*.#", "#.a.#", "#.b.#", "*.#", "*.#.*", "*.*", "a.#", "a.#.#", "a.#.#.b", "a.#.*", "a.#.b", "a.*"],
    "a..b": ["#", "#.#", "#.*", "#.*.#", "#.a.#", "#.b.#", "*.#", "*.#.*", "*.*.*", "a.#", "a.#.#", "a.#.#.b", "a.#.*", "a.#.b", "a.*.b", "a..b"],
    "a.": ["#", "#.", "#.#", "#.*", "#.*.#", "#.a.#", "*.", "*.#", "*.#.*", "*.*", "a.", "a.#", "a.#.#", "a.#.*", "a.*"],
    ".a": ["#", "#.#", "#.#.a", "#.*", "#.*.#", "#.a", "#.a.#", "*.#", "*.#.*", "*.*", "*.a", ".#", ".*", ".a"],
    "..": ["#", "#.", "#.#", "#.*", "#.*.#", "*.#", "*.#.*", "*.*.*", ".#", ".."],
    "a.b.c": ["#", "#.#", "#.*", "#.*.#", "#.a.#", "#.b.#", "*.#", "*.#.*", "*.*.*", "a.#", "a.#.#", "a.#.*"],
    "a.x.b": ["#", "#.#", "#.*", "#.*.#", "#.a.#", "#.b.#", "*.#", "*.#.*", "*.*.*", "a.#", "a.#.#", "a.#.#.b", "a.#.*", "a.#.b", "a.*.b"],
    "a.x.y.b": ["#", "#.#", "#.*", "#.*.#", "#.a.#", "#.b.#", "*.#", "*.#.*", "a.#", "a.#.#", "a.#.#.b", "a.#.*", "a.#.b"],
    "b": ["#", "#.#", "#.*", "#.*.#", "#.b.#", "*", "*.#"],
    "x.a": ["#", "#.#", "#.#.a", "#.*", "#.*.#", "#.a", "#.a.#", "*.#", "*.#.*", "*.*", "*.a"],
    "a.a": ["#", "#.#", "#.#.a", "#.*", "#.*.#", "#.a", "#.a.#", "*.#", "*.#.*", "*.*", "*.a", "a.#", "a.#.#", "a.#.*", "a.*"],
    "b.a.b": ["#", "#.#", "#.*", "#.*.#", "#.a.#", "#.b.#", "*.#", "*.#.*", "*.*.*"],
    "...": ["#", "#.", "#.#", "#.*", "#.*.#", "*.#", "*.#.*", ".#"],
    "a.b.b": ["#", "#.#", "#.*", "#.*.#", "#.a.#", "#.b.#", "*.#", "*.#.*", "*.*.*", "a.#", "a.#.#", "a.#.#.b", "a.#.*", "a.#.b", "a.*.b"],
    "x.b.y": ["#", "#.#", "#.*", "#.*.#", "#.b.#", "*.#", "*.#.*", "*.*.*"],
}


def test_matches_what_rabbitmq_routes():
    exchange = TopicExchange("t")
    for pattern in PATTERNS:
        exchange.bind(pattern, pattern, None)  # each pattern is its own destination
    for key, expected in RABBITMQ_MATCHES.items():
        assert set(exchange.route(key, None)) == set(expected), key


def reference_match(pattern: str, key: str) -> bool:
    """Straightforward recursive matcher, the executable form of the spec."""
    @lru_cache(maxsize=None)
    def match(p: tuple, k: tuple) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return match(p[1:], k) or (bool(k) and match(p, k[1:]))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    def words(s: str) -> tuple:
        return tuple(s.split(".")) if s else ()
    return match(words(pattern), words(key))


def test_reference_matcher_agrees_with_rabbitmq():
    for key, expected in RABBITMQ_MATCHES.items():
        assert {p for p in PATTERNS if reference_match(p, key)} == set(expected), key


def _random_words(rng: random.Random, alphabet: list, max_len: int) -> str:
    return ".".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len)))


def test_trie_agrees_with_reference_on_random_patterns_and_keys():
    rng = random.Random(20240611)
    for _ in range(30):
        patterns = {_random_words(rng, ["a", "b", "", "*", "#"], 5) for _ in range(60)}
        exchange = TopicExchange("t", cache_size=8)
        for pattern in patterns:
            exchange.bind(pattern, pattern, None)
        # Drop some bindings again so pruning is exercised too.
        for pattern in rng.sample(sorted(patterns), len(patterns) // 3):
            exchange.unbind(pattern, pattern, None)
            patterns.discard(pattern)
        for _ in range(80):
            key = _random_words(rng, ["a", "b", "", "c", "*", "#"], 6)
            expected = {p for p in patterns if reference_match(p, key)}
            assert set(exchange.route(key, None)) == expected, key


def test_destination_bound_by_several_patterns_is_routed_once():
    exchange = TopicExchange("t")
    for pattern in ("a.*", "#", "a.b", "*.b"):
        exchange.bind("q", pattern, None)
    assert list(exchange.route("a.b", None)) == ["q"]


def test_unbinding_one_of_two_matching_patterns_keeps_the_destination():
    exchange = TopicExchange("t")
    exchange.bind("q", "a.#", None)
    exchange.bind("q", "#.b", None)
    exchange.unbind("q", "a.#", None)
    assert set(exchange.route("a.b", None)) == {"q"}
    assert set(exchange.route("a.c", None)) == set()


def test_same_pattern_with_different_arguments_needs_both_unbound():
    exchange = TopicExchange("t")
    exchange.bind("q", "a.*", None)
    exchange.bind("q", "a.*", {"x": 1})
    exchange.unbind("q", "a.*", None)
    assert set(exchange.route("a.b", None)) == {"q"}
    exchange.unbind("q", "a.*", {"x": 1})
    assert set(exchange.route("a.b", None)) == set()


def test_equivalent_hash_patterns_are_separate_bindings():
    exchange = TopicExchange("t")
    exchange.bind("q", "#", None)
    exchange.bind("q", "#.#", None)
    assert exchange.binding_count() == 2
    exchange.unbind("q", "#.#", None)
    assert set(exchange.route("x.y", None)) == {"q"}
    exchange.unbind("q", "#", None)
    assert set(exchange.route("x.y", None)) == set()


def test_cache_is_invalidated_by_bind_unbind_and_destination_removal():
    exchange = TopicExchange("t")
    exchange.bind("q1", "a.*", None)
    assert set(exchange.route("a.b", None)) == {"q1"}
    exchange.bind("q2", "#", None)
    assert set(exchange.route("a.b", None)) == {"q1", "q2"}
    exchange.unbind("q1", "a.*", None)
    assert set(exchange.route("a.b", None)) == {"q2"}
    exchange.unbind_destination("q2")
    assert set(exchange.route("a.b", None)) == set()


def test_results_returned_earlier_do_not_change_after_rebinding():
    exchange = TopicExchange("t")
    exchange.bind("q1", "a", None)
    before = exchange.route("a", None)
    exchange.bind("q2", "a", None)
    assert set(before) == {"q1"}
    assert set(exchange.route("a", None)) == {"q1", "q2"}


def test_cache_stays_bounded_and_correct_when_keys_exceed_it():
    exchange = TopicExchange("t", cache_size=4)
    exchange.bind("q", "k.*", None)
    for round_ in range(3):
        for i in range(10):
            assert set(exchange.route(f"k.{i}", None)) == {"q"}
            assert set(exchange.route(f"x.{i}", None)) == set()
    assert len(exchange._cache) <= 4


def test_pathological_hash_patterns_stay_fast():
    exchange = TopicExchange("t", cache_size=0)
    exchange.bind("q", "#.a.#.a.#.a.#.a.#.b", None)
    key = ".".join(["a"] * 120)
    assert set(exchange.route(key, None)) == set()  # would take ages with naive backtracking
    assert set(exchange.route(key + ".b", None)) == {"q"}


def test_headers_are_ignored():
    exchange = TopicExchange("t")
    exchange.bind("q", "a", None)
    assert set(exchange.route("a", {"x": 1})) == {"q"}
    assert TopicExchange.needs_headers is False
