"""Client certificates: SASL EXTERNAL login from the certificate's CN with pika, aio-pika, kombu
and amqplib; EXTERNAL offered only when enabled and only to a client with a verified certificate;
a listener with fail_if_no_peer_cert refuses a client without one."""

from __future__ import annotations

import json
import socket
import ssl
import urllib.parse
from pathlib import Path

import aio_pika
import kombu
import pika
import pika.exceptions
import pytest

from interop_tests.broker_process import TEST_CONFIG, launch
from interop_tests.node_runner import run_scenario
from interop_tests.tls_helpers import TlsFiles, aio_pika_round_trip, make_tls_files, tls_args, tls_config, tls_ports
from interop_tests.test_tls_listeners import https_get

pytestmark = pytest.mark.timeout(90)

EXTERNAL_CONFIG = TEST_CONFIG.replace("[server]\n", '[server]\nauth_mechanisms = ["EXTERNAL", "AMQPLAIN", "PLAIN"]\n', 1)


def start_broker(workdir: Path, config: str, tls_extra: str):
    files = make_tls_files(workdir / "certs")
    ports = tls_ports()
    return launch(workdir / "broker", tls_config(files, config, tls_extra), tls_args(ports)), files, ports


@pytest.fixture(scope="module")
def external_broker(tmp_path_factory: pytest.TempPathFactory):
    process, files, ports = start_broker(tmp_path_factory.mktemp("external"), EXTERNAL_CONFIG,
                                         'verify = "verify_peer"\nfail_if_no_peer_cert = false\n')
    try:
        yield process, files, ports
    finally:
        process.stop()


def external_parameters(files: TlsFiles, port: int, client_cert: Path | None, name: str = "") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(files.client_context(client_cert), "localhost"),
        client_properties={"connection_name": name} if name else None,
    )


def test_pika_logs_in_with_external_as_the_certificates_common_name(external_broker):
    _process, files, ports = external_broker
    connection = pika.BlockingConnection(
        external_parameters(files, ports["amqps"], files.client_cert("limited"), name="cert-login"))
    try:
        channel = connection.channel()
        # "limited" may only configure queues named limited-*: the broker knows who logged in.
        channel.queue_declare("limited-external", exclusive=True)
        status, body = https_get(f"https://localhost:{ports['https']}/api/connections", files.client_context())
        assert status == 200
        mine = [c for c in json.loads(body) if c.get("user_provided_name") == "cert-login"][0]
        assert (mine["user"], mine["auth_mechanism"], mine["ssl"]) == ("limited", "EXTERNAL", True)
        assert mine["peer_cert_subject"].startswith("CN=limited")
        assert "amqp-server tests" in mine["peer_cert_issuer"]
        assert " - " in mine["peer_cert_validity"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("not-limited-external", exclusive=True)
        assert refused.value.reply_code == 403
    finally:
        if connection.is_open:
            connection.close()


def test_a_certificate_naming_an_unknown_user_is_refused(external_broker):
    _process, files, ports = external_broker
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(external_parameters(files, ports["amqps"], files.client_cert("nobody")))
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(refused.value)


def test_external_is_not_offered_to_a_client_without_a_certificate(external_broker):
    _process, files, ports = external_broker
    # pika refuses locally when the server does not offer EXTERNAL.
    with pytest.raises(pika.exceptions.AuthenticationError):
        pika.BlockingConnection(external_parameters(files, ports["amqps"], None))
    # Password logins still work without a certificate on a verify_peer listener without fail_if_no_peer_cert.
    plain = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["amqps"], ssl_options=pika.SSLOptions(files.client_context(), "localhost")))
    plain.close()


def test_external_is_not_offered_on_a_plain_listener(external_broker):
    process, _files, _ports = external_broker
    with pytest.raises(pika.exceptions.AuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", process.port, credentials=pika.credentials.ExternalCredentials()))


def test_aio_pika_logs_in_with_external(external_broker):
    _process, files, ports = external_broker
    client_pem = files.client_cert("guest")
    query = urllib.parse.urlencode({"auth": "external", "cafile": str(files.ca_file), "certfile": str(client_pem),
                                    "keyfile": str(client_pem)})

    url = f"amqps://localhost:{ports['amqps']}/?{query}"
    assert aio_pika_round_trip(lambda: aio_pika.connect(url), b"by certificate") == b"by certificate"


def test_kombu_logs_in_with_external(external_broker):
    _process, files, ports = external_broker
    client_pem = files.client_cert("guest")
    ssl_options = {"ca_certs": str(files.ca_file), "certfile": str(client_pem), "keyfile": str(client_pem),
                   "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "localhost"}
    with kombu.Connection(f"amqp://localhost:{ports['amqps']}//", ssl=ssl_options,
                          login_method="EXTERNAL") as connection:
        connection.connect()
        queue = kombu.Queue("", exclusive=True, channel=connection.default_channel)
        queue.declare()
        assert queue.name


def test_amqplib_logs_in_with_external(external_broker, monkeypatch):
    _process, files, ports = external_broker
    monkeypatch.setenv("AMQPS_CA", str(files.ca_file))
    monkeypatch.setenv("AMQPS_CLIENT_PEM", str(files.client_cert("guest")))
    monkeypatch.setenv("AMQPS_EXTERNAL", "1")
    report = run_scenario("tls_publish_get.js", f"amqps://localhost:{ports['amqps']}/%2F")
    assert report["body"] == "over tls"


def test_external_is_not_offered_unless_enabled(tmp_path: Path):
    process, files, ports = start_broker(tmp_path, TEST_CONFIG, 'verify = "verify_peer"\n')
    try:
        with pytest.raises(pika.exceptions.AuthenticationError):
            pika.BlockingConnection(external_parameters(files, ports["amqps"], files.client_cert("guest")))
    finally:
        process.stop()


def amqp_greeting(context: ssl.SSLContext, port: int) -> bytes:
    """What a client gets for its protocol header over TLS: connection.start's first bytes, or
    b"refused" when the TLS session ends first (with TLS 1.3 the server's refusal of a client
    certificate arrives after the client's side of the handshake, so on the first read)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"AMQP\x00\x00\x09\x01")
                return tls.recv(7) or b"refused"
        except (ssl.SSLError, ConnectionResetError):
            return b"refused"


def test_fail_if_no_peer_cert_refuses_a_client_without_one(tmp_path: Path):
    process, files, ports = start_broker(tmp_path, TEST_CONFIG, 'verify = "verify_peer"\nfail_if_no_peer_cert = true\n')
    try:
        assert amqp_greeting(files.client_context(), ports["amqps"]) == b"refused"
        assert amqp_greeting(files.client_context(files.client_cert("guest")), ports["amqps"])[:1] == b"\x01"
        # The same client with a certificate gets in (password login).
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", ports["amqps"],
            ssl_options=pika.SSLOptions(files.client_context(files.client_cert("guest")), "localhost")))
        connection.close()
    finally:
        process.stop()
