"""The fuzzer's corpus: the frames real clients send, from the handshake to teardown.

Built with pamqp as a client marshals them (pika's handshake properties, publishes split at
4096-byte frames, headers with every field type). Names carry the TAG placeholder, which each
connection replaces with a token of the same length (mutations.session_frames).
"""

from __future__ import annotations

import datetime
import decimal
import struct
import warnings
from dataclasses import dataclass, field

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_MAX = 131072  # what the fuzzed broker offers (its default) and the corpus tunes to
# Placeholder in corpus names, replaced per connection by a token of the same length, so
# connections do not fight over exclusive queues and length prefixes stay right.
TAG = b"T000000"
# Placeholder in exchange names, replaced by one of SLOTS tokens (mutations.session_frames):
# exchanges outlive connections, so they are shared by a few, and each session deletes its
# slot's exchanges before declaring them, so that one a mutation declared with other
# properties (auto-delete, another type) does not refuse the declarations of every session after.
SLOT = b"S00"
SLOTS = 64


def marshal(channel: int, *values: object) -> list[bytes]:
    """The wire bytes of pamqp frame objects on one channel, one element per frame."""
    return [frame.marshal(value, channel) for value in values]


# What clients answer connection.tune with (channel_max, frame_max, heartbeat): pika's (the
# broker's values), 0 for "yours", amqplib's 4096-byte frames, a client with few channels.
TUNINGS = ((2047, FRAME_MAX, 0), (0, 0, 0), (2047, 4096, 0), (3, 8192, 0), (2047, FRAME_MAX, 30))


def handshake_frames(tuning: tuple[int, int, int] = TUNINGS[0]) -> list[bytes]:
    """Protocol header through connection.open, as pika sends them, with the given tune-ok."""
    channel_max, frame_max, heartbeat = tuning
    client_properties = {
        "product": "frame-fuzz",
        "platform": "Python",
        "capabilities": {
            "authentication_failure_close": True,
            "basic.nack": True,
            "connection.blocked": True,
            "consumer_cancel_notify": True,
            "publisher_confirms": True,
        },
        "information": "See http://pika.rtfd.org",
        "version": "1.3.2",
    }
    return [
        PROTOCOL_HEADER,
        *marshal(
            0,
            commands.Connection.StartOk(
                client_properties=client_properties, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
            ),
            commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat),
            commands.Connection.Open(virtual_host="/"),
        ),
    ]


def _rich_properties(variant: int) -> commands.Basic.Properties:
    headers = {
        "x-string": "héllo",
        "x-int": 42 + variant,
        "x-negative": -7,
        "x-big": 1 << 40,
        "x-float": 1.5,
        "x-decimal": decimal.Decimal("3.14"),
        "x-bool": True,
        "x-none": None,
        "x-time": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        "x-list": [1, "two", [3, {"four": 4}]],
        "x-table": {"nested": {"deeper": {"deepest": "yes"}}},
    }
    return commands.Basic.Properties(
        content_type="application/json",
        content_encoding="utf-8",
        headers=headers,
        delivery_mode=1 + variant % 2,
        priority=variant % 10,
        correlation_id=f"corr-{variant}",
        reply_to="fz-" + TAG.decode() + "-reply",
        expiration="60000" if variant % 3 == 0 else None,
        message_id=f"msg-{variant}",
        timestamp=datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc),
        message_type="fuzz",
        user_id="guest" if variant % 4 == 0 else None,
        app_id="frame-fuzz",
    )


def _publish(channel: int, exchange: str, routing_key: str, body: bytes, variant: int, **flags: bool) -> list[bytes]:
    """basic.publish, its content header and body frames split as a client with frame_max 4096 would."""
    frames = marshal(
        channel,
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, **flags),
        ContentHeader(body_size=len(body), properties=_rich_properties(variant) if variant % 2 else None),
    )
    step = 4088
    frames += marshal(channel, *(ContentBody(body[start : start + step]) for start in range(0, len(body), step)))
    return frames


def _recover_async() -> commands.Basic.RecoverAsync:
    """basic.recover-async: deprecated by the spec (pamqp warns), still sent by old clients."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return commands.Basic.RecoverAsync(requeue=True)


def _features(channel: int, tag: str) -> list[bytes]:
    """Dead-lettering, overflow, priorities, delayed and alternate exchanges, direct reply-to,
    passive declares and recover: the broker's less travelled paths."""
    dead_letters = f"fz-{tag}-dl"
    delayed = f"fz-delayed-{SLOT.decode()}"
    alternate = f"fz-alt-{SLOT.decode()}"
    limited = f"fz-{tag}-lim"
    frames = marshal(
        channel,
        commands.Exchange.Delete(exchange=delayed),
        commands.Exchange.Delete(exchange=alternate),
        commands.Queue.Declare(queue=dead_letters, exclusive=True),
        commands.Queue.Declare(queue=limited, exclusive=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_letters, "x-max-length": 2,
            "x-overflow": "reject-publish-dlx", "x-max-priority": 5, "x-message-ttl": 50, "x-delivery-limit": 2,
        }),
        commands.Exchange.Declare(exchange=delayed, exchange_type="x-delayed-message",
                                  arguments={"x-delayed-type": "direct"}),
        commands.Exchange.Declare(exchange=alternate, exchange_type="fanout", arguments={"alternate-exchange": "amq.fanout"}),
        commands.Queue.Bind(queue=limited, exchange=delayed, routing_key=limited),
        commands.Queue.Declare(queue=limited, passive=True),
        commands.Exchange.Declare(exchange=delayed, passive=True),
        commands.Confirm.Select(nowait=True),
        commands.Basic.Consume(queue="amq.rabbitmq.reply-to", no_ack=True, consumer_tag=f"reply-{tag}"),
        commands.Basic.Consume(queue=dead_letters, consumer_tag=f"dl-{tag}", arguments={"x-priority": 7},
                               exclusive=True),
    )
    for variant in range(5):
        frames += _publish(channel, "", limited, b"overflow", variant)
    frames += marshal(
        channel,
        commands.Basic.Publish(exchange=delayed, routing_key=limited),
        ContentHeader(body_size=5, properties=commands.Basic.Properties(
            headers={"x-delay": 30}, reply_to="amq.rabbitmq.reply-to", priority=9, expiration="0")),
        ContentBody(b"later"),
    )
    frames += _publish(channel, alternate, "any", b"alternate", 2, mandatory=True)
    frames += marshal(
        channel,
        commands.Basic.Get(queue=limited),
        commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True),
        commands.Basic.Get(queue=limited),
        commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=False),
        _recover_async(),
        commands.Basic.Cancel(consumer_tag=f"dl-{tag}", nowait=True),
        commands.Queue.Delete(queue=limited, if_unused=True, if_empty=True),
    )
    return frames


