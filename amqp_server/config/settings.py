"""Broker configuration: defaults, a TOML file, environment variables and flags.

Precedence for every setting: command-line flag > environment variable >
configuration file > built-in default. ``load_config`` returns a validated
``ServerConfig`` or raises ``ConfigError`` naming the offending key.
docs/configuration.md is the user-facing reference for all of it.
"""

from __future__ import annotations

import argparse
import os
import re
import ssl
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn, Sequence

from amqp_server.config.auth import HASHING_ALGORITHM, hash_password, is_valid_password_hash
from persistence.group_commit import parse_sync_mode
from queues.arguments.queue_defaults import QueueDefault, parse_entry

DEFAULT_USER = "guest"
DEFAULT_VHOST = "/"
FULL_ACCESS = ".*"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
FRAME_MIN_SIZE = 4096
# Offered in this order: RabbitMQ 3.10's connection.start lists "AMQPLAIN PLAIN".
DEFAULT_AUTH_MECHANISMS = ("AMQPLAIN", "PLAIN")
KNOWN_AUTH_MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")
MAX_MESSAGE_SIZE_LIMIT = 512 * 1024 * 1024  # RabbitMQ's hard ceiling for max_message_size

ENV_HOST = "AMQP_SERVER_HOST"
ENV_PORT = "AMQP_SERVER_PORT"
ENV_DATA_DIR = "AMQP_SERVER_DATA_DIR"
ENV_CONFIG = "AMQP_SERVER_CONFIG"
ENV_LOG_LEVEL = "AMQP_SERVER_LOG_LEVEL"
ENV_CLUSTER = "AMQP_SERVER_CLUSTER"
ENV_CLUSTER_SECRET = "AMQP_SERVER_CLUSTER_SECRET"
ENV_DEFINITIONS = "AMQP_SERVER_DEFINITIONS"
ENV_NODE_NAME = "AMQP_SERVER_NODE_NAME"
ENV_WORKERS = "AMQP_SERVER_WORKERS"
ENV_DEFAULT_QUEUE_TYPE = "AMQP_SERVER_DEFAULT_QUEUE_TYPE"
# What a durable, shared queue declared without x-queue-type becomes (RabbitMQ 3.13's default_queue_type).
QUEUE_TYPES = ("classic", "quorum")
MAX_WORKERS = 64
ENV_MANAGEMENT_ALLOWED_HOSTS = "AMQP_SERVER_MANAGEMENT_ALLOWED_HOSTS"
ENV_MANAGEMENT_ALLOWED_ORIGINS = "AMQP_SERVER_MANAGEMENT_ALLOWED_ORIGINS"
ENV_SSL_PORT = "AMQP_SERVER_SSL_PORT"
ENV_SSL_CERTFILE = "AMQP_SERVER_SSL_CERTFILE"
ENV_SSL_KEYFILE = "AMQP_SERVER_SSL_KEYFILE"
ENV_SSL_CACERTFILE = "AMQP_SERVER_SSL_CACERTFILE"


# The default host: every address, IPv6 and IPv4 alike, as RabbitMQ listens (one dual-stack
# socket; 0.0.0.0 where the machine has no IPv6).
ANY_ADDRESS = "::"
ANY_IPV4 = "0.0.0.0"


