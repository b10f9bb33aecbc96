"""Listening sockets: the default address takes IPv4 and IPv6 clients alike, as RabbitMQ's.

RabbitMQ listens on `::` with one dual-stack socket, so a client that resolves `localhost` to
`::1` connects as well as one that resolves it to `127.0.0.1`. The default host here is the same
wildcard, `::`, bound with IPV6_V6ONLY off (asyncio's `create_server` would turn it on). On a
machine without IPv6 the wildcard falls back to `0.0.0.0`, so the broker still starts. Any other
host (`--host 127.0.0.1`, `--host ::1`, `--host 0.0.0.0`) narrows the listener to that address.
"""

from __future__ import annotations

import errno
import logging
import socket

log = logging.getLogger(__name__)

from amqp_server.config.settings import ANY_ADDRESS, ANY_IPV4

# What a machine without IPv6 answers when asked for an IPv6 socket or address.
_NO_IPV6 = {errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT}


def bound_socket(host: str, port: int, *, reuse_port: bool = False, listen: bool = False,
                 backlog: int = 1024) -> socket.socket:
    """A TCP socket bound to (`host`, `port`), non-blocking; listening if `listen` (otherwise the
    kernel refuses connections until the server starts serving). `::` is dual stack, with
    `0.0.0.0` in its place where the machine has no IPv6."""
    if host == ANY_ADDRESS:
        try:
            return _bind(socket.AF_INET6, ("::", port), reuse_port, listen, backlog, dual_stack=True)
        except OSError as error:
            if error.errno not in _NO_IPV6:
                raise
            log.info("no IPv6 on this machine (%s): listening on %s only", error.strerror or error, ANY_IPV4)
            host = ANY_IPV4
    family, _kind, _proto, _name, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return _bind(family, address, reuse_port, listen, backlog, dual_stack=False)


def _bind(family: int, address: tuple[object, ...], reuse_port: bool, listen: bool, backlog: int,
          dual_stack: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        if listen:
            sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
