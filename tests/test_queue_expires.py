"""x-expires: a queue unused for that long is deleted; declaring it (even passively) is use."""

from __future__ import annotations

from amqp_server.broker.vhost import VirtualHost
from queues.timers import Timers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def vhost_with_clock() -> tuple[VirtualHost, Timers, Clock]:
    clock = Clock()
    timers = Timers(clock=clock)
    return VirtualHost("/", timers=timers), timers, clock


def advance(timers: Timers, clock: Clock, seconds: float) -> None:
    clock.now += seconds
    timers.run_due(clock.now)


def test_an_unused_queue_is_deleted_after_x_expires():
    vhost, timers, clock = vhost_with_clock()
    vhost.declare_queue("short-lived", connection=None, arguments={"x-expires": 1000})
    advance(timers, clock, 0.9)
    assert "short-lived" in vhost.queues
    advance(timers, clock, 0.2)
    assert "short-lived" not in vhost.queues


def test_a_passive_declare_restarts_the_x_expires_clock():
    vhost, timers, clock = vhost_with_clock()
    vhost.declare_queue("polled", connection=None, arguments={"x-expires": 1000})
    for _ in range(5):
        advance(timers, clock, 0.6)
        vhost.declare_queue("polled", connection=None, passive=True)
    assert "polled" in vhost.queues  # 3 s after declaring, kept alive by the passive declares
    advance(timers, clock, 1.1)
    assert "polled" not in vhost.queues