def advertised_host(host: str) -> str:
    """The host to name in a `host:port` other processes connect to: the IPv6 wildcard stands
    for this machine, as 0.0.0.0 always did."""
    return ANY_IPV4 if host == ANY_ADDRESS else host


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and its source."""


@dataclass
class UserConfig:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)


@dataclass
class PermissionConfig:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass
class LimitsConfig:
    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 134217728
    max_connections: int = 0  # 0 = unlimited; counts every socket, the whole broker
    max_connections_per_listener: int = 0  # 0 = unlimited; the same, each listener on its own
    # Body bytes of publishes still arriving that one connection may hold (declared sizes, all
    # channels); a single message of up to max_message_size is always allowed.
    max_content_in_flight: int = 268435456
    # RabbitMQ's tcp_listen_options.send_timeout: a client that takes no bytes for this long while
    # its output is over the bound is closed.
    send_timeout_ms: int = 15000
    # After a refused login the socket stays open this long, or until the client's close-ok, so
    # the client reads "access refused" rather than a reset (RabbitMQ: 3 s).
    refused_login_close_delay_ms: int = 3000
    # Resource alarms (docs/operations.md); RabbitMQ's defaults: 0.4 of RAM and 50 MB free disk.
    memory_high_watermark: float = 0.4  # fraction of total RAM (or the cgroup's limit)
    memory_high_watermark_bytes: int | None = None  # absolute; overrides the fraction when set
    disk_free_limit: int = 50_000_000


@dataclass
class StorageConfig:
    """How durable queues keep their segment files (docs/queue-files.md)."""

    fsync: str = "always"  # "always" | "batch-ms:N" | "never": what a confirm waits for
    archive: bool = False  # keep fully acked segments under data_dir/archive for analytics
    archive_vhosts: list[str] = field(default_factory=list)  # vhosts archived even when archive is off
    parquet_side_files: bool = False  # write a Parquet copy of each sealed segment for Spark (needs pyarrow)


@dataclass
class ManagementConfig:
    """[management]: how the HTTP API tells its own clients from a hostile web page, and how
    it slows password guessing (docs/security.md, "Management API")."""

    # Host header names served besides IP literals, "localhost" and this machine's name:
    # "mq.example.com", ".example.com" (that domain and its subdomains) or "*" (any).
    allowed_hosts: list[str] = field(default_factory=list)
    # Origins ("https://ops.example.com:8443", or "*") whose pages may change state, besides
    # pages served from the API's own host and port.
    allowed_origins: list[str] = field(default_factory=list)
    failed_login_limit: int = 10  # failed logins per client address per window, then 429; 0 = no limit
    failed_login_window: int = 60  # seconds


# What [tls] accepts. RabbitMQ's names for versions in ssl_options.versions (tls.py builds the
# context from them).
TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "tlsv1": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}
DEFAULT_TLS_VERSIONS = ("tlsv1.2", "tlsv1.3")
VERIFY_MODES = ("verify_none", "verify_peer")
CERT_LOGIN_SOURCES = ("common_name", "subject_alternative_name", "distinguished_name")


@dataclass
class TlsConfig:
    """`[tls]`: RabbitMQ's ssl_options and its TLS listeners (docs/security.md, "TLS").
    TLS is on once `certfile` and `keyfile` are set; a port of 0 leaves that listener off."""

    certfile: Path | None = None
    keyfile: Path | None = None
    cacertfile: Path | None = None
    password: str | None = None  # of an encrypted key file
    versions: list[str] = field(default_factory=lambda: list(DEFAULT_TLS_VERSIONS))
    ciphers: list[str] = field(default_factory=list)  # OpenSSL names; empty = OpenSSL's defaults
    honor_cipher_order: bool = True
    verify: str = "verify_none"
    fail_if_no_peer_cert: bool = False
    amqp_port: int = 5671
    management_port: int = 15671
    metrics_port: int = 15691
    # rabbitmq_auth_mechanism_ssl: EXTERNAL logs in the user named by the client certificate.
    ssl_cert_login_from: str = "common_name"

    @property
    def enabled(self) -> bool:
        return self.certfile is not None and self.keyfile is not None


@dataclass
class ClusterConfig:
    """Joining a cluster (docs/cluster.md); no url means this node runs alone."""

    url: str | None = None  # etcd://h:p,h:p/prefix or zookeeper://h:p,.../prefix
    node_name: str | None = None  # default amqp-server@<hostname>
    session_ttl: float = 5.0  # seconds until a killed node's membership key expires
    # What nodes log in to each other with (docs/cluster.md); None: the first node makes one
    # and keeps it in the coordination service.
    secret: str | None = None


def _default_users() -> list[UserConfig]:
    return [UserConfig(DEFAULT_USER, hash_password(DEFAULT_USER), ["administrator"])]


def _default_permissions() -> list[PermissionConfig]:
    return [PermissionConfig(DEFAULT_USER, DEFAULT_VHOST, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)]


@dataclass
class ServerConfig:
    """Everything the broker needs to start. ``ServerConfig()`` is a usable default:
    guest/guest (administrator, full permissions on "/"), vhost "/"."""

    host: str = ANY_ADDRESS  # every address, IPv6 and IPv4 (amqp_server/runtime/listening.py)
    port: int = 5672
    data_dir: Path = Path("data")
    log_level: str = "info"
    loopback_users: list[str] = field(default_factory=lambda: [DEFAULT_USER])
    users: list[UserConfig] = field(default_factory=_default_users)
    vhosts: list[str] = field(default_factory=lambda: [DEFAULT_VHOST])
    permissions: list[PermissionConfig] = field(default_factory=_default_permissions)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    storage: StorageConfig = field(default_factory=lambda: StorageConfig())
    management: ManagementConfig = field(default_factory=ManagementConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    # false: no plain AMQP listener (TLS only), as RabbitMQ's `listeners.tcp = none`
    tcp_listener: bool = True
    # SASL mechanisms offered, in order (RabbitMQ's auth_mechanisms); EXTERNAL needs TLS.
    auth_mechanisms: list[str] = field(default_factory=lambda: list(DEFAULT_AUTH_MECHANISMS))
    metrics_port: int = 15692
    management_port: int = 15672
    config_file: Path | None = None  # the TOML file read, if any
    # [[queue_defaults]]: lifecycle x-arguments by vhost and queue-name pattern (docs/lifecycle.md).
    queue_defaults: list[QueueDefault] = field(default_factory=list)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # [[shovels]]: static shovels, each {"name", "vhost", and a dynamic shovel's keys} (checked by
    # amqp_server/shovel/ when the broker starts: docs/shovel-federation.md).
    shovels: list[dict[str, Any]] = field(default_factory=list)
    # [definitions] load_file / --definitions: a RabbitMQ definitions file imported at every start.
    definitions_file: Path | None = None
    # Node processes on this host sharing the AMQP port, as one cluster (amqp_server/runtime/workers.py).
    workers: int = 1
    # "quorum": a durable, non-exclusive, non-auto-delete queue declared without x-queue-type is a
    # quorum (replicated) queue, as with RabbitMQ 3.13's default_queue_type (docs/replication.md).
    default_queue_type: str = "classic"
    # connection.update-secret: check that the new secret is the user's password (RabbitMQ's
    # internal backend accepts any secret; a backend whose secrets expire checks it).
    verify_updated_secret: bool = False


class _ArgumentParser(argparse.ArgumentParser):
    # Turn usage errors into ConfigError so load_config never exits the process.
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see --help)")


def build_arg_parser() -> argparse.ArgumentParser:
    """The broker's command-line flags. Unset flags are None so lower layers show through."""
    parser = _ArgumentParser(
        prog="amqp-server",
        description="A RabbitMQ-compatible AMQP 0-9-1 message broker.",
        epilog="Precedence: flag > environment variable > config file > default. "
        "See docs/configuration.md.",
    )
    parser.add_argument("--host", help=f"address to listen on (env {ENV_HOST}; default :: for every IPv6 and IPv4 "
                                       "address, 0.0.0.0 for IPv4 only)")
    parser.add_argument("--port", help=f"AMQP port (env {ENV_PORT}; default 5672)")
    parser.add_argument("--data-dir", help=f"directory for persistent state (env {ENV_DATA_DIR}; default ./data)")
    parser.add_argument("--config", metavar="FILE", help=f"TOML configuration file (env {ENV_CONFIG})")
    parser.add_argument("--log-level", help=f"one of {', '.join(LOG_LEVELS)} (env {ENV_LOG_LEVEL}; default info)")
    parser.add_argument("--metrics-port", help="Prometheus metrics port (default 15692, 0 disables)")
    parser.add_argument("--management-port", help="management HTTP port (default 15672, 0 disables)")
    parser.add_argument("--cluster", metavar="URL",
                        help=f"join the cluster at etcd://host:port,.../prefix or zookeeper://... (env {ENV_CLUSTER})")
    parser.add_argument("--node-name", help=f"this node's name (env {ENV_NODE_NAME}; default amqp-server@<hostname>)")
    parser.add_argument("--workers", metavar="N",
                        help=f"run N node processes sharing the AMQP port as a cluster; needs --cluster "
                        f"(env {ENV_WORKERS}; default 1)")
    parser.add_argument("--default-queue-type", metavar="TYPE",
                        help=f"type of a durable queue declared without x-queue-type: {' or '.join(QUEUE_TYPES)} "
                        f"(env {ENV_DEFAULT_QUEUE_TYPE}; default classic)")
    parser.add_argument("--definitions", metavar="FILE",
                        help=f"import this RabbitMQ definitions file at startup, as load_definitions does "
                        f"(env {ENV_DEFINITIONS})")
    parser.add_argument("--management-allowed-hosts", metavar="NAMES",
                        help=f"comma-separated Host names the management API answers besides IP addresses, "
                        f"localhost and this machine's name (env {ENV_MANAGEMENT_ALLOWED_HOSTS})")
    parser.add_argument("--management-allowed-origins", metavar="ORIGINS",
                        help=f"comma-separated web origins allowed to change state through the management API "
                        f"(env {ENV_MANAGEMENT_ALLOWED_ORIGINS})")
    parser.add_argument("--ssl-port", help=f"AMQPS port (env {ENV_SSL_PORT}; default 5671, 0 disables)")
    parser.add_argument("--ssl-certfile", help=f"server certificate (PEM) for TLS (env {ENV_SSL_CERTFILE})")
    parser.add_argument("--ssl-keyfile", help=f"its private key (PEM) (env {ENV_SSL_KEYFILE})")
    parser.add_argument("--ssl-cacertfile", help=f"CA certificates that sign client certificates (env {ENV_SSL_CACERTFILE})")
    parser.add_argument("--management-ssl-port", help="management HTTPS port (default 15671, 0 disables)")
    parser.add_argument("--metrics-ssl-port", help="Prometheus HTTPS port (default 15691, 0 disables)")
    return parser


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Build a validated ServerConfig from flags (``argv``, default sys.argv[1:]),
    ``environ`` (default os.environ) and the TOML file they name."""
    args = build_arg_parser().parse_args(argv)
    env = os.environ if environ is None else environ

    config_file = _first_set((args.config, "--config"), (env.get(ENV_CONFIG), ENV_CONFIG))
    document: dict[str, Any] = {}
    if config_file is not None:
        document = _read_toml(Path(config_file[0]).expanduser(), config_file[1])
    config = _from_document(document, str(config_file[0]) if config_file else "")
    if config_file is not None:
        config.config_file = Path(config_file[0]).expanduser().resolve()

    overrides: list[tuple[str, str | None, str]] = [
        ("host", env.get(ENV_HOST), ENV_HOST),
        ("port", env.get(ENV_PORT), ENV_PORT),
        ("data_dir", env.get(ENV_DATA_DIR), ENV_DATA_DIR),
        ("log_level", env.get(ENV_LOG_LEVEL), ENV_LOG_LEVEL),
        ("workers", env.get(ENV_WORKERS), ENV_WORKERS),
        ("default_queue_type", env.get(ENV_DEFAULT_QUEUE_TYPE), ENV_DEFAULT_QUEUE_TYPE),
        ("host", args.host, "--host"),
        ("port", args.port, "--port"),
        ("data_dir", args.data_dir, "--data-dir"),
        ("log_level", args.log_level, "--log-level"),
        ("metrics_port", args.metrics_port, "--metrics-port"),
        ("management_port", args.management_port, "--management-port"),
        ("workers", args.workers, "--workers"),
        ("default_queue_type", args.default_queue_type, "--default-queue-type"),
    ]
    _apply_overrides(config, _SERVER_KEYS, overrides)
    tls_overrides: list[tuple[str, str | None, str]] = [
        ("amqp_port", env.get(ENV_SSL_PORT), ENV_SSL_PORT),
        ("certfile", env.get(ENV_SSL_CERTFILE), ENV_SSL_CERTFILE),
        ("keyfile", env.get(ENV_SSL_KEYFILE), ENV_SSL_KEYFILE),
        ("cacertfile", env.get(ENV_SSL_CACERTFILE), ENV_SSL_CACERTFILE),
        ("amqp_port", args.ssl_port, "--ssl-port"),
        ("certfile", args.ssl_certfile, "--ssl-certfile"),
        ("keyfile", args.ssl_keyfile, "--ssl-keyfile"),
        ("cacertfile", args.ssl_cacertfile, "--ssl-cacertfile"),
        ("management_port", args.management_ssl_port, "--management-ssl-port"),
        ("metrics_port", args.metrics_ssl_port, "--metrics-ssl-port"),
    ]
    _apply_overrides(config.tls, _TLS_KEYS, tls_overrides)
    _check_tls(config)

    management_overrides = [
        ("allowed_hosts", env.get(ENV_MANAGEMENT_ALLOWED_HOSTS), ENV_MANAGEMENT_ALLOWED_HOSTS),
        ("allowed_origins", env.get(ENV_MANAGEMENT_ALLOWED_ORIGINS), ENV_MANAGEMENT_ALLOWED_ORIGINS),
        ("allowed_hosts", args.management_allowed_hosts, "--management-allowed-hosts"),
        ("allowed_origins", args.management_allowed_origins, "--management-allowed-origins"),
    ]
    for key, value, source in management_overrides:
        if value:
            names = [name.strip() for name in value.split(",") if name.strip()]
            setattr(config.management, key, _MANAGEMENT_KEYS[key](names, source))

    cluster_overrides = [
        ("url", env.get(ENV_CLUSTER), ENV_CLUSTER),
        ("node_name", env.get(ENV_NODE_NAME), ENV_NODE_NAME),
        ("secret", env.get(ENV_CLUSTER_SECRET), ENV_CLUSTER_SECRET),
        ("url", args.cluster, "--cluster"),
        ("node_name", args.node_name, "--node-name"),
    ]
    for key, value, source in cluster_overrides:
        if value:
            setattr(config.cluster, key, _CLUSTER_KEYS[key](value, source))
    for value, source in ((env.get(ENV_DEFINITIONS), ENV_DEFINITIONS), (args.definitions, "--definitions")):
        if value:
            config.definitions_file = _path(value, source)
    if config.definitions_file is not None:
        config.definitions_file = Path(config.definitions_file).expanduser().resolve()

    config.data_dir = Path(config.data_dir).expanduser().resolve()
    if config.workers > 1 and not config.cluster.url:
        # The workers are cluster nodes: they share definitions and reach each other's queues
        # through the coordination service, which this broker never replaces with one of its own.
        raise ConfigError(f"workers = {config.workers} needs a cluster: give --cluster etcd://host:port/prefix "
                          f"(or zookeeper://...), which the workers join as nodes (docs/cluster.md)")
    return config


def _apply_overrides(target: Any, validators: Mapping[str, Callable[[Any, str], Any]],
                     overrides: list[tuple[str, str | None, str]]) -> None:
    """Set each (key, text, source) on `target`, in order, so a later source wins."""
    for key, value, source in overrides:
        if value is None or value == "":  # an empty variable counts as unset
            continue
        setattr(target, key, validators[key](_coerce_text(key, value, source), source))


def _first_set(*candidates: tuple[str | None, str]) -> tuple[str, str] | None:
    for value, source in candidates:
        if value:
            return value, source
    return None


def _read_toml(path: Path, source: str) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} (from {source}) does not exist") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from None


def _coerce_text(key: str, value: str, source: str) -> Any:
    """Flags and environment variables are text; ports and counts must become integers."""
    if key.endswith("port") or key == "workers":
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{source} must be an integer, got {value!r}") from None
    return value


# ---- validators: each takes (value, where) and returns the clean value ----

def _fail(where: str, message: str) -> NoReturn:
    raise ConfigError(f"{where} {message}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        _fail(where, f"must be a string, got {type(value).__name__}")
    return value


def _nonempty_string(value: Any, where: str) -> str:
    text = _string(value, where)
    if not text:
        _fail(where, "must not be empty")
    return text


def _int_between(low: int, high: int | None) -> Callable[[Any, str], int]:
    def check(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(where, f"must be an integer, got {type(value).__name__}")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            _fail(where, f"must be {bound}, got {value}")
        return value
    return check


def _string_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(where, "must be a list of strings")
    return list(value)


def _tags(value: Any, where: str) -> list[str]:
    # RabbitMQ exports before 3.9 wrote tags as one comma-separated string.
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    return _string_list(value, where)


def _fraction(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        _fail(where, f"must be a number between 0 and 1, got {value!r}")
    return float(value)


# RabbitMQ's memory units (rabbitmq.conf: vm_memory_high_watermark.absolute, disk_free_limit.absolute).
_BYTE_UNITS = {
    "": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
}


def parse_byte_size(value: Any, where: str) -> int:
    """Bytes as an integer or a string with a unit: "50MB" (10^6), "2GiB" (2^30), "512k"."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _BYTE_UNITS:
            _fail(where, f"must be a byte count such as 50000000, \"50MB\" or \"2GiB\", got {value!r}")
        return int(match.group(1)) * _BYTE_UNITS[unit]
    return _int_between(0, None)(value, where)


