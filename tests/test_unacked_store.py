"""UnackedStore: a channel's unacked deliveries by tag, taken singly or `multiple` up to a tag."""

from __future__ import annotations

from amqp_server.channel.unacked_store import Unacked, UnackedStore


def _store(tags: list[int]) -> UnackedStore:
    store = UnackedStore()
    for tag in tags:
        store.add(tag, Unacked(f"entry-{tag}", "queue", None))  # type: ignore[arg-type]
    return store


def test_multiple_takes_every_tag_up_to_it_oldest_first_and_leaves_the_rest():
    store = _store([1, 2, 3, 4, 5, 6])
    assert store.pop(3).entry == "entry-3"  # acked singly before
    taken = store.pop_up_to(5)
    assert [unacked.entry for unacked in taken] == ["entry-1", "entry-2", "entry-4", "entry-5"]
    assert len(store) == 1 and 6 in store and 5 not in store


def test_multiple_below_the_oldest_tag_takes_nothing_and_tag_zero_takes_all():
    store = _store([10, 11, 12])
    assert store.pop_up_to(9) == []
    assert len(store) == 3
    assert [unacked.entry for unacked in store.pop_up_to(0)] == ["entry-10", "entry-11", "entry-12"]
    assert len(store) == 0


def test_multiple_past_the_newest_tag_takes_all_and_the_store_goes_on_after():
    store = _store([1, 2])
    assert len(store.pop_up_to(100)) == 2
    store.add(3, Unacked("entry-3", "queue", None))  # type: ignore[arg-type]
    assert [unacked.entry for unacked in store.pop_up_to(3)] == ["entry-3"]
