"""The per-address failed-login limit of the management API, on a fake clock."""

from __future__ import annotations

from amqp_server.management.login_throttle import LoginThrottle, client_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_refused_after_the_limit_until_its_window_ends():
    clock = Clock()
    throttle = LoginThrottle(limit=3, window=60, clock=clock)
    for _ in range(2):
        throttle.record_failure("192.0.2.9")
        assert throttle.retry_after("192.0.2.9") is None
    clock.now += 10
    throttle.record_failure("192.0.2.9")
    assert throttle.retry_after("192.0.2.9") == 50, "the window runs from the first failure"
    assert throttle.retry_after("192.0.2.10") is None, "other addresses are not affected"
    clock.now += 49.5
    assert throttle.retry_after("192.0.2.9") == 1
    clock.now += 0.5
    assert throttle.retry_after("192.0.2.9") is None
    throttle.record_failure("192.0.2.9")
    assert throttle.retry_after("192.0.2.9") is None, "a new window starts from zero"


def test_failures_spread_beyond_the_window_never_block():
    clock = Clock()
    throttle = LoginThrottle(limit=3, window=60, clock=clock)
    for _ in range(20):
        throttle.record_failure("192.0.2.9")
        throttle.record_failure("192.0.2.9")
        clock.now += 61
        assert throttle.retry_after("192.0.2.9") is None


def test_ipv6_is_counted_by_64_block_and_ipv4_mapped_as_ipv4():
    clock = Clock()
    throttle = LoginThrottle(limit=2, window=60, clock=clock)
    throttle.record_failure("2001:db8:1:2::1")
    throttle.record_failure("2001:db8:1:2:ffff::9")
    assert throttle.retry_after("2001:db8:1:2::77") is not None
    assert throttle.retry_after("2001:db8:1:3::1") is None
    assert client_key("::ffff:192.0.2.9") == client_key("192.0.2.9") == "192.0.2.9"
    assert client_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"


def test_the_table_holds_at_most_max_addresses_dropping_the_least_recently_failed():
    clock = Clock()
    throttle = LoginThrottle(limit=2, window=60, max_addresses=100, clock=clock)
    throttle.record_failure("10.0.0.1")
    throttle.record_failure("10.0.0.1")
    for n in range(5000):
        throttle.record_failure(f"10.1.{n // 256}.{n % 256}")
        assert throttle.tracked_addresses <= 100
    assert throttle.retry_after("10.0.0.1") is None, "evicted by the flood"
    assert throttle.retry_after("10.1.19.135") is None  # one failure: tracked, not blocked
    throttle.record_failure("10.1.19.135")
    assert throttle.retry_after("10.1.19.135") is not None


def test_limit_0_never_refuses_and_keeps_nothing():
    throttle = LoginThrottle(limit=0, window=60)
    for _ in range(100):
        throttle.record_failure("192.0.2.9")
    assert throttle.retry_after("192.0.2.9") is None
    assert throttle.tracked_addresses == 0