def _log_level(value: Any, where: str) -> str:
    level = _string(value, where).lower()
    if level not in LOG_LEVELS:
        _fail(where, f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return level


def _path(value: Any, where: str) -> Path:
    return Path(_nonempty_string(value, where))


def _regex(value: Any, where: str) -> str:
    pattern = _string(value, where)
    try:
        re.compile(pattern)
    except re.error as err:
        _fail(where, f"is not a valid regular expression: {err}")
    return pattern


_PORT = _int_between(0, 65535)

_SERVER_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "host": _nonempty_string,
    "port": _PORT,
    "data_dir": _path,
    "log_level": _log_level,
    "loopback_users": _string_list,
    "metrics_port": _PORT,
    "management_port": _PORT,
    "tcp_listener": lambda value, where: _boolean(value, where),
    "auth_mechanisms": lambda value, where: _auth_mechanisms(value, where),
    "workers": _int_between(1, MAX_WORKERS),
    "default_queue_type": lambda value, where: _one_of(QUEUE_TYPES)(value, where),
    "verify_updated_secret": lambda value, where: _boolean(value, where),
}

_LIMIT_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "channel_max": _int_between(0, 65535),
    "frame_max": _int_between(FRAME_MIN_SIZE, 2**32 - 1),
    "heartbeat": _int_between(0, 65535),
    "max_message_size": _int_between(1, MAX_MESSAGE_SIZE_LIMIT),
    "max_connections": _int_between(0, None),
    "max_connections_per_listener": _int_between(0, None),
    "send_timeout_ms": _int_between(1, None),
    "refused_login_close_delay_ms": _int_between(0, 600_000),
    "max_content_in_flight": parse_byte_size,
    "memory_high_watermark": _fraction,
    "memory_high_watermark_bytes": parse_byte_size,
    "disk_free_limit": parse_byte_size,
}

