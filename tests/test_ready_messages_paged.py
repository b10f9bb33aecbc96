"""ReadyMessages with paged-out runs: messages taken out of the middle (they expired) are never
handed out, everything else comes out in queue order, and the counts stay true."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from queues.message import Message, QueueEntry, content_header
from queues import ready_messages
from queues.ready_messages import ReadyMessages

PROPS = b"\x00\x00"


def entry_for(seq: int) -> QueueEntry:
    body = b"x" * (seq % 7)
    return QueueEntry(Message("", "q", content_header(len(body), PROPS), body), seq)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.just(0)),
        st.tuples(st.just("append_paged"), st.just(0)),
        st.tuples(st.just("take"), st.integers(0, 60)),
        st.tuples(st.just("pop"), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_taken_messages_never_come_out_and_the_rest_keep_their_order(ops):
    ready = ReadyMessages(loader=lambda seq, _count: entry_for(seq))
    model: list[int] = []  # seqs still ready, in queue order
    next_seq = 1
    for op, arg in ops:
        if op == "append":
            ready.append(entry_for(next_seq))
            model.append(next_seq)
            next_seq += 1
        elif op == "append_paged":
            ready.append_paged(next_seq, 0, next_seq % 7)
            model.append(next_seq)
            next_seq += 1
        elif op == "take":
            taken = ready.take_paged(arg)
            if taken is not None:
                assert arg in model
                model.remove(arg)
                assert taken.seq == arg
        elif op == "pop" and model:
            assert ready.pop().seq == model.pop(0)
        assert len(ready) == len(model)
        assert ready.bytes == sum(seq % 7 for seq in model)
    assert [entry.seq for entry in ready.peek(len(model) + 1)] == model
    assert [ready.pop().seq for _ in range(len(model))] == model
    assert not ready
    assert_shared_structures_empty()


def assert_shared_structures_empty() -> None:
    """The empty structures every new ReadyMessages shares were never added to."""
    assert not ready_messages._NO_MESSAGES
    assert not ready_messages._NO_RUNS
    assert not ready_messages._NO_RETURNED
    assert not ready_messages._NOTHING_TAKEN


def test_taking_every_message_of_a_run_in_order_leaves_nothing_behind():
    ready = ReadyMessages(loader=lambda seq, _count: entry_for(seq))
    for seq in range(1, 1001):
        ready.append_paged(seq, 0, 10)
    for seq in range(1, 1001):
        assert ready.take_paged(seq).seq == seq
    assert len(ready) == 0 and ready.bytes == 0
    assert not ready._taken, "expired in queue order, nothing needs remembering"


def test_no_ready_list_changes_the_empty_structures_they_share():
    for _round in range(2):  # the second round starts from what clear() left
        ready = ReadyMessages(loader=lambda seq, _count: entry_for(seq))
        assert not ready.peek(5) and not ready.in_memory_entries()
        try:
            ready.pop()
        except IndexError:
            pass
        assert ready.take_paged(1) is None
        entries = [entry_for(seq) for seq in range(1, 4)]
        for entry in entries:
            ready.append(entry)
        ready.append_paged(4, 0, 4)
        ready.page(entry_for(5))
        ready.append_paged(6, 0, 6)
        assert ready.take_paged(6).seq == 6  # a run's first
        ready.append_paged(7, 0, 0)
        ready.append_paged(8, 0, 1)
        assert ready.take_paged(8).seq == 8  # from the middle of its run: remembered
        first = ready.pop()
        ready.put_back(first)
        ready.remove(entries[1])  # it expired
        assert [entry.seq for entry in ready.peek(10)] == [1, 3, 4, 5, 7]
        assert [ready.pop().seq for _ in range(5)] == [1, 3, 4, 5, 7]
        ready.append(entry_for(9))
        ready.put_back(ready.pop())
        assert ready.clear() == 1
        assert_shared_structures_empty()
    ready = ReadyMessages()
    ready.append(entry_for(1))
    assert ready.close() == 1
    assert_shared_structures_empty()
