"""Configuration loading (defaults, TOML, env, flags) and the amqp-server command."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

from amqp_server.runtime import cli
from amqp_server.config.auth import verify_password
from amqp_server.config.settings import ConfigError, LimitsConfig, PermissionConfig, ServerConfig, load_config

RABBITMQ_HASH_OF_S3CRET = "Sq1v7NDvP6o5CX8uSgsKc8mSZ92Tma5g4XCDohtxFsXTf5Xz"


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def load(argv: list[str] | None = None, **env: str) -> ServerConfig:
    return load_config(argv or [], environ=env)


# ---- defaults ----

def test_defaults(in_tmp_dir: Path) -> None:
    config = load()
    assert (config.host, config.port, config.log_level) == ("::", 5672, "info")
    assert config.data_dir == in_tmp_dir / "data"
    assert config.loopback_users == ["guest"]
    assert config.limits == LimitsConfig(2047, 131072, 60, 134217728, 0)
    assert (config.metrics_port, config.management_port) == (15692, 15672)
    assert config.vhosts == ["/"]
    [guest] = config.users
    assert guest.name == "guest" and guest.tags == ["administrator"]
    assert verify_password(guest.password_hash, "guest")
    assert config.permissions == [PermissionConfig("guest", "/", ".*", ".*", ".*")]
    assert config.config_file is None


# ---- precedence: flag > env > file > default ----

def test_file_overrides_defaults(in_tmp_dir: Path) -> None:
    path = write_config(in_tmp_dir, '[server]\nport = 5800\nhost = "127.0.0.1"\nlog_level = "DEBUG"\n')
    config = load(["--config", path])
    assert (config.port, config.host, config.log_level) == (5800, "127.0.0.1", "debug")
    assert config.config_file == Path(path)


def test_env_overrides_file_and_flag_overrides_env(in_tmp_dir: Path) -> None:
    path = write_config(in_tmp_dir, "[server]\nport = 5800\ndata_dir = 'from-file'\n")
    config = load(["--config", path], AMQP_SERVER_PORT="5900", AMQP_SERVER_DATA_DIR="from-env")
    assert config.port == 5900 and config.data_dir == in_tmp_dir / "from-env"
    config = load(["--config", path, "--port", "6000", "--data-dir", "/srv/x"], AMQP_SERVER_PORT="5900")
    assert config.port == 6000 and config.data_dir == Path("/srv/x")


def test_config_file_from_env(in_tmp_dir: Path) -> None:
    path = write_config(in_tmp_dir, "[server]\nmetrics_port = 0\n")
    assert load(AMQP_SERVER_CONFIG=path).metrics_port == 0


def test_every_env_var(in_tmp_dir: Path) -> None:
    config = load(AMQP_SERVER_HOST="::1", AMQP_SERVER_PORT="5673", AMQP_SERVER_LOG_LEVEL="warning",
                  AMQP_SERVER_DATA_DIR="d")
    assert (config.host, config.port, config.log_level, config.data_dir) == ("::1", 5673, "warning", in_tmp_dir / "d")


def test_every_flag() -> None:
    config = load(["--host", "127.0.0.2", "--port", "0", "--data-dir", "/tmp/q", "--log-level", "error",
                   "--metrics-port", "9100", "--management-port", "9101"])
    assert (config.host, config.port, config.data_dir, config.log_level) == ("127.0.0.2", 0, Path("/tmp/q"), "error")
    assert (config.metrics_port, config.management_port) == (9100, 9101)


def test_empty_env_var_counts_as_unset() -> None:
    assert load(AMQP_SERVER_PORT="").port == 5672


def test_relative_data_dir_in_file_resolves_against_cwd(in_tmp_dir: Path) -> None:
    (in_tmp_dir / "etc").mkdir()
    path = in_tmp_dir / "etc" / "b.toml"
    path.write_text("[server]\ndata_dir = 'state'\n")
    assert load(["--config", str(path)]).data_dir == in_tmp_dir / "state"


# ---- users, vhosts, permissions ----

FULL_FILE = f"""
[server]
loopback_users = []

[limits]
channel_max = 100
frame_max = 4096
heartbeat = 0
max_message_size = 1048576
max_connections = 500

[[users]]
name = "admin"
password_hash = "{RABBITMQ_HASH_OF_S3CRET}"
tags = ["administrator"]

[[users]]
name = "dev"
password = "devpass"

[[vhosts]]
name = "/"

[[vhosts]]
name = "prod"

[[permissions]]
user = "admin"
vhost = "prod"
configure = ".*"
write = ".*"
read = ".*"