def _fsync_mode(value: Any, where: str) -> str:
    text = _string(value, where)
    try:
        parse_sync_mode(text)
    except ValueError as err:
        _fail(where, str(err))
    return text


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        _fail(where, f"must be true or false, got {value!r}")
    return value


_STORAGE_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "fsync": _fsync_mode,
    "archive": _boolean,
    "parquet_side_files": _boolean,
}


def _allowed_hosts(value: Any, where: str) -> list[str]:
    """Host names as a browser sends them, lowercased: no scheme, port or path."""
    names = [name.lower().rstrip(".") for name in _string_list(value, where)]
    for name in names:
        if name != "*" and (not name or any(char in name for char in "/:@* ")):
            _fail(where, f"must hold host names such as \"mq.example.com\", \".example.com\" or \"*\", got {name!r}")
    return names


def _allowed_origins(value: Any, where: str) -> list[str]:
    """Web origins, normalised as browsers send them: scheme://host[:port], lowercased."""
    origins = [origin.lower().rstrip("/") for origin in _string_list(value, where)]
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/:@\s]+(:\d{1,5})?|https?://\[[0-9a-f:.]+\](:\d{1,5})?", origin):
            _fail(where, f"must hold origins such as \"https://ops.example.com\" or \"*\", got {origin!r}")
    return origins


