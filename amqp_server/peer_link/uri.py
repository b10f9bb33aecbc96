"""AMQP URIs as RabbitMQ's shovels and federation read them (amqp_client's amqp_uri).

    amqp://user:password@host:port/vhost?heartbeat=10&connection_timeout=30000
    amqps://user:password@host:port/vhost?cacertfile=/ca.pem&certfile=...&keyfile=...&verify=verify_peer

- the scheme is `amqp` or `amqps` (any other: `{unexpected_uri_scheme,"foo"}`);
- the port defaults to 5672 (`amqps`: 5671), and must be 1 to 65535;
- no path is vhost "/" (or the caller's default), a path "/name" is vhost "name" percent-decoded ("amqp://host/" is the
  vhost "", as the URI spec and RabbitMQ say), a path with a second "/" is refused;
- user and password default to guest and guest; percent-encoded characters are decoded;
- no host ("amqp://", "amqp:///vhost") is *this broker*, reached in-process, as RabbitMQ
  makes a direct connection (`PeerAddress.local`);
- query keys: heartbeat (s), connection_timeout (ms), channel_max, frame_max,
  auth_mechanism (plain, external), and for amqps cacertfile, certfile, keyfile,
  verify (verify_peer, verify_none), server_name_indication (a name, or "disable"); other
  keys are ignored, as RabbitMQ ignores them.

`InvalidUri` carries the reason in RabbitMQ's words, for the "not a valid URI" validation line.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

AMQP_PORT = 5672
AMQPS_PORT = 5671
# amqp_client's defaults for a network connection (amqp_params_network).
DEFAULT_HEARTBEAT_S = 10
DEFAULT_CONNECTION_TIMEOUT_MS = 60000
DEFAULT_FRAME_MAX = 131072
# amqp_client's plain and external (AMQPLAIN, the third, is not offered by this client).
MECHANISMS = {"plain": "PLAIN", "external": "EXTERNAL"}
_INTEGER_KEYS = ("heartbeat", "connection_timeout", "channel_max", "frame_max")
_VERIFY = ("verify_peer", "verify_none")


class InvalidUri(ValueError):
    """`reason`: why, as Erlang prints amqp_uri's error ({port_out_of_range,70000})."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f'"{uri}" not a valid URI: {{{reason},"{uri}"}}')
        self.uri = uri
        self.reason = reason


@dataclass(frozen=True)
class PeerAddress:
    """One broker to connect to, and how (see the module docstring)."""

    uri: str  # as given (with its credentials: never log or show it, use `redacted`)
    tls: bool
    host: str  # "" for this broker (in-process)
    port: int
    vhost: str
    username: str = "guest"
    password: str = "guest"
    heartbeat: int = DEFAULT_HEARTBEAT_S
    connection_timeout_ms: int = DEFAULT_CONNECTION_TIMEOUT_MS
    channel_max: int = 0
    frame_max: int = DEFAULT_FRAME_MAX
    mechanism: str = "PLAIN"
    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: str = "verify_peer"
    server_name: str | None = None  # SNI and the name checked against the certificate; "" disables SNI

    @property
    def local(self) -> bool:
        """This broker itself, reached in-process (a URI without a host)."""
        return not self.host

    @property
    def redacted(self) -> str:
        """The URI without its user information, as RabbitMQ shows it (amqp_uri:remove_credentials)."""
        scheme = "amqps" if self.tls else "amqp"
        if self.local:
            path = self.uri.split("://", 1)[1].split("?", 1)[0]
            return f"{scheme}://{path.rsplit('@', 1)[-1]}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        rest = self.uri.split("://", 1)[1]
        authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        return f"{scheme}://{host}:{self.port}{rest[authority_end:].split('?', 1)[0]}"

    @property
    def where(self) -> str:
        """host:port (or "this broker"), for messages."""
        return "this broker" if self.local else f"{self.host}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS client context an amqps URI asks for (None for amqp). OSError or
        ssl.SSLError when a certificate file cannot be read."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.cacertfile)
        if self.verify == "verify_none":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.certfile is not None:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context

    def tls_server_name(self) -> str | None:
        """What asyncio is told as server_hostname (None: no SNI, and no host name check)."""
        if not self.tls:
            return None
        if self.server_name == "":
            return None
        return self.server_name or self.host


