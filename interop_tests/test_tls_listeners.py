"""AMQPS, HTTPS management and HTTPS Prometheus with a CA and certificates the tests generate.

pika, aio-pika, kombu and amqplib each publish and get a message over TLS; the management API
reports the session as RabbitMQ does; TLS 1.1 is refused by default; a TLS-only broker works.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import aio_pika
import kombu
import pika
import pytest

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, free_port, launch
from interop_tests.node_runner import run_scenario
from interop_tests.tls_helpers import TlsFiles, aio_pika_round_trip, amqps_url, make_tls_files, tls_args, tls_config, tls_ports

pytestmark = pytest.mark.timeout(90)
GUEST_AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("tls")
    files = make_tls_files(workdir / "certs")
    ports = tls_ports()
    process = launch(workdir / "broker", tls_config(files, TEST_CONFIG), tls_args(ports))
    try:
        yield process, files, ports
    finally:
        process.stop()


def https_get(url: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": GUEST_AUTH})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def pika_parameters(files: TlsFiles, port: int, **kwargs) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, ssl_options=pika.SSLOptions(files.client_context(), "localhost"),
                                     **kwargs)


def test_pika_publishes_and_gets_over_amqps(tls_broker):
    _process, files, ports = tls_broker
    connection = pika.BlockingConnection(pika_parameters(files, ports["amqps"]))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"over tls")
        _method, _properties, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"over tls"
    finally:
        connection.close()


def test_aio_pika_publishes_and_gets_over_amqps(tls_broker):
    _process, files, ports = tls_broker

    connect = lambda: aio_pika.connect(host="localhost", port=ports["amqps"], login="guest",  # noqa: E731
                                       password="guest", ssl=True, ssl_context=files.client_context())
    assert aio_pika_round_trip(connect, b"over tls") == b"over tls"


def test_kombu_publishes_and_gets_over_amqps(tls_broker):
    _process, files, ports = tls_broker
    ssl_options = {"ca_certs": str(files.ca_file), "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "localhost"}
    with kombu.Connection(f"amqp://guest:guest@localhost:{ports['amqps']}//", ssl=ssl_options) as connection:
        queue = kombu.Queue("", exclusive=True, channel=connection.default_channel)
        queue.declare()
        connection.default_channel.basic_publish(connection.default_channel.prepare_message(b"over tls"),
                                                 routing_key=queue.name)
        message = None
        for _ in range(50):
            message = queue.get(no_ack=True)
            if message is not None:
                break
        assert message is not None and message.body == b"over tls"


def test_amqplib_publishes_and_gets_over_amqps(tls_broker, monkeypatch):
    process, files, ports = tls_broker
    monkeypatch.setenv("AMQPS_CA", str(files.ca_file))
    report = run_scenario("tls_publish_get.js", amqps_url(process, ports["amqps"]))
    assert report["body"] == "over tls"


def test_management_connections_show_the_tls_session(tls_broker):
    _process, files, ports = tls_broker
    connection = pika.BlockingConnection(pika_parameters(files, ports["amqps"], client_properties={
        "connection_name": "tls-session-shown"}))
    try:
        status, body = https_get(f"https://localhost:{ports['https']}/api/connections", files.client_context())
        assert status == 200
        mine = [c for c in json.loads(body) if c.get("user_provided_name") == "tls-session-shown"]
        assert len(mine) == 1
        info = mine[0]
        assert info["ssl"] is True
        assert info["ssl_protocol"] in ("tlsv1.2", "tlsv1.3")
        assert info["ssl_cipher"] and info["ssl_hash"] and info["ssl_key_exchange"]
        assert info["peer_cert_subject"] is None  # no client certificate was sent
        assert info["port"] == ports["amqps"]
    finally:
        connection.close()


def test_overview_lists_tls_listeners_as_rabbitmq_names_them(tls_broker):
    process, files, ports = tls_broker
    status, body = https_get(f"https://localhost:{ports['https']}/api/overview", files.client_context())
    assert status == 200
    listeners = {(entry["protocol"], entry["port"]) for entry in json.loads(body)["listeners"]}
    assert {("amqp", process.port), ("amqp/ssl", ports["amqps"]), ("https", ports["https"]),
            ("https/prometheus", ports["metrics_https"])} <= listeners


def test_prometheus_is_served_over_https(tls_broker):
    _process, files, ports = tls_broker
    status, body = https_get(f"https://localhost:{ports['metrics_https']}/metrics", files.client_context())
    assert status == 200
    assert b"rabbitmq_connections" in body


def test_certificate_expiration_check_reads_the_listener_certificate(tls_broker):
    # The broker's certificate expires in 60 days (SERVER_CERT_LIFETIME).
    _process, files, ports = tls_broker
    base = f"https://localhost:{ports['https']}/api/health/checks/certificate-expiration"
    status, _ = https_get(f"{base}/1/months", files.client_context())
    assert status == 200
    status, body = https_get(f"{base}/3/months", files.client_context())
    assert status == 503
    failure = json.loads(body)
    assert failure["status"] == "failed"
    assert {entry["port"] for entry in failure["expired"]} >= {ports["amqps"], ports["https"]}


def test_tls_1_1_is_refused_by_default(tls_broker):
    _process, files, ports = tls_broker
    context = files.client_context()
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = ssl.TLSVersion.TLSv1_1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection(("127.0.0.1", ports["amqps"]), timeout=10) as raw:
        with pytest.raises(ssl.SSLError):
            with context.wrap_socket(raw, server_hostname="localhost"):
                pass


def test_a_tls_only_broker_has_no_plain_listener(tmp_path: Path):
    files = make_tls_files(tmp_path / "certs")
    ports = tls_ports()
    plain_port = free_port()
    config_path = tmp_path / "broker.toml"
    config_path.write_text(tls_config(files, TEST_CONFIG.replace("[server]\n", "[server]\ntcp_listener = false\n", 1)))
    # Started by hand: launch() waits for the plain port, which must stay closed here.
    process = BrokerProcess("127.0.0.1", ports["amqps"], tmp_path / "data", log_path=tmp_path / "broker.log", args=[
        "--host", "127.0.0.1", "--port", str(plain_port), "--data-dir", str(tmp_path / "data"),
        "--config", str(config_path), "--metrics-port", "0", "--management-port", "0", *tls_args(ports)])
    process.start()
    try:
        connection = pika.BlockingConnection(pika_parameters(files, ports["amqps"]))
        assert connection.is_open
        connection.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", plain_port), timeout=2).close()
    finally:
        process.stop()