_MANAGEMENT_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "allowed_hosts": _allowed_hosts,
    "allowed_origins": _allowed_origins,
    "failed_login_limit": _int_between(0, None),
    "failed_login_window": _int_between(1, None),
}


def _auth_mechanisms(value: Any, where: str) -> list[str]:
    names = _string_list(value, where)
    unknown = [n for n in names if n not in KNOWN_AUTH_MECHANISMS]
    if unknown or not names:
        _fail(where, f"must list some of {', '.join(KNOWN_AUTH_MECHANISMS)}, got {value!r}")
    return names


def _one_of(choices: Sequence[str]) -> Callable[[Any, str], str]:
    def check(value: Any, where: str) -> str:
        choice = _string(value, where)
        if choice not in choices:
            _fail(where, f"must be one of {', '.join(choices)}, got {value!r}")
        return choice
    return check


def _tls_versions(value: Any, where: str) -> list[str]:
    names = _string_list(value, where)
    if not names or any(n not in TLS_VERSIONS for n in names):
        _fail(where, f"must list some of {', '.join(TLS_VERSIONS)}, got {value!r}")
    return names


_TLS_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "certfile": _path,
    "keyfile": _path,
    "cacertfile": _path,
    "password": _string,
    "versions": _tls_versions,
    "ciphers": _string_list,
    "honor_cipher_order": _boolean,
    "verify": _one_of(VERIFY_MODES),
    "fail_if_no_peer_cert": _boolean,
    "amqp_port": _PORT,
    "management_port": _PORT,
    "metrics_port": _PORT,
    "ssl_cert_login_from": _one_of(CERT_LOGIN_SOURCES),
}


