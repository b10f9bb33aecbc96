"""What the scenario programs of the clients in other languages (interop_tests/clients/) must
observe where a scenario is the same in every language, and the two interactive dances (a
memory alarm, a broker restart) their tests run.

Each program implements the scenarios named here alike; its report names what it observed in
its own words (`messageCount` in Java, `message_count` in C). A test file passes the values
under its client's names to the `expect_*` function, and asserts itself on what only its client
shows. RabbitMQ 3.10's behaviour is the specification: every expectation here holds against it
(INTEROP_BROKER_URL, interop_tests/README.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from interop_tests.broker_process import external_broker
from interop_tests.scenario_programs import ControlledBroker, ScenarioProgram

# ---- connect ------------------------------------------------------------------------------------

# What connection.start says, as RabbitMQ 3.10 says it: these capabilities, every one true, and
# these server properties.
SERVER_CAPABILITIES = dict.fromkeys([
    "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify", "connection.blocked",
    "consumer_priorities", "authentication_failure_close", "per_consumer_qos", "direct_reply_to",
], True)
SERVER_PROPERTY_KEYS = {"product", "version", "platform", "copyright", "information", "capabilities"}


def expect_server_capabilities(capabilities: dict[str, Any]) -> None:
    """connection.start's capabilities table, as the client hands it to the application."""
    assert capabilities == SERVER_CAPABILITIES


# ---- confirms: confirm.select, 100 publishes to a queue, then a mandatory publish "unroutable" no
# queue takes; the program waits until every publish is settled.

def expect_confirms(acked: list[int], nacked: list[int], returned: tuple[int, str, str], return_before_ack: bool,
                    message_count: int) -> None:
    """`acked`, `nacked`: the settled publish sequence numbers (every tag an ack with `multiple`
    covers), sorted; `returned`: the basic.return's reply code, reply text and body;
    `return_before_ack`: whether it came before the ack of that publish."""
    assert acked == list(range(1, 102)) and nacked == []
    assert returned == (312, "NO_ROUTE", "unroutable")
    assert return_before_ack is True
    assert message_count == 100


# ---- prefetch: 50 messages "0".."49" in a queue, basic.qos(10) and a consumer with manual acks
# that acks nothing until no more come (a short wait once it holds ten), then acks those and
# every later one.

def expect_prefetch(held_unacked: int, bodies: list[str], message_count: int) -> None:
    assert held_unacked == 10  # no more than the prefetch while nothing is acked
    assert bodies == [str(i) for i in range(50)]  # each once, in order
    assert message_count == 0


# ---- reject_requeue: "0", "1", "2" in a queue; a consumer with prefetch 1 rejects "0" with
# requeue, acks it when it comes back and acks "1", rejects "2" without requeue, then waits a
# moment for anything more (which it would report as a fifth delivery).

def expect_reject_requeue(deliveries: list[dict[str, Any]], message_count: int) -> None:
    """`deliveries`: {"body", "redelivered"} of each delivery, in order."""
    assert deliveries == [
        {"body": "0", "redelivered": False}, {"body": "0", "redelivered": True},  # back first, marked
        {"body": "1", "redelivered": False}, {"body": "2", "redelivered": False},
    ]
    assert message_count == 0  # "2" was rejected without requeue: gone


# ---- channel_error: the texts of the channel errors the scenarios provoke, in RabbitMQ's words

def not_found(queue: str) -> str:
    """A passive queue.declare (or basic.get) of a queue that does not exist: 404, 50.10 (or 60.70)."""
    return f"NOT_FOUND - no queue '{queue}' in vhost '/'"


def inequivalent_durable(queue: str) -> str:
    """queue.declare durable of an existing non-durable queue: 406, 50.10."""
    return (f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{queue}' in vhost '/': "
            "received 'true' but current is 'false'")


UNKNOWN_DELIVERY_TAG = "PRECONDITION_FAILED - unknown delivery tag 99"  # basic.ack of tag 99: 406, 60.80


# ---- heartbeats: heartbeat 1 s, then 3 s or more with nothing to send or receive; the connection
# is still open, and a message goes through.

def expect_heartbeats(heartbeat: int | float, body_after_idle: str | None) -> None:
    assert heartbeat == 1
    assert body_after_idle == "after the idle time"


