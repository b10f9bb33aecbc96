"""amqp_server/config/tls.py: the server context follows [tls] versions; the session names RabbitMQ's items."""

from __future__ import annotations

import socket
import ssl
import threading
import warnings
from pathlib import Path

import pytest
import trustme

from amqp_server.config.settings import TlsConfig
from amqp_server.config.tls import TlsListenerContext, _cipher_parts, build_server_context


@pytest.fixture
def tls_config(tmp_path: Path) -> tuple[TlsConfig, trustme.CA]:
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return TlsConfig(certfile=tmp_path / "cert.pem", keyfile=tmp_path / "key.pem", cacertfile=tmp_path / "ca.pem"), ca


def handshake_with_tls_1_1(server_context: ssl.SSLContext, ca_file: Path) -> str:
    """The version a TLS-1.1-only client negotiates with `server_context`, or the error."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                server_context.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                conn.close()

        thread = threading.Thread(target=serve)
        thread.start()
        client = ssl.create_default_context(cafile=str(ca_file))
        client.set_ciphers("DEFAULT:@SECLEVEL=0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            client.minimum_version = client.maximum_version = ssl.TLSVersion.TLSv1_1
        try:
            with client.wrap_socket(socket.create_connection(listener.getsockname()), server_hostname="localhost") as s:
                return s.version()
        except ssl.SSLError as error:
            return error.reason
        finally:
            thread.join()


def test_tls_1_1_is_refused_by_the_server_unless_versions_lists_it(tls_config) -> None:
    config, _ca = tls_config
    assert handshake_with_tls_1_1(build_server_context(config), config.cacertfile) == "TLSV1_ALERT_PROTOCOL_VERSION"
    config.versions = ["tlsv1.1", "tlsv1.2"]
    assert handshake_with_tls_1_1(build_server_context(config), config.cacertfile) == "TLSv1.1"


def test_reload_checks_the_new_files_before_using_them(tls_config, tmp_path: Path) -> None:
    config, _ca = tls_config
    listener = TlsListenerContext(config)
    (tmp_path / "cert.pem").write_text("garbage\n")
    with pytest.raises(ssl.SSLError):
        listener.reload()


@pytest.mark.parametrize("cipher, version, expected", [
    ("TLS_AES_256_GCM_SHA384", "TLSv1.3", ("any", "sha384")),
    ("ECDHE-RSA-AES256-GCM-SHA384", "TLSv1.2", ("ecdhe_rsa", "sha384")),
    ("AES128-SHA", "TLSv1.2", ("rsa", "sha")),
])
def test_key_exchange_and_hash_in_rabbitmqs_terms(cipher: str, version: str, expected: tuple[str, str]) -> None:
    assert _cipher_parts(cipher, version) == expected
