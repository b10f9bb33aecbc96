"""The [management] settings: Host names and origins the API serves, and the failed-login limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_server.config.settings import ConfigError, ManagementConfig, load_config


def test_defaults_serve_only_local_names_and_limit_failed_logins() -> None:
    assert load_config([], environ={}).management == ManagementConfig(
        allowed_hosts=[], allowed_origins=[], failed_login_limit=10, failed_login_window=60)


def test_file_env_and_flags_set_them_normalised(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[management]\nallowed_hosts = ["MQ.Example.com.", ".corp"]\n'
                    'allowed_origins = ["https://Ops.example.com/"]\nfailed_login_limit = 3\nfailed_login_window = 5\n')
    from_file = load_config(["--config", str(path)], environ={}).management
    assert from_file == ManagementConfig(["mq.example.com", ".corp"], ["https://ops.example.com"], 3, 5)

    env = {"AMQP_SERVER_MANAGEMENT_ALLOWED_HOSTS": "env.example", "AMQP_SERVER_MANAGEMENT_ALLOWED_ORIGINS": "*"}
    from_env = load_config(["--config", str(path)], environ=env).management
    assert (from_env.allowed_hosts, from_env.allowed_origins, from_env.failed_login_limit) == (
        ["env.example"], ["*"], 3)

    flags = ["--config", str(path), "--management-allowed-hosts", "a.example, b.example",
             "--management-allowed-origins", "http://[::1]:8080"]
    from_flags = load_config(flags, environ=env).management
    assert (from_flags.allowed_hosts, from_flags.allowed_origins) == (["a.example", "b.example"], ["http://[::1]:8080"])


@pytest.mark.parametrize("text, message", [
    ('allowed_hosts = ["mq.example.com:15672"]', "[management] allowed_hosts must hold host names"),
    ('allowed_hosts = ["http://mq.example.com"]', "[management] allowed_hosts must hold host names"),
    ('allowed_hosts = ["*.example.com"]', "[management] allowed_hosts must hold host names"),
    ('allowed_origins = ["ops.example.com"]', "[management] allowed_origins must hold origins"),
    ('allowed_origins = ["https://ops.example.com/path"]', "[management] allowed_origins must hold origins"),
    ("failed_login_limit = -1", "[management] failed_login_limit must be at least 0"),
    ("failed_login_window = 0", "[management] failed_login_window must be at least 1"),
    ("allowed_host = []", "[management] has unknown key 'allowed_host'"),
])
def test_invalid_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(f"[management]\n{text}\n")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(["--config", str(path)], environ={})
