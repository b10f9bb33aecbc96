"""PublisherConfirms: which acks and nacks a batch of resolved publishes turns into.

The rule (RabbitMQ's rabbit_channel coalescing): one `multiple` ack covers every acked sequence
number below the smallest one still outstanding or being nacked; the rest go one by one.
"""

from __future__ import annotations

from amqp_server.channel.channel import PublisherConfirms

ACK, NACK = True, False


class FakeQueue:
    """A queue whose storage answers when the test says (Queue.when_stored's contract)."""

    def __init__(self) -> None:
        self.asked: list = []

    def when_stored(self, callback) -> None:
        self.asked.append(callback)


def hold(confirms: PublisherConfirms, seq: int) -> FakeQueue:
    """`seq` waits for a queue to store it (e.g. a persistent message on a durable queue)."""
    queue = FakeQueue()
    confirms.hold_until_stored(seq, [queue])
    return queue


def store(confirms: PublisherConfirms, queue: FakeQueue, ok: bool = True) -> None:
    """`queue` stored what waited for it (or failed to, if not `ok`)."""
    if not queue.asked:
        confirms.ask_stores()
    [callback] = queue.asked
    callback(None if ok else OSError("disk full"))


def published(count: int) -> tuple[PublisherConfirms, list[int]]:
    confirms = PublisherConfirms()
    return confirms, [confirms.take_seq() for _ in range(count)]


def test_sequence_numbers_start_at_1_and_grow():
    _confirms, seqs = published(3)
    assert seqs == [1, 2, 3]


def test_nothing_resolved_sends_nothing():
    confirms, _seqs = published(3)
    assert not confirms.has_pending
    assert confirms.take_frames() == []


def test_one_resolved_publish_is_a_single_ack():
    confirms, seqs = published(1)
    confirms.resolve(seqs[0])
    assert confirms.take_frames() == [(ACK, 1, False)]


def test_a_batch_of_acks_coalesces_into_one_multiple_ack():
    confirms, seqs = published(5)
    for seq in reversed(seqs):  # resolution order does not matter
        confirms.resolve(seq)
    assert confirms.has_pending
    assert confirms.take_frames() == [(ACK, 5, True)]
    assert not confirms.has_pending
    assert confirms.take_frames() == []


def test_a_held_sequence_number_stops_the_multiple_ack_below_it():
    confirms, seqs = published(5)
    hold(confirms, 3)  # e.g. waits for disk
    for seq in (1, 2, 4, 5):
        confirms.resolve(seq)
    assert confirms.take_frames() == [(ACK, 2, True), (ACK, 4, False), (ACK, 5, False)]


def test_releasing_a_held_sequence_number_acks_it():
    confirms, seqs = published(5)
    queue = hold(confirms, 3)
    for seq in (1, 2, 4, 5):
        confirms.resolve(seq)
    confirms.take_frames()
    store(confirms, queue)
    assert confirms.take_frames() == [(ACK, 3, False)]


def test_after_release_later_acks_coalesce_again():
    confirms, _seqs = published(3)
    queue = hold(confirms, 1)
    confirms.resolve(2)
    assert confirms.take_frames() == [(ACK, 2, False)]
    store(confirms, queue)
    confirms.resolve(3)
    # No longer anything outstanding: one multiple ack (re-covering 2 is harmless, as in RabbitMQ).
    assert confirms.take_frames() == [(ACK, 3, True)]


def test_a_held_first_sequence_number_prevents_any_multiple_ack():
    confirms, _seqs = published(3)
    hold(confirms, 1)
    confirms.resolve(2)
    confirms.resolve(3)
    assert confirms.take_frames() == [(ACK, 2, False), (ACK, 3, False)]


def test_a_nack_stops_the_multiple_ack_and_is_sent_on_its_own():
    confirms, _seqs = published(5)
    for seq in (1, 2, 4, 5):
        confirms.resolve(seq)
    confirms.resolve(3, ok=False)
    assert confirms.take_frames() == [(ACK, 2, True), (NACK, 3, False), (ACK, 4, False), (ACK, 5, False)]


def test_a_released_hold_can_be_a_nack():
    confirms, _seqs = published(2)
    queue = hold(confirms, 1)
    confirms.resolve(2)
    confirms.take_frames()
    store(confirms, queue, ok=False)
    assert confirms.take_frames() == [(NACK, 1, False)]


def test_frames_come_out_in_sequence_order():
    confirms, _seqs = published(6)
    hold(confirms, 2)
    confirms.resolve(6)
    confirms.resolve(4, ok=False)
    confirms.resolve(1)
    confirms.resolve(5)
    confirms.resolve(3)
    frames = confirms.take_frames()
    assert [tag for _kind, tag, _multiple in frames] == sorted(tag for _kind, tag, _multiple in frames)
    assert frames == [(ACK, 1, False), (ACK, 3, False), (NACK, 4, False), (ACK, 5, False), (ACK, 6, False)]


def held(confirms: PublisherConfirms, queues: list, accepted: bool = True) -> int:
    seq = confirms.take_seq()
    confirms.hold_until_stored(seq, queues, accepted)
    return seq


def test_publishes_to_the_same_queue_wait_together_and_ask_it_once_after_the_batch():
    released = []
    confirms = PublisherConfirms(lambda: released.append(True))
    queue = FakeQueue()
    for _ in range(3):
        held(confirms, [queue])
    assert queue.asked == []  # asked after the batch's last publish, so one answer covers all
    confirms.ask_stores()
    assert len(queue.asked) == 1
    assert confirms.take_frames() == [] and confirms.unconfirmed == 3  # not stored yet
    queue.asked[0](None)
    assert released == [True]
    assert confirms.take_frames() == [(ACK, 3, True)]
    assert confirms.unconfirmed == 0


def test_a_storage_error_of_one_queue_nacks_every_publish_that_waited_for_it():
    confirms = PublisherConfirms()
    first, second = FakeQueue(), FakeQueue()
    held(confirms, [first, second])
    held(confirms, [first, second])
    confirms.ask_stores()
    first.asked[0](OSError("disk full"))
    assert confirms.take_frames() == []  # the second queue has not answered
    second.asked[0](None)
    assert confirms.take_frames() == [(NACK, 1, False), (NACK, 2, False)]


def test_a_publish_a_queue_refused_is_nacked_though_its_group_was_stored():
    confirms = PublisherConfirms()
    queue = FakeQueue()
    held(confirms, [queue])
    held(confirms, [queue], accepted=False)  # e.g. another queue at its length limit refused it
    held(confirms, [queue])
    confirms.ask_stores()
    queue.asked[0](None)
    assert confirms.take_frames() == [(ACK, 1, False), (NACK, 2, False), (ACK, 3, False)]


def test_publishes_to_other_queues_wait_apart_and_a_multiple_ack_stops_below_the_oldest_held():
    confirms = PublisherConfirms()
    slow, fast = FakeQueue(), FakeQueue()
    held(confirms, [slow])
    held(confirms, [fast])
    confirms.resolve(confirms.take_seq())  # 3: a transient message, confirmed at once
    confirms.ask_stores()
    fast.asked[0](None)
    assert confirms.take_frames() == [(ACK, 2, False), (ACK, 3, False)]
    slow.asked[0](None)
    assert confirms.take_frames() == [(ACK, 1, False)]
