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


def test_a_run_of_deliveries_gets_consecutive_tags_after_those_held():
    store = _store([1, 2])
    store.add_run(3, (Unacked(f"entry-{tag}", "queue", None) for tag in range(3, 8)))  # type: ignore[arg-type]
    assert store.pop(5).entry == "entry-5"
    assert [unacked.entry for unacked in store.pop_up_to(6)] == ["entry-1", "entry-2", "entry-3", "entry-4", "entry-6"]
    assert [tag for tag, _ in store.items()] == [7]


def test_multiple_over_many_gaps_takes_exactly_the_tags_up_to_it():
    store = _store(list(range(1, 200)))
    for tag in range(2, 200, 3):
        store.pop(tag)
    kept = [tag for tag, _ in store.items()]
    taken = store.pop_up_to(150)
    assert [unacked.entry for unacked in taken] == [f"entry-{tag}" for tag in kept if tag <= 150]
    assert [tag for tag, _ in store.items()] == [tag for tag in kept if tag > 150]
