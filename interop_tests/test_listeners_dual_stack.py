"""With the default host the broker answers clients on IPv4 and IPv6 alike, for AMQP, the
management API and Prometheus, as RabbitMQ (which listens on `::`): a client that resolves
`localhost` to `::1` connects. `--host` narrows it (docs/configuration.md)."""

from __future__ import annotations

import base64
import socket
import urllib.request

import pika
import pytest

from interop_tests.broker_process import free_port


def http_status(url: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status


def test_the_default_listeners_take_ipv4_and_ipv6_clients(broker_factory) -> None:
    management, metrics = free_port(), free_port()
    broker = broker_factory(extra_args=("--host", "::", "--management-port", str(management),
                                        "--metrics-port", str(metrics)))
    for host in ("127.0.0.1", "::1"):
        connection = pika.BlockingConnection(pika.ConnectionParameters(host=host, port=broker.port))
        channel = connection.channel()
        channel.queue_declare("", exclusive=True)  # guest, from loopback over either family
        connection.close()
    for host in ("127.0.0.1", "[::1]"):
        assert http_status(f"http://{host}:{management}/api/overview") == 200
        assert http_status(f"http://{host}:{metrics}/metrics") == 200


def test_host_narrows_the_listener_to_ipv4(broker_factory) -> None:
    broker = broker_factory(extra_args=("--host", "0.0.0.0"))
    connection = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=broker.port))
    connection.close()
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        with pytest.raises(OSError):
            client.connect(("::1", broker.port))