def parse_uri(uri: Any, default_vhost: str = "/") -> PeerAddress:
    """The PeerAddress `uri` names; InvalidUri (RabbitMQ's reason) if it is not one. A URI
    without a path names `default_vhost` (a dynamic shovel's or upstream's own vhost, as
    RabbitMQ reads them)."""
    if not isinstance(uri, str):
        raise InvalidUri(str(uri), "expected_string_uri")
    scheme, separator, rest = uri.partition("://")
    if not separator:
        raise InvalidUri(uri, "{unable_to_parse_uri,no_scheme}")
    scheme = scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise InvalidUri(uri, f'{{unexpected_uri_scheme,"{scheme}"}}')
    tls = scheme == "amqps"
    rest, _, query_text = rest.partition("?")
    rest = rest.split("#", 1)[0]
    slash = rest.find("/")
    authority, path = (rest, None) if slash < 0 else (rest[:slash], rest[slash:])
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        userinfo, hostport = "", authority
    host, port = _host_and_port(uri, hostport)
    if not host and port is not None:
        raise InvalidUri(uri, "port_requires_host")
    if port is not None and not 0 < port <= 65535:
        raise InvalidUri(uri, f"{{port_out_of_range,{port}}}")
    if path is None:
        vhost = default_vhost
    else:
        name = path[1:]
        if "/" in name:
            raise InvalidUri(uri, f'{{invalid_vhost,"{name}"}}')
        vhost = _decoded(uri, name)
    options: dict[str, Any] = {}
    if userinfo:
        user, has_password, password = userinfo.partition(":")
        options["username"] = _decoded(uri, user)
        if has_password:
            options["password"] = _decoded(uri, password)
    query = parse_qsl(query_text, keep_blank_values=True)
    for key, value in query:
        if key in _INTEGER_KEYS:
            if not value.lstrip("-").isdigit():
                raise InvalidUri(uri, f'{{invalid_amqp_params_parameter,{key},"{value}",{{not_an_integer,"{value}"}}}}')
            options["connection_timeout_ms" if key == "connection_timeout" else key] = int(value)
        elif key == "auth_mechanism":
            mechanism = MECHANISMS.get(value.split(":")[-1].lower())
            if mechanism is None:
                raise InvalidUri(uri, f'{{unknown_mechanism,"{value}"}}')
            options["mechanism"] = mechanism
        elif tls and key in ("cacertfile", "certfile", "keyfile"):
            options[key] = value
        elif tls and key == "verify":
            if value not in _VERIFY:
                raise InvalidUri(uri, f'{{invalid_ssl_parameter,verify,"{value}",{{invalid_atom_parameter,"{value}"}}}}')
            options["verify"] = value
        elif tls and key == "server_name_indication":
            options["server_name"] = "" if value == "disable" else value
    return PeerAddress(uri=uri, tls=tls, host=host, port=port or (AMQPS_PORT if tls else AMQP_PORT), vhost=vhost,
                       **options)


def parse_uris(value: Any, default_vhost: str = "/") -> list[PeerAddress]:
    """A URI or a non-empty list of them (tried in order); InvalidUri for the first bad one,
    TypeError if `value` is neither a string nor a list."""
    if isinstance(value, str):
        return [parse_uri(value, default_vhost)]
    if isinstance(value, list) and value:
        return [parse_uri(item, default_vhost) for item in value]
    raise TypeError("expected a URI or a list of URIs")


def local_vhost_refused(broker: "Broker", user_name: str, uris: Iterable[str], default_vhost: str) -> list[str]:
    """RabbitMQ's check on a shovel or an upstream that `user_name` sets: a URI without a host
    reaches this broker as its in-process user, who may enter every vhost, so the user must be
    allowed into the vhost such a URI names. Its validation line, or [] (the URIs are valid)."""
    access = broker.access
    for uri in uris:
        address = parse_uri(uri, default_vhost)
        if not address.local:
            continue
        user = access.user(user_name)
        if user is None or address.vhost not in broker.vhosts or not access.can_access_vhost(user, address.vhost):
            return [f'user "{user_name}" may not connect to vhost "{address.vhost}"']
    return []


def _host_and_port(uri: str, hostport: str) -> tuple[str, int | None]:
    if hostport.startswith("["):  # an IPv6 address
        end = hostport.find("]")
        if end < 0:
            raise InvalidUri(uri, "{unable_to_parse_uri,unterminated_ipv6_address}")
        host, rest = hostport[1:end], hostport[end + 1:]
        if rest and not rest.startswith(":"):
            raise InvalidUri(uri, "{unable_to_parse_uri,malformed_authority}")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_or_empty = hostport.partition(":")
        port_text = port_text_or_empty if colon else None
    if port_text is None or port_text == "":
        return _decoded(uri, host), None
    if not port_text.isdigit():
        raise InvalidUri(uri, f'{{unable_to_parse_uri,{{malformed_uri,"{uri}",{{invalid_port,"{port_text}"}}}}}}')
    return _decoded(uri, host), int(port_text)


def _decoded(uri: str, text: str) -> str:
    index = text.find("%")
    while index >= 0:
        if len(text) < index + 3 or not all(c in "0123456789abcdefABCDEF" for c in text[index + 1:index + 3]):
            raise InvalidUri(uri, f'{{unterminated_entity,"{text[index:]}"}}')
        index = text.find("%", index + 3)
    return unquote(text)