[[permissions]]
user = "dev"
vhost = "/"
configure = "^dev-"
write = ""
read = ".*"
"""


def test_full_file(in_tmp_dir: Path) -> None:
    config = load(["--config", write_config(in_tmp_dir, FULL_FILE)])
    assert config.loopback_users == []
    assert config.limits == LimitsConfig(100, 4096, 0, 1048576, 500)
    assert [u.name for u in config.users] == ["admin", "dev"]
    assert config.users[0].password_hash == RABBITMQ_HASH_OF_S3CRET
    assert verify_password(config.users[1].password_hash, "devpass")  # plain password hashed at load
    assert config.users[1].tags == []
    assert config.vhosts == ["/", "prod"]
    assert config.permissions[1] == PermissionConfig("dev", "/", "^dev-", "", ".*")


def test_users_without_permissions_get_none(in_tmp_dir: Path) -> None:
    config = load(["--config", write_config(in_tmp_dir, '[[users]]\nname = "a"\npassword = "b"\n')])
    assert config.permissions == []
    assert config.vhosts == ["/"]


def test_no_users_but_vhosts_gives_guest_access_to_each(in_tmp_dir: Path) -> None:
    config = load(["--config", write_config(in_tmp_dir, '[[vhosts]]\nname = "a"\n[[vhosts]]\nname = "b"\n')])
    assert [u.name for u in config.users] == ["guest"]
    assert [(p.user, p.vhost) for p in config.permissions] == [("guest", "a"), ("guest", "b")]


def test_rabbitmq_style_user_entry_is_accepted(in_tmp_dir: Path) -> None:
    text = (f'[[users]]\nname = "x"\npassword_hash = "{RABBITMQ_HASH_OF_S3CRET}"\n'
            'hashing_algorithm = "rabbit_password_hashing_sha256"\ntags = "administrator,monitoring"\n')
    [user] = load(["--config", write_config(in_tmp_dir, text)]).users
    assert user.tags == ["administrator", "monitoring"]


# ---- errors name the key ----

@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nprot = 1\n", "[server] has unknown key 'prot'"),
        ("[sever]\n", "top level has unknown key 'sever'"),
        ("[server]\nport = '5672'\n", "[server] port must be an integer, got str"),
        ("[server]\nport = true\n", "[server] port must be an integer, got bool"),
        ("[server]\nport = 70000\n", "[server] port must be between 0 and 65535, got 70000"),
        ("[server]\nlog_level = 'loud'\n", "[server] log_level must be one of"),
        ("[server]\nloopback_users = 'guest'\n", "[server] loopback_users must be a list of strings"),
        ("[limits]\nframe_max = 4095\n", "[limits] frame_max must be between 4096"),
        ("[limits]\nframe_max = 0\n", "[limits] frame_max must be between 4096"),
        ("[limits]\nheartbeat = -1\n", "[limits] heartbeat must be between 0"),
        ("[limits]\nmax_message_size = 0\n", "[limits] max_message_size must be between 1"),
        ("[limits]\nmax_connections = -1\n", "[limits] max_connections must be at least 0"),
        ("[limits]\nchanel_max = 1\n", "[limits] has unknown key 'chanel_max'"),
        ("[[users]]\npassword = 'x'\n", "users[0] is missing 'name'"),
        ("[[users]]\nname = 'a'\n", "users[0] (a) must set exactly one of 'password_hash' or 'password'"),
        ("[[users]]\nname = 'a'\npassword = 'x'\npassword_hash = ''\n", "exactly one of"),
        ("[[users]]\nname = 'a'\npassword_hash = 'abc'\n", "users[0] (a) password_hash is not a rabbit_password"),
        ("[[users]]\nname = 'a'\npassword = 'x'\npasword = 'y'\n", "users[0] has unknown key 'pasword'"),
        ("[[users]]\nname = 'a'\npassword = 'x'\nhashing_algorithm = 'rabbit_password_hashing_md5'\n",
         "hashing_algorithm must be"),
        ("[[users]]\nname = 'a'\npassword = 'x'\n[[users]]\nname = 'a'\npassword = 'y'\n", "users[1] (a) is defined twice"),
        ("[[vhosts]]\nname = ''\n", "vhosts[0] name must not be empty"),
        ("[[vhosts]]\nname = 'a'\n[[vhosts]]\nname = 'a'\n", "vhosts[1] repeats vhost 'a'"),
        ("vhosts = ['a']\n", "[[vhosts]] must be an array of tables"),
        ("[[permissions]]\nuser = 'nobody'\nvhost = '/'\nconfigure = ''\nwrite = ''\nread = ''\n",
         "permissions[0] user names user 'nobody' that is not defined"),
        ("[[permissions]]\nuser = 'guest'\nvhost = 'nowhere'\nconfigure = ''\nwrite = ''\nread = ''\n",
         "permissions[0] vhost names vhost 'nowhere' that is not defined"),
        ("[[permissions]]\nuser = 'guest'\nvhost = '/'\nconfigure = '('\nwrite = ''\nread = ''\n",
         "permissions[0] configure is not a valid regular expression"),
        ("[[permissions]]\nuser = 'guest'\nvhost = '/'\nconfigure = ''\nwrite = ''\n", "permissions[0] is missing 'read'"),
    ],
)
def test_invalid_file_names_the_key(in_tmp_dir: Path, text: str, message: str) -> None:
    path = write_config(in_tmp_dir, text)
    with pytest.raises(ConfigError) as info:
        load(["--config", path])
    assert message in str(info.value)
    assert str(info.value).startswith(path)


def test_missing_config_file(in_tmp_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml \(from AMQP_SERVER_CONFIG\) does not exist"):
        load(AMQP_SERVER_CONFIG=str(in_tmp_dir / "nope.toml"))


def test_invalid_toml_names_the_file(in_tmp_dir: Path) -> None:
    path = write_config(in_tmp_dir, "[server\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load(["--config", path])


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "abc"], {}, "--port must be an integer, got 'abc'"),
        ([], {"AMQP_SERVER_PORT": "x"}, "AMQP_SERVER_PORT must be an integer"),
        (["--port", "-1"], {}, "--port must be between 0 and 65535"),
        ([], {"AMQP_SERVER_LOG_LEVEL": "chatty"}, "AMQP_SERVER_LOG_LEVEL must be one of"),
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
    ],
)
def test_invalid_flag_or_env(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(argv, environ=env)
    assert message in str(info.value)


# ---- the amqp-server command ----

@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    """Stand in for amqp_server.runtime.server so the CLI can be tested without the network side."""
    calls: list[ServerConfig] = []
    module = types.ModuleType("amqp_server.runtime.server")
    root = logging.getLogger()
    # cli.main reconfigures the root logger; put it back for the other tests.
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)

    def run_server(config: ServerConfig) -> int:
        calls.append(config)
        return 0

    module.run_server = run_server  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "amqp_server.runtime.server", module)
    return calls


def test_cli_runs_server_with_loaded_config(fake_server: list[ServerConfig]) -> None:
    assert cli.main(["--port", "5999", "--log-level", "debug"]) == 0
    [config] = fake_server
    assert config.port == 5999
    assert logging.getLogger().level == logging.DEBUG


def test_cli_config_error_exits_2_with_message(fake_server: list[ServerConfig],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--port", "nope"]) == 2
    assert "--port must be an integer" in capsys.readouterr().err
    assert fake_server == []


def test_cli_returns_server_exit_code(fake_server: list[ServerConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["amqp_server.runtime.server"], "run_server", lambda config: 3)
    assert cli.main([]) == 3


def test_cli_log_lines_have_timestamp_level_and_logger(fake_server: list[ServerConfig],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["--log-level", "info"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    # e.g. "2024-05-01 12:00:00,123 INFO amqp_server.runtime.cli: starting on :::5672, ..."
    assert " INFO amqp_server.runtime.cli: starting on :::5672" in line
    assert line[:4].isdigit()



# ---- definitions at boot ----

def test_a_definitions_file_from_the_file_the_environment_or_the_flag(in_tmp_dir: Path) -> None:
    assert load().definitions_file is None
    path = write_config(in_tmp_dir, '[definitions]\nload_file = "from-file.json"\n')
    assert load(["--config", path]).definitions_file == in_tmp_dir / "from-file.json"
    assert load(["--config", path], AMQP_SERVER_DEFINITIONS="env.json").definitions_file == in_tmp_dir / "env.json"
    assert load(["--config", path, "--definitions", "/srv/defs.json"]).definitions_file == Path("/srv/defs.json")
    bad = write_config(in_tmp_dir, '[definitions]\nfile = "x.json"\n')
    with pytest.raises(ConfigError, match=r"\[definitions\] has unknown key 'file' \(known: load_file\)"):
        load(["--config", bad])


# ---- default_queue_type ----

def test_the_default_queue_type_is_classic() -> None:
    assert load().default_queue_type == "classic"


def test_the_default_queue_type_from_the_file_the_environment_or_the_flag(in_tmp_dir: Path) -> None:
    file = write_config(in_tmp_dir, "[server]\ndefault_queue_type = 'quorum'\n")
    assert load(["--config", file]).default_queue_type == "quorum"
    assert load(AMQP_SERVER_DEFAULT_QUEUE_TYPE="quorum").default_queue_type == "quorum"
    assert load(["--default-queue-type", "quorum"]).default_queue_type == "quorum"
    # flag > environment > file, as for every key
    assert load(["--config", file], AMQP_SERVER_DEFAULT_QUEUE_TYPE="classic").default_queue_type == "classic"
    assert load(["--default-queue-type", "classic"], AMQP_SERVER_DEFAULT_QUEUE_TYPE="quorum") \
        .default_queue_type == "classic"


@pytest.mark.parametrize(
    ("argv", "env", "text"),
    [
        (["--default-queue-type", "stream"], {}, "--default-queue-type must be one of classic, quorum, got 'stream'"),
        ([], {"AMQP_SERVER_DEFAULT_QUEUE_TYPE": "Quorum"}, "AMQP_SERVER_DEFAULT_QUEUE_TYPE must be one of"),
    ],
)
def test_an_unknown_default_queue_type_is_refused(argv: list[str], env: dict[str, str], text: str) -> None:
    with pytest.raises(ConfigError, match=text):
        load(argv, **env)


def test_an_unknown_default_queue_type_in_the_file_is_refused(in_tmp_dir: Path) -> None:
    file = write_config(in_tmp_dir, "[server]\ndefault_queue_type = 7\n")
    with pytest.raises(ConfigError, match=r"\[server\] default_queue_type must be a string"):
        load(["--config", file])