def _check_tls(config: ServerConfig) -> None:
    tls = config.tls
    if (tls.certfile is None) != (tls.keyfile is None):
        _fail("[tls]", "must set both certfile and keyfile, or neither")
    if tls.verify == "verify_peer" and tls.cacertfile is None and tls.enabled:
        _fail("[tls] verify", "= \"verify_peer\" needs cacertfile to check client certificates against")
    if not config.tcp_listener and not (tls.enabled and tls.amqp_port):
        _fail("[server] tcp_listener", "= false needs a TLS listener ([tls] certfile, keyfile, amqp_port)")


def _cluster_url(value: Any, where: str) -> str:
    text = _nonempty_string(value, where)
    # The address format is the cluster package's; that module is small and imports no client.
    from amqp_server.config.cluster_address import parse_cluster_address

    try:
        parse_cluster_address(text)
    except ValueError as err:
        _fail(where, str(err))
    return text


def _cluster_secret(value: Any, where: str) -> str:
    text = _nonempty_string(value, where)
    if len(text) < 16:
        _fail(where, "must be at least 16 characters (every node of the cluster uses the same)")
    return text


def _session_ttl(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 60:
        _fail(where, f"must be a number of seconds between 1 and 60, got {value!r}")
    return float(value)


_CLUSTER_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "url": _cluster_url,
    "node_name": _nonempty_string,
    "session_ttl": _session_ttl,
    "secret": _cluster_secret,
}