# ---- large_message: with frame_max 4096 (as the client asks), bodies of each of
# large_message_sizes(frame_max) published to a queue in that order and got back; the program
# makes byte i of a body (i * 31 + 7) % 251 and says whether what came back is that, intact.

def large_message_sizes(frame_max: int) -> list[int]:
    payload = frame_max - 8  # a content body frame's payload (7 bytes of header, 1 of frame end)
    return [0, 1, payload - 1, payload, payload + 1, 2 * payload, 2 * payload + 1,
            100_000, 1 << 20, (1 << 20) + 1]


def expect_large_message(frame_max: int, bodies: list[dict[str, Any]], *, asked: int = 4096) -> None:
    """`bodies`: {"size", "intact"} of each body got back, in order; `asked`: the frame_max the
    client asks for."""
    assert frame_max == asked
    assert bodies == [{"size": size, "intact": True} for size in large_message_sizes(frame_max)]


# ---- blocked: a memory alarm while a client publishes ------------------------------------------

LOW_ON_MEMORY = "low on memory"  # connection.blocked's reason


def drive_memory_alarm(program: ScenarioProgram, broker: ControlledBroker, scenario: str = "blocked") -> dict[str, Any]:
    """Run `scenario` through a memory alarm; its report. The program connects and says "ready";
    the test raises the alarm; the program publishes "held" and, once it has seen what the alarm
    does (connection.blocked, or a short wait where its client is not told), says "blocked"; the
    test clears the alarm; the program reports what came after."""
    with program.start(scenario, broker.url()) as run:
        run.expect("ready")
        broker.raise_memory_alarm()
        try:
            run.proceed()
            run.expect("blocked")
        finally:
            broker.clear_memory_alarm()
        run.proceed()
        return run.finish()


def expect_blocked_then_unblocked(reason: str, while_blocked: list[str], order: str, body: str | None) -> None:
    """For a client that announces connection.blocked and publishes with confirms: `reason` of
    connection.blocked, `while_blocked` what came in the half second after it (connection
    methods and acks), `order` all that came ("blocked", "unblocked", "ack" joined by commas),
    `body` the message got from the queue at the end."""
    assert reason == LOW_ON_MEMORY
    assert while_blocked == []  # the publish that met the alarm waits: no ack while it lasts
    # connection.unblocked first, then the broker reads the publish it held and acks it.
    assert order == "blocked,unblocked,ack"
    assert body == "held"


def expect_delivered_after_the_alarm(delivered_while_blocked: int, received_after: str | None) -> None:
    """For a program whose second connection consumes what the blocked one publishes: how many
    messages it had while the alarm lasted, and the body it got once the alarm was cleared."""
    assert delivered_while_blocked == 0  # the publish that blocked waits for the alarm to clear
    assert received_after == "held"


# ---- restart: the broker restarts under a connected client -------------------------------------

SHUTDOWN_TEXT = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"  # code 320


def drive_restart(program: ScenarioProgram, broker: ControlledBroker, scenario: str = "restart") -> dict[str, Any]:
    """Run `scenario` through a broker restart; its report. The program sets up (a durable
    queue, a message, a consumer) and says "ready"; the test restarts the broker and lets it go
    on; the program reports what its client noticed and what it found after reconnecting or
    recovering."""
    with program.start(scenario, broker.url()) as run:
        run.expect("ready")
        broker.restart()
        run.proceed()
        return run.finish()


# A consumer held the persistent message "in flight" unacked over the restart; after it the
# application consumes again: the message again, redelivered, then one published after the restart.
REDELIVERED_AFTER_RESTART = [{"body": "in flight", "redelivered": True},
                             {"body": "after the restart", "redelivered": False}]


# ---- where this broker differs from RabbitMQ ----------------------------------------------------
# A test asserts RabbitMQ's behaviour and calls unless_rabbitmq_agrees with a reason naming the
# difference: on this project's broker it is marked xfail while the difference lasts, and simply
# passes once it is gone. (None is open now: the last, AMQP 0-8 refused, was closed by
# wire/amqp_0_8.py.)

def unless_rabbitmq_agrees(agrees: bool, reason: str) -> None:
    """Mark the test xfail when this project's broker does not do what RabbitMQ does (`reason`)."""
    if not agrees and external_broker() is None:
        pytest.xfail(reason)
