"""Admission under connection limits: slots are taken at accept and given back once at close."""

from __future__ import annotations

from amqp_server.broker.connection_limits import REFUSING_AT_MOST, Admission, ConnectionLimit


def test_a_socket_takes_a_slot_in_every_limit_and_gives_it_back_once():
    broker, listener = ConnectionLimit("broker", 2), ConnectionLimit("listener a:1", 0)
    first = Admission((broker, listener), "p:1")
    assert first.refused_by is None and (broker.count, listener.count) == (1, 1)
    first.release()
    first.release()
    assert (broker.count, listener.count) == (0, 0)


def test_over_a_limit_a_socket_is_refused_by_it_and_holds_no_slot():
    broker, listener = ConnectionLimit("broker", 0), ConnectionLimit("listener a:1", 1)
    inside = Admission((broker, listener), "p:1")
    over = Admission((broker, listener), "p:2")
    assert over.refused_by is listener and not over.dropped
    assert (broker.count, listener.count, listener.refusing) == (1, 1, 1)
    error = over.refused_by.refusal("/", "guest")
    assert (error.code, error.class_id, error.method_id) == (530, 10, 40)
    assert error.reply_text == "NOT_ALLOWED - access to vhost '/' refused for user 'guest': listener a:1 connection limit (1) is reached"
    over.release()
    inside.release()
    assert (broker.count, listener.count, listener.refusing) == (0, 0, 0)


def test_an_empty_scope_gives_rabbitmqs_vhost_limit_text():
    error = ConnectionLimit("", 3).refusal("v", "u")
    assert error.reply_text == "NOT_ALLOWED - access to vhost 'v' refused for user 'u': connection limit (3) is reached"


def test_past_the_refusals_that_may_wait_sockets_are_dropped():
    limit = ConnectionLimit("broker", 1)
    Admission((limit,), "p:0")
    waiting = [Admission((limit,), f"p:{n}") for n in range(REFUSING_AT_MOST)]
    assert not any(admission.dropped for admission in waiting)
    dropped = Admission((limit,), "p:x")
    assert dropped.dropped and limit.refusing == REFUSING_AT_MOST
    dropped.release()
    waiting[0].release()
    assert limit.refusing == REFUSING_AT_MOST - 1
