"""What the management API checks about a request before it looks at the credentials.

A browser on an operator's machine can be made to send requests to the API by any web page:
a form posted to http://localhost:15672/api/definitions, or a page on a name the attacker
re-points at 127.0.0.1 (DNS rebinding), which the browser then treats as same-origin. Neither
can choose what the browser puts in `Host` and `Origin`, and a form cannot send JSON; so:

- `Host` must name this API: an IP literal, `localhost` (or a `.localhost` name), this
  machine's host name, or one of `[management] allowed_hosts`. A rebinding page's requests
  carry the attacker's name and are refused (403).
- A state-changing request (anything but GET, HEAD and OPTIONS) that carries an `Origin` must
  come from the API's own host and port or one of `[management] allowed_origins` (403).
  Command-line clients send no `Origin`.
- Its body, if any, must be JSON (`Content-Type: application/json`, parameters such as
  charset allowed): a form can only send urlencoded, multipart or text/plain bodies. The reply
  is RabbitMQ's: 415 with an empty body.

docs/security.md ("Management API") describes each check and its settings.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import urllib.parse
from collections.abc import Iterable

from aiohttp import web

from amqp_server.management.api_errors import ApiError

log = logging.getLogger(__name__)

REPORTED_HOSTS_MAX = 64
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
JSON_MEDIA_TYPE = "application/json"
ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(authority: str) -> tuple[str, int | None]:
    """The name (lowercase, no trailing dot, IPv6 without brackets) and port of a `Host`
    header or an origin's authority; port None when absent or not a number."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        name, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        name, _, port_text = authority.partition(":")
    else:  # a bare name, or an unbracketed IPv6 address
        name, port_text = authority, ""
    return name.rstrip("."), int(port_text) if port_text.isdigit() else None


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    return True


def machine_names() -> frozenset[str]:
    """This machine's host name, full and first label ("vm.example.com" and "vm")."""
    name = socket.gethostname().lower().rstrip(".")
    return frozenset(n for n in (name, name.split(".")[0]) if n)


class RequestPolicy:
    """The `Host` names and web origins the API serves. `allowed_hosts` entries are names,
    ".domain" suffixes or "*"; `allowed_origins` entries are "scheme://host[:port]" or "*"
    (both as config.ManagementConfig validates them)."""

    def __init__(self, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = (),
                 own_names: Iterable[str] | None = None) -> None:
        hosts = set(allowed_hosts)
        self._any_host = ANY in hosts
        self._host_names = frozenset(hosts - {ANY}) | (machine_names() if own_names is None else frozenset(own_names))
        self._host_suffixes = tuple(name for name in self._host_names if name.startswith("."))
        origins = set(allowed_origins)
        self._any_origin = ANY in origins
        self._origins = frozenset(_origin_key(origin) for origin in origins - {ANY})
        self._reported_hosts: set[str] = set()

    def report_refused_host(self, host_header: str) -> None:
        """Log a refused Host once per name (at most REPORTED_HOSTS_MAX names), so an operator
        whose client uses a DNS name learns the setting from the broker log without a request
        flood writing one line each."""
        name, _port = split_host(host_header)
        if name in self._reported_hosts or len(self._reported_hosts) >= REPORTED_HOSTS_MAX:
            return
        self._reported_hosts.add(name)
        log.warning("management API: refused requests for Host %r; if clients use this name, add it to "
                    "[management] allowed_hosts", name)

    def allows_host(self, host_header: str | None) -> bool:
        """May a request with this `Host` be served? (None: no header, as HTTP/1.0 clients
        send; browsers always send one.)"""
        if host_header is None or self._any_host:
            return True
        name, _port = split_host(host_header)
        if _is_ip_literal(name) or name == "localhost" or name.endswith(".localhost"):
            return True
        if name in self._host_names:
            return True
        return any(name.endswith(suffix) or name == suffix[1:] for suffix in self._host_suffixes)

    def allows_origin(self, origin: str, host_header: str | None) -> bool:
        """May a page from `origin` change state through a request sent with `host_header`?"""
        if self._any_origin:
            return True
        key = _origin_key(origin)
        if key is None:  # "null" (sandboxed frames, file: pages) or garbage
            return False
        if key in self._origins:
            return True
        if host_header is None:
            return False
        scheme, name, port = key
        host_name, host_port = split_host(host_header)
        # Browsers leave the scheme's default port out of Host; a TLS proxy in front of the API
        # forwards "mq.example.com" for https://mq.example.com, so compare with the origin's scheme.
        return name == host_name and (host_port if host_port is not None else _DEFAULT_PORTS[scheme]) == port


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, with the scheme's default port filled in."""
    parts = urllib.parse.urlsplit(origin.strip().lower())
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return None
    name, port = split_host(parts.netloc)
    return parts.scheme, name, port if port is not None else _DEFAULT_PORTS[parts.scheme]


def host_not_allowed(host_header: str) -> ApiError:
    return ApiError(403, "forbidden",
                    f"Host '{host_header}' is not a name of this management API; "
                    "add it to [management] allowed_hosts (--management-allowed-hosts)")


def origin_not_allowed(origin: str) -> ApiError:
    return ApiError(403, "forbidden",
                    f"Origin '{origin}' may not change state through this management API; "
                    "add it to [management] allowed_origins (--management-allowed-origins)")


def check_host_and_origin(policy: RequestPolicy, request: web.Request) -> None:
    """Raise the 403 ApiError for a request from a name or a web page the API does not serve."""
    host = request.headers.get("Host")
    if host is not None and not policy.allows_host(host):
        policy.report_refused_host(host)
        raise host_not_allowed(host)
    origin = request.headers.get("Origin")
    if origin is not None and request.method not in SAFE_METHODS and not policy.allows_origin(origin, host):
        raise origin_not_allowed(origin)


def declares_json(request: web.Request) -> bool:
    """Does the request's Content-Type say `application/json` (any parameters, any case)?"""
    media_type = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    return media_type == JSON_MEDIA_TYPE


def json_body_refused(request: web.Request) -> bool:
    """Is this a state-changing request with a body not declared as JSON?

    A bodyless request passes whatever Content-Type it names, as in RabbitMQ: rabbitmqadmin and
    curl send none, aiohttp sends application/octet-stream, and some clients send their usual
    type on every DELETE. (POST /api/definitions is stricter, as RabbitMQ's: see definition_routes.)
    """
    return request.method not in SAFE_METHODS and request.body_exists and not declares_json(request)


def unsupported_media_type() -> web.Response:
    """RabbitMQ's answer: 415 with no body."""
    return web.Response(status=415)
