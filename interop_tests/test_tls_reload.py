"""The TLS certificate is replaced without a restart: `amqp-server ctl reload_certificates` or
SIGHUP. New connections (AMQPS and HTTPS) see the new certificate; open ones keep working."""

from __future__ import annotations

import io
import signal
import socket
import ssl
import time
from pathlib import Path

import pika
import pytest

from amqp_server.ctl.main import main as ctl_main
from interop_tests.broker_process import TEST_CONFIG, free_port, launch
from interop_tests.tls_helpers import TlsFiles, make_tls_files, tls_args, tls_config, tls_ports

pytestmark = pytest.mark.timeout(90)
WAIT_S = 10.0


def served_certificate(files: TlsFiles, port: int) -> bytes:
    """The DER certificate a new TLS connection to `port` is shown."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw:
        with files.client_context().wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


def der(leaf) -> bytes:
    return ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())


def ctl(management_port: int, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = ctl_main(["--port", str(management_port), *args], out=out, err=err)
    return code, out.getvalue() + err.getvalue()


def round_trip(connection: pika.BlockingConnection, body: bytes) -> bytes:
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, body)
    _method, _properties, received = channel.basic_get(queue, auto_ack=True)
    channel.close()
    return received


def start_tls_broker(tmp_path: Path):
    """A broker with TLS listeners and a plain management port for the ctl."""
    files = make_tls_files(tmp_path / "certs")
    ports = tls_ports()
    management = free_port()
    process = launch(tmp_path / "broker", tls_config(files, TEST_CONFIG),
                     (*tls_args(ports), "--management-port", str(management)))
    return process, files, ports, management


def test_reload_by_ctl_and_by_sighup_keeps_open_connections(tmp_path: Path):
    process, files, ports, management = start_tls_broker(tmp_path)
    try:
        first = served_certificate(files, ports["amqps"])
        old = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", ports["amqps"], ssl_options=pika.SSLOptions(files.client_context(), "localhost")))

        second = der(files.issue_server_cert())
        assert second != first
        assert served_certificate(files, ports["amqps"]) == first  # nothing changes until asked
        code, output = ctl(management, "reload_certificates")
        assert code == 0, output
        assert served_certificate(files, ports["amqps"]) == second
        assert served_certificate(files, ports["https"]) == second
        assert served_certificate(files, ports["metrics_https"]) == second
        assert round_trip(old, b"after ctl reload") == b"after ctl reload"

        third = der(files.issue_server_cert())
        process.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + WAIT_S
        while served_certificate(files, ports["amqps"]) != third:
            assert time.monotonic() < deadline, "SIGHUP did not reload the certificate"
            time.sleep(0.05)
        assert round_trip(old, b"after SIGHUP") == b"after SIGHUP"
        old.close()
        assert process.process.poll() is None  # SIGHUP did not stop the broker
    finally:
        process.stop()


def test_a_bad_certificate_file_is_refused_and_the_old_one_kept(tmp_path: Path):
    process, files, ports, management = start_tls_broker(tmp_path)
    try:
        before = served_certificate(files, ports["amqps"])
        files.cert_file.write_text("not a certificate\n")
        code, output = ctl(management, "reload_certificates")
        assert code != 0
        assert "certificates not reloaded" in output
        assert served_certificate(files, ports["amqps"]) == before
    finally:
        process.stop()


def test_sighup_without_tls_keeps_the_broker_running(tmp_path: Path):
    process = launch(tmp_path / "broker")
    try:
        process.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + WAIT_S
        while "no certificate to reload" not in process.log_text():
            assert process.process.poll() is None, "SIGHUP stopped the broker"
            assert time.monotonic() < deadline, "no log line for SIGHUP"
            time.sleep(0.05)
        connection = pika.BlockingConnection(pika.URLParameters(process.url()))
        assert connection.is_open
        connection.close()
    finally:
        process.stop()
