"""The default listener takes IPv4 and IPv6 clients on one socket, as RabbitMQ's `::` does; a
machine without IPv6 still starts (on 0.0.0.0); another host narrows it."""

from __future__ import annotations

import errno
import socket

import pytest

from amqp_server.config.settings import ANY_ADDRESS, ServerConfig, advertised_host
from amqp_server.runtime import listening
from amqp_server.runtime.listening import bound_socket


def connects(family: int, host: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        try:
            client.connect((host, port))
        except OSError:
            return False
        return True


def test_the_default_host_is_every_address_of_both_families() -> None:
    assert ServerConfig().host == ANY_ADDRESS == "::"
    assert advertised_host("::") == "0.0.0.0" and advertised_host("10.0.0.5") == "10.0.0.5"


def test_the_wildcard_socket_takes_ipv4_and_ipv6_clients() -> None:
    with bound_socket("::", 0, listen=True) as server:
        port = server.getsockname()[1]
        assert server.family == socket.AF_INET6
        assert connects(socket.AF_INET, "127.0.0.1", port)
        assert connects(socket.AF_INET6, "::1", port)


def test_a_host_narrows_the_listener_to_that_address() -> None:
    with bound_socket("127.0.0.1", 0, listen=True) as server:
        port = server.getsockname()[1]
        assert connects(socket.AF_INET, "127.0.0.1", port)
        assert not connects(socket.AF_INET6, "::1", port)


def test_without_ipv6_the_wildcard_listens_on_every_ipv4_address(monkeypatch) -> None:
    real_socket = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real_socket(family, *args, **kwargs)

    monkeypatch.setattr(listening.socket, "socket", no_ipv6)
    with bound_socket("::", 0, listen=True) as server:
        assert server.family == socket.AF_INET and server.getsockname()[0] == "0.0.0.0"
        assert connects(socket.AF_INET, "127.0.0.1", server.getsockname()[1])


def test_a_port_in_use_is_still_an_error_not_a_fallback() -> None:
    with bound_socket("::", 0, listen=True) as taken:
        with pytest.raises(OSError) as error:
            bound_socket("::", taken.getsockname()[1], listen=True)
        assert error.value.errno == errno.EADDRINUSE
