"""The topic exchange: wildcard patterns over dot-separated routing keys.

Routing consults a TopicTrie (see topic_trie.py) and remembers recent answers:
real traffic repeats a small set of routing keys, so a bounded routing_key ->
destinations cache skips most trie walks. Any bind or unbind empties the cache.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from .exchange import Exchange
from .topic_trie import TopicTrie

#: Routing keys remembered per exchange; the oldest entry is evicted first.
DEFAULT_CACHE_SIZE = 4096


class TopicExchange(Exchange):
    """Routes by topic pattern, with a per-exchange cache of recent routing results."""

    type_name = "topic"

    def __init__(self, name: str, *, cache_size: int = DEFAULT_CACHE_SIZE, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._trie = TopicTrie()
        self._cache: dict[str, set[Hashable]] = {}
        self._cache_size = cache_size

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        """See Exchange.route. The returned set is shared with the cache: do not modify it.

        It stays valid after later binds and unbinds (they replace the cache, not its sets).
        """
        cache = self._cache
        found = cache.get(routing_key)
        if found is None:
            found = self._trie.match(routing_key)
            if self._cache_size > 0:
                if len(cache) >= self._cache_size:
                    del cache[next(iter(cache))]  # dicts keep insertion order: this is the oldest
                cache[routing_key] = found
        return found

    def _index_add(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        self._trie.add(routing_key, destination)
        self._cache = {}

    def _index_remove(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        self._trie.remove(routing_key, destination)
        self._cache = {}