@dataclass(frozen=True)
class Script:
    """A piece of a client conversation on one channel. A session opens the channel before it,
    followed by `setup` (the declarations the script relies on), if the channel is not open."""

    channel: int
    frames: list[bytes]
    setup: list[bytes] = field(default_factory=list)
    closes_channel: bool = False


def corpus_scripts() -> list[Script]:
    """Conversations after the handshake; names carry the TAG placeholder. Transactions and
    confirms get channels of their own (a channel cannot be both), the rest share 1 to 3."""
    tag = TAG.decode()
    queue = f"fz-{tag}-q"
    args = {"x-max-length": 50, "x-message-ttl": 60000}
    declare_queue = commands.Queue.Declare(queue=queue, exclusive=True, arguments=args)
    scripts: list[Script] = []
    for channel in (1, 2, 3):
        topic, headers = f"fz-x{channel}-{SLOT.decode()}", f"fz-h{channel}-{SLOT.decode()}"
        declares = marshal(
            channel,
            commands.Exchange.Delete(exchange=topic),
            commands.Exchange.Delete(exchange=headers),
            commands.Exchange.Declare(exchange=topic, exchange_type="topic"),
            commands.Exchange.Declare(exchange=headers, exchange_type="headers", auto_delete=True),
            declare_queue,
            commands.Queue.Declare(queue="", exclusive=True, auto_delete=True),
            commands.Queue.Bind(queue=queue, exchange=topic, routing_key="a.*.c"),
            commands.Queue.Bind(queue=queue, exchange=headers, arguments={"x-match": "any", "k": "v"}),
            commands.Exchange.Bind(destination=headers, source=topic, routing_key="#"),
        )
        publishes: list[bytes] = []
        for variant, size in enumerate((0, 10, 300, 5000, 9000)):
            publishes += _publish(channel, "", queue, bytes(range(256)) * (size // 256) + b"x" * (size % 256), variant)
        publishes += _publish(channel, topic, "a.b.c", b"routed", 3)
        consume = marshal(
            channel,
            declare_queue,
            commands.Basic.Qos(prefetch_count=3),
            commands.Basic.Consume(queue=queue, consumer_tag=f"ctag-{tag}"),
        )
        for variant in range(4):
            consume += _publish(channel, "", queue, b"consume me", variant)
        consume += marshal(
            channel,
            commands.Basic.Ack(delivery_tag=1),
            commands.Basic.Nack(delivery_tag=2, requeue=True),
            commands.Basic.Reject(delivery_tag=3, requeue=False),
            commands.Basic.Ack(delivery_tag=0, multiple=True),
            commands.Basic.Get(queue=queue),
            commands.Basic.Recover(requeue=True),
            commands.Basic.Cancel(consumer_tag=f"ctag-{tag}"),
            commands.Queue.Purge(queue=queue),
        )
        teardown = marshal(
            channel,
            commands.Basic.Qos(prefetch_count=10, global_=True),
            commands.Channel.Flow(active=True),
            commands.Queue.Unbind(queue=queue, exchange=topic, routing_key="a.*.c"),
            commands.Exchange.Unbind(destination=headers, source=topic, routing_key="#"),
            commands.Queue.Delete(queue=queue),
            commands.Exchange.Delete(exchange=headers),
            commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
        )
        scripts += [Script(channel, declares), Script(channel, publishes, declares), Script(channel, consume, declares),
                    Script(channel, teardown, declares, closes_channel=True), Script(channel, _features(channel, tag))]
    for channel in (4, 5):
        tx = marshal(channel, declare_queue, commands.Tx.Select())
        tx += _publish(channel, "", queue, b"tx one", 1)
        tx += marshal(channel, commands.Tx.Commit(), commands.Basic.Get(queue=queue), commands.Basic.Ack(delivery_tag=1))
        tx += _publish(channel, "", queue, b"tx two", 2)
        tx += marshal(channel, commands.Tx.Rollback(), commands.Tx.Commit())
        scripts.append(Script(channel, tx))
    for channel in (6, 7):
        confirms = marshal(channel, commands.Confirm.Select())
        confirms += _publish(channel, "", queue, b"confirmed", 1)
        confirms += _publish(channel, "", "nowhere", b"returned", 2, mandatory=True)
        confirms += _publish(channel, "amq.headers", "", b"to headers", 3)
        scripts.append(Script(channel, confirms))
    scripts.append(Script(0, [struct.pack(">BHI", 8, 0, 0) + b"\xce"]))  # a heartbeat
    return scripts
