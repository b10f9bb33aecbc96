"""Whatever bytes a client sends, the connection answers with a close, never an exception.

Hypothesis generates frames of every type on channels 0-3 with random payloads, and method
frames with real class/method ids followed by random argument bytes, after a valid handshake.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from amqp_server.connection import CLOSED, CLOSING, OPEN
from tests.frame_driver import opened_client, raw_frame

METHOD_IDS = sorted(commands.INDEX_MAPPING)

random_frames = st.builds(
    raw_frame,
    st.sampled_from([1, 2, 3, 4, 8, 206]),
    st.integers(0, 3),
    st.binary(max_size=64),
)
method_frames = st.builds(
    lambda index, channel, arguments: raw_frame(1, channel, struct.pack(">I", index) + arguments),
    st.sampled_from(METHOD_IDS),
    st.integers(0, 3),
    st.binary(max_size=48),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(random_frames, method_frames), min_size=1, max_size=12))
def test_random_frames_never_raise_out_of_the_connection(frames):
    client = opened_client(channels=(1, 2))
    for frame in frames:
        client.send_bytes(frame)
    assert client.connection.state in (OPEN, CLOSING, CLOSED)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40), st.lists(st.binary(max_size=32), max_size=3))
def test_a_publish_followed_by_random_content_frames_never_raises(header, bodies):
    client = opened_client()
    publish = commands.Basic.Publish(exchange="", routing_key="q")
    client.send(1, publish)
    client.send_bytes(raw_frame(2, 1, header))
    for body in bodies:
        client.send_bytes(raw_frame(3, 1, body))
    assert client.connection.state in (OPEN, CLOSING, CLOSED)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=256))
def test_random_bytes_after_the_handshake_never_raise(data):
    client = opened_client()
    client.send_bytes(data)
    assert client.connection.state in (OPEN, CLOSING, CLOSED)
