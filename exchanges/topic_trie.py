"""A trie of topic binding patterns, matched against routing keys.

Keys and patterns are split into words on '.'. As in RabbitMQ the empty string
has no words, while "." has two empty ones. In a pattern ``*`` matches exactly
one word and ``#`` zero or more. Matching walks the trie once per key word,
following the literal child, the ``*`` child and the ``#`` child; a ``#`` node
is tried at each number of words it could swallow. Every (``#`` node, position)
state is expanded at most once, so cost is bounded by nodes x words even for
patterns like "#.a.#.a.#".
"""

from __future__ import annotations

from collections.abc import Hashable

from .destination_counts import add_destination, remove_destination


def split_words(key: str) -> list[str]:
    """RabbitMQ's split: "" -> [], "a..b" -> ["a", "", "b"]."""
    return key.split(".") if key else []


def _pattern_words(pattern: str) -> list[str]:
    # "#.#" matches exactly what "#" matches; collapsing runs keeps the trie small.
    words: list[str] = []
    for word in split_words(pattern):
        if word != "#" or not words or words[-1] != "#":
            words.append(word)
    return words


class _Node:
    __slots__ = ("words", "star", "hash", "destinations")

    def __init__(self) -> None:
        self.words: dict[str, _Node] = {}  # literal word -> child
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.destinations: dict[Hashable, int] = {}  # bindings ending here

    def child(self, word: str) -> _Node | None:
        if word == "*":
            return self.star
        if word == "#":
            return self.hash
        return self.words.get(word)

    def add_child(self, word: str) -> _Node:
        node = self.child(word)
        if node is None:
            node = _Node()
            if word == "*":
                self.star = node
            elif word == "#":
                self.hash = node
            else:
                self.words[word] = node
        return node

    def drop_child(self, word: str) -> None:
        if word == "*":
            self.star = None
        elif word == "#":
            self.hash = None
        else:
            del self.words[word]

    def is_empty(self) -> bool:
        return not (self.words or self.destinations) and self.star is None and self.hash is None


class TopicTrie:
    """Patterns -> destinations, with reference counts so one destination may be bound many times."""

    def __init__(self) -> None:
        self._root = _Node()

    def add(self, pattern: str, destination: Hashable) -> None:
        node = self._root
        for word in _pattern_words(pattern):
            node = node.add_child(word)
        add_destination(node.destinations, destination)

    def remove(self, pattern: str, destination: Hashable) -> None:
        """Remove one reference added by ``add``; nodes left empty are pruned."""
        path = [(self._root, "")]
        for word in _pattern_words(pattern):
            path.append((path[-1][0].child(word), word))  # type: ignore[arg-type]
        remove_destination(path[-1][0].destinations, destination)
        for (parent, _), (node, word) in zip(reversed(path[:-1]), reversed(path[1:])):
            if not node.is_empty():
                break
            parent.drop_child(word)

    def match(self, routing_key: str) -> set[Hashable]:
        """Every destination with a pattern matching ``routing_key``, each once."""
        words = split_words(routing_key)
        end = len(words)
        found: set[Hashable] = set()
        expanded: set[tuple[_Node, int]] = set()
        stack = [(self._root, 0)]
        while stack:
            node, position = stack.pop()
            hash_node = node.hash
            if hash_node is not None:
                for swallowed_to in range(position, end + 1):
                    state = (hash_node, swallowed_to)
                    if state not in expanded:
                        expanded.add(state)
                        stack.append(state)
            if position == end:
                if node.destinations:
                    found.update(node.destinations)
                continue
            literal = node.words.get(words[position])
            if literal is not None:
                stack.append((literal, position + 1))
            if node.star is not None:
                stack.append((node.star, position + 1))
        return found
