"""The stores of durable delayed exchanges, as the data source shows them: left out of a scan by
default, read with ``include_internal`` (or by exact name), and marked by ``delayed_exchange``.

The files are written by the broker's own code (queues.delays.delayed_exchange.DelayedMessages over a
QueueJournal), next to an ordinary queue, with time moved by hand.
"""

from __future__ import annotations

import datetime

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from pamqp import commands  # noqa: E402

from persistence.queue_store import QueueStore  # noqa: E402
from queues.delays.delayed_exchange import STORE_PREFIX, DelayedMessages, store_name  # noqa: E402
from queues.journal import QueueJournal  # noqa: E402
from queues.message import Message, content_header  # noqa: E402
from queues.timers import Timers  # noqa: E402
from spark.internal_stores import DELAYED_EXCHANGE_PREFIX, delayed_exchange_of  # noqa: E402
from spark.local_scan import read_table  # noqa: E402
from spark.synthetic_queue import raw_properties  # noqa: E402

STORE = store_name("delays")  # amq.x-delayed-message.delays
COLUMNS = ("queue", "delayed_exchange", "seq", "routing_key", "state", "state_event", "due_at", "headers")
UTC = datetime.timezone.utc
START = 1_700_000_000.0  # when the delayed messages are published (seconds)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def delayed(body: bytes, delay_ms: int, clock: Clock) -> Message:
    properties = commands.Basic.Properties(headers={"x-delay": delay_ms}, delivery_mode=2)
    message = Message("delays", "jobs", content_header(len(body), properties.marshal()), body)
    message.published_at = clock.now
    return message


@pytest.fixture
def data_dir(tmp_path):
    """One ordinary queue "jobs" with one message, and the delayed exchange "delays" holding
    three persistent messages: one released and routed, one released with no queue to take
    it, one still pending."""
    jobs = QueueStore.for_queue(tmp_path, "/", "jobs")
    jobs.recover()
    jobs.append_message(1, 1_700_000_000_000, "", "jobs", raw_properties(commands.Basic.Properties(delivery_mode=2)),
                        b"now")
    jobs.close()

    clock = Clock()
    routable = [True, False]
    pending = DelayedMessages("delays", Timers(clock), lambda message: routable.pop(0),
                              QueueJournal(QueueStore.for_queue(tmp_path, "/", STORE), None))
    pending.recover()
    pending.publish(delayed(b"routed", 1_000, clock))
    pending.publish(delayed(b"unroutable", 2_000, clock))
    pending.publish(delayed(b"later", 60_000, clock))
    clock.now += 3
    pending.timers.run_due(clock.now)
    assert not routable  # both due messages were released
    pending.close()
    return tmp_path


def test_the_prefix_is_the_brokers():
    assert DELAYED_EXCHANGE_PREFIX == STORE_PREFIX
    assert delayed_exchange_of(STORE) == "delays" and delayed_exchange_of("jobs") is None


def test_a_scan_lists_only_the_queues_clients_declared_by_default(data_dir):
    table = read_table(data_dir, ("queue", "delayed_exchange", "seq"))
    assert table.to_pylist() == [{"queue": "jobs", "delayed_exchange": None, "seq": 1}]
    # a glob is not a request for internal stores either
    assert read_table(data_dir, ("queue",), queue="amq.*").num_rows == 0


def test_include_internal_adds_the_pending_messages_of_delayed_exchanges_marked_as_such(data_dir):
    rows = read_table(data_dir, COLUMNS, include_internal=True).to_pylist()
    assert [(r["queue"], r["delayed_exchange"]) for r in rows] == [
        ("amq.x-delayed-message.delays", "delays")] * 3 + [("jobs", None)]
    store = {r["seq"]: r for r in rows if r["delayed_exchange"] == "delays"}
    published = datetime.datetime.fromtimestamp(START, UTC)
    summary = {seq: (r["state"], r["state_event"], r["due_at"]) for seq, r in store.items()}
    assert summary == {
        1: ("acked", "acked", None),  # released and routed
        2: ("dead_lettered", "dropped", None),  # released, but no queue took it
        3: ("waiting_retry", "waiting_retry", published + datetime.timedelta(seconds=60)),  # pending until due_at
    }
    # stored as published: the routing key and the positive x-delay (negated only when released)
    assert store[3]["routing_key"] == "jobs" and dict(store[3]["headers"]) == {"x-delay": "60000"}


def test_naming_the_store_exactly_reads_it_without_the_option(data_dir):
    table = read_table(data_dir, ("queue", "state"), queue=STORE)
    assert table.column("queue").to_pylist() == [STORE] * 3
    assert sorted(table.column("state").to_pylist()) == ["acked", "dead_lettered", "waiting_retry"]


def test_the_data_source_option_include_internal_is_true_or_false(data_dir):
    pytest.importorskip("pyspark")
    from spark.data_source import QueueReader

    def queues(**options) -> set[str]:
        reader = QueueReader({"path": str(data_dir), **options}, ("queue",), frozenset())
        return {partition.value.queue for partition in reader.partitions()}

    assert queues() == {"jobs"}
    assert queues(include_internal="false") == {"jobs"}
    assert queues(include_internal="TRUE") == {"jobs", STORE}
    with pytest.raises(ValueError, match="include_internal must be true or false"):
        queues(include_internal="yes")