_SECTIONS = ("server", "limits", "storage", "management", "tls", "cluster", "definitions", "users", "vhosts",
             "permissions", "queue_defaults", "shovels")
_DEFINITIONS_KEYS: dict[str, Callable[[Any, str], Any]] = {"load_file": lambda value, where: _path(value, where)}


# ---- the TOML document ----

def _from_document(doc: dict[str, Any], file_name: str) -> ServerConfig:
    prefix = f"{file_name}: " if file_name else ""
    try:
        return _parse_document(doc)
    except ConfigError as err:
        raise ConfigError(f"{prefix}{err}") from None


def _parse_document(doc: dict[str, Any]) -> ServerConfig:
    _reject_unknown(doc, _SECTIONS, "top level has")
    config = ServerConfig()

    # Each section sets the attributes of its own part of the configuration, checked by its keys.
    for section, target, keys in (
        ("server", config, _SERVER_KEYS),
        ("limits", config.limits, _LIMIT_KEYS),
        ("storage", config.storage, _STORAGE_KEYS),
        ("management", config.management, _MANAGEMENT_KEYS),
        ("tls", config.tls, _TLS_KEYS),
        ("cluster", config.cluster, _CLUSTER_KEYS),
    ):
        table = _table(doc.get(section, {}), f"[{section}]")
        _reject_unknown(table, keys, f"[{section}] has")
        for key, value in table.items():
            setattr(target, key, keys[key](value, f"[{section}] {key}"))

    definitions = _table(doc.get("definitions", {}), "[definitions]")
    _reject_unknown(definitions, _DEFINITIONS_KEYS, "[definitions] has")
    if "load_file" in definitions:
        config.definitions_file = _DEFINITIONS_KEYS["load_file"](definitions["load_file"], "[definitions] load_file")

    vhost_entries = _array_of_tables(doc.get("vhosts", []), "vhosts")
    vhosts = _parse_vhosts(vhost_entries)
    config.storage.archive_vhosts = [
        entry["name"] for i, entry in enumerate(vhost_entries)
        if _boolean(entry.get("archive", False), f"vhosts[{i}] archive")
    ]
    users = _parse_users(_array_of_tables(doc.get("users", []), "users"))
    permissions = _parse_permissions(_array_of_tables(doc.get("permissions", []), "permissions"))
    config.queue_defaults = _parse_queue_defaults(_array_of_tables(doc.get("queue_defaults", []), "queue_defaults"))
    config.shovels = _parse_shovels(_array_of_tables(doc.get("shovels", []), "shovels"))

    config.vhosts = vhosts or [DEFAULT_VHOST]
    if users:
        config.users = users
    config.permissions = permissions
    if not users and not permissions:
        # Nothing configured: the development default, guest with full access to every vhost.
        config.permissions = [
            PermissionConfig(DEFAULT_USER, v, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS) for v in config.vhosts
        ]
    _check_references(config)
    return config


def _reject_unknown(table: Mapping[str, Any], known: Sequence[str] | Mapping[str, Any], where: str) -> None:
    unknown = [k for k in table if k not in known]
    if unknown:
        raise ConfigError(f"{where} unknown key {unknown[0]!r} (known: {', '.join(known)})")


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(where, "must be a table")
    return value


