"""The [tls] section, its flags and environment variables, and the listener switches."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_server.config.settings import ConfigError, load_config


def load_file(tmp_path: Path, text: str, argv: list[str] | None = None, **env: str):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return load_config(["--config", str(path), *(argv or [])], environ=env)


def test_tls_is_off_by_default_with_rabbitmqs_defaults(tmp_path: Path) -> None:
    tls = load_config([], environ={}).tls
    assert not tls.enabled
    assert (tls.amqp_port, tls.management_port, tls.metrics_port) == (5671, 15671, 15691)
    assert tls.versions == ["tlsv1.2", "tlsv1.3"]
    assert (tls.verify, tls.fail_if_no_peer_cert) == ("verify_none", False)


def test_tls_section_sets_every_ssl_option(tmp_path: Path) -> None:
    config = load_file(tmp_path, """
[tls]
certfile = "server.pem"
keyfile = "server.key"
cacertfile = "ca.pem"
versions = ["tlsv1.3"]
ciphers = ["ECDHE-RSA-AES256-GCM-SHA384"]
honor_cipher_order = false
verify = "verify_peer"
fail_if_no_peer_cert = true
amqp_port = 5999
ssl_cert_login_from = "subject_alternative_name"
""")
    tls = config.tls
    assert tls.enabled and tls.certfile == Path("server.pem") and tls.cacertfile == Path("ca.pem")
    assert tls.versions == ["tlsv1.3"] and tls.ciphers == ["ECDHE-RSA-AES256-GCM-SHA384"]
    assert (tls.honor_cipher_order, tls.verify, tls.fail_if_no_peer_cert) == (False, "verify_peer", True)
    assert (tls.amqp_port, tls.ssl_cert_login_from) == (5999, "subject_alternative_name")


def test_flags_beat_environment_beats_file(tmp_path: Path) -> None:
    config = load_file(tmp_path, '[tls]\ncertfile = "file.pem"\nkeyfile = "file.key"\namqp_port = 1111\n',
                       ["--ssl-port", "3333", "--ssl-certfile", "flag.pem"],
                       AMQP_SERVER_SSL_PORT="2222", AMQP_SERVER_SSL_KEYFILE="env.key")
    assert (config.tls.amqp_port, config.tls.certfile, config.tls.keyfile) == (3333, Path("flag.pem"), Path("env.key"))


@pytest.mark.parametrize("text, message", [
    ('[tls]\ncertfile = "a.pem"\n', "must set both certfile and keyfile"),
    ('[tls]\nversions = ["sslv3"]\n', "[tls] versions must list some of"),
    ('[tls]\nverify = "verify_always"\n', "[tls] verify must be one of"),
    ('[tls]\ncertfile = "a"\nkeyfile = "b"\nverify = "verify_peer"\n', "needs cacertfile"),
    ('[tls]\nhonour_cipher_order = true\n', "unknown key 'honour_cipher_order'"),
    ('[server]\ntcp_listener = false\n', "needs a TLS listener"),
    ('[server]\nauth_mechanisms = ["KERBEROS"]\n', "auth_mechanisms must list some of"),
])
def test_invalid_tls_settings_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_file(tmp_path, text)
