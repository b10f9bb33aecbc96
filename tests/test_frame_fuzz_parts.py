"""The frame fuzzer's own parts: sessions replay from (seed, connection), and its reading of the broker log."""

from __future__ import annotations

from bench.frame_fuzz import broker_log
from bench.frame_fuzz.broker_log import log_failures
from bench.frame_fuzz.corpus import PROTOCOL_HEADER, TAG, corpus_scripts
from bench.frame_fuzz.mutations import connection_token, session_frames

SCRIPTS = corpus_scripts()

INTERNAL_ERROR = '''2026-11-25 06:57:51,643 ERROR amqp_server.runtime.server: internal error on connection 127.0.0.1:35276; closing it
Traceback (most recent call last):
  File "/work/amqp_server/runtime/server.py", line 76, in data_received
    self.connection.receive_data(data)
  File "/work/amqp_server/channel/declarations.py", line 142, in queue_declare
    commands.Queue.DeclareOk(
ValueError: Invalid value for queue
'''
UNDECODABLE = '''2026-11-25 06:57:52,001 ERROR amqp_server.runtime.server: internal error on connection 127.0.0.1:35280; closing it
Traceback (most recent call last):
  File "/work/amqp_server/publishing.py", line 105, in check_special_properties
    properties = message.properties
  File "/work/queues/message.py", line 154, in decode_properties
    properties.unmarshal(flags, raw[offset:])
ValueError: Unknown type: b'Z'
'''
CLIENT_ERRORS = '''2026-11-25 07:05:33,457 ERROR amqp_server.connection.connection: closing AMQP connection 127.0.0.1:43232 -> 127.0.0.1:41985: {bad_header,<<1,0,2,0,0,16,0,0>>}
2026-11-25 07:05:33,458 WARNING amqp_server.connection.connection: closing AMQP connection 127.0.0.1:43244 -> 127.0.0.1:41985: CHANNEL_ERROR - second 'channel.open' seen
'''


def test_a_connections_session_follows_from_the_seed_and_its_number():
    assert session_frames(7, 12, SCRIPTS) == session_frames(7, 12, SCRIPTS)
    assert session_frames(7, 12, SCRIPTS) != session_frames(8, 12, SCRIPTS)
    assert session_frames(7, 12, SCRIPTS) != session_frames(7, 13, SCRIPTS)


def test_sessions_carry_their_connections_token_instead_of_the_placeholder():
    sessions = [b"".join(session_frames(1, number, SCRIPTS)) for number in range(200)]
    assert not any(TAG in session for session in sessions)
    assert sum(connection_token(number) in session for number, session in enumerate(sessions)) > 150
    assert sum(session.startswith(PROTOCOL_HEADER) for session in sessions) > 150  # most handshakes are valid


def test_an_internal_error_is_a_failure_with_the_brokers_frames_as_its_signature():
    (failure,) = log_failures(CLIENT_ERRORS + INTERNAL_ERROR + CLIENT_ERRORS)
    assert failure.signature == (
        "ValueError at amqp_server/channel/declarations.py:queue_declare <- amqp_server/runtime/server.py:data_received"
    )
    assert (failure.count, failure.ports, failure.known) == (1, [35276], None)


def test_errors_a_client_causes_are_not_failures():
    assert log_failures(CLIENT_ERRORS) == []


def test_a_known_finding_is_named_and_counted_apart(monkeypatch):
    monkeypatch.setitem(broker_log.KNOWN_FINDINGS, "in decode_properties", "undecodable content header")
    failures = log_failures(UNDECODABLE + INTERNAL_ERROR + UNDECODABLE)
    assert [(failure.count, failure.known) for failure in failures] == [(2, "undecodable content header"), (1, None)]