def _array_of_tables(value: Any, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        _fail(f"[[{name}]]", "must be an array of tables")
    return value


def _parse_vhosts(entries: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for i, entry in enumerate(entries):
        where = f"vhosts[{i}]"
        _reject_unknown(entry, ("name", "archive"), f"{where} has")
        if "name" not in entry:
            _fail(where, "is missing 'name'")
        name = _nonempty_string(entry["name"], f"{where} name")
        if name in names:
            _fail(where, f"repeats vhost {name!r}")
        names.append(name)
    return names


_USER_KEYS = ("name", "password_hash", "password", "hashing_algorithm", "tags")


def _parse_users(entries: list[dict[str, Any]]) -> list[UserConfig]:
    users: list[UserConfig] = []
    for i, entry in enumerate(entries):
        where = f"users[{i}]"
        _reject_unknown(entry, _USER_KEYS, f"{where} has")
        if "name" not in entry:
            _fail(where, "is missing 'name'")
        name = _nonempty_string(entry["name"], f"{where} name")
        where = f"users[{i}] ({name})"
        if any(u.name == name for u in users):
            _fail(where, "is defined twice")
        algorithm = entry.get("hashing_algorithm", HASHING_ALGORITHM)
        if algorithm != HASHING_ALGORITHM:
            _fail(f"{where} hashing_algorithm", f"must be {HASHING_ALGORITHM!r}, got {algorithm!r}")
        if ("password" in entry) == ("password_hash" in entry):
            _fail(where, "must set exactly one of 'password_hash' or 'password'")
        if "password" in entry:
            password_hash = hash_password(_string(entry["password"], f"{where} password"))
        else:
            password_hash = _string(entry["password_hash"], f"{where} password_hash")
            if not is_valid_password_hash(password_hash):
                _fail(f"{where} password_hash", "is not a rabbit_password_hashing_sha256 hash "
                      "(base64 of 4 salt bytes + 32 digest bytes)")
        tags = _tags(entry.get("tags", []), f"{where} tags")
        users.append(UserConfig(name, password_hash, tags))
    return users


_PERMISSION_KEYS = ("user", "vhost", "configure", "write", "read")


def _parse_permissions(entries: list[dict[str, Any]]) -> list[PermissionConfig]:
    permissions: list[PermissionConfig] = []
    for i, entry in enumerate(entries):
        where = f"permissions[{i}]"
        _reject_unknown(entry, _PERMISSION_KEYS, f"{where} has")
        missing = [k for k in _PERMISSION_KEYS if k not in entry]
        if missing:
            _fail(where, f"is missing {missing[0]!r}")
        user = _nonempty_string(entry["user"], f"{where} user")
        vhost = _nonempty_string(entry["vhost"], f"{where} vhost")
        patterns = [_regex(entry[k], f"{where} {k}") for k in ("configure", "write", "read")]
        if any(p.user == user and p.vhost == vhost for p in permissions):
            _fail(where, f"repeats permissions for user {user!r} on vhost {vhost!r}")
        permissions.append(PermissionConfig(user, vhost, *patterns))
    return permissions


def _parse_shovels(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each static shovel with its name and vhost ("/" when left out); its other keys are a
    dynamic shovel's, checked with RabbitMQ's texts when the broker starts (amqp_server/shovel/)."""
    shovels: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        where = f"shovels[{i}]"
        if "name" not in entry:
            _fail(where, "is missing 'name'")
        name = _nonempty_string(entry["name"], f"{where} name")
        vhost = _nonempty_string(entry.get("vhost", DEFAULT_VHOST), f"{where} vhost")
        if any(other["name"] == name and other["vhost"] == vhost for other in shovels):
            _fail(where, f"repeats shovel {name!r} in vhost {vhost!r}")
        shovels.append({**entry, "name": name, "vhost": vhost})
    return shovels


def _parse_queue_defaults(entries: list[dict[str, Any]]) -> list[QueueDefault]:
    try:
        return [parse_entry(entry, f"queue_defaults[{i}]") for i, entry in enumerate(entries)]
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _check_references(config: ServerConfig) -> None:
    user_names = {u.name for u in config.users}
    for i, p in enumerate(config.permissions):
        if p.user not in user_names:
            _fail(f"permissions[{i}] user", f"names user {p.user!r} that is not defined in [[users]]")
        if p.vhost not in config.vhosts:
            _fail(f"permissions[{i}] vhost", f"names vhost {p.vhost!r} that is not defined in [[vhosts]]")
