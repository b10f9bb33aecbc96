"""Runtime users and permissions with RabbitMQ's semantics.

- A permission is three regular expressions (configure, write, read) per user
  per vhost, matched as an unanchored search like Erlang's ``re:run``; the
  empty pattern permits nothing. Patterns are compiled once, when set.
- A user may open a vhost when it has any permission entry there.
- A user listed in ``loopback_users`` may only log in from a loopback address.
- The default exchange (name "") is checked under the name "amq.default".
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from amqp_server.config.auth import (
    PASSWORD_MECHANISMS,
    SUPPORTED_MECHANISMS,
    SaslError,
    hash_password,
    parse_sasl_response,
    secret_text,
    verify_password,
)
from amqp_server.config.settings import ConfigError, PermissionConfig

if TYPE_CHECKING:
    from amqp_server.config.settings import ServerConfig

PERMISSION_KINDS = ("configure", "write", "read")
# The user another node of the cluster logs in as over its link (cluster_link.py), with the
# cluster secret as its password. It may do anything in every vhost; it is never listed,
# exported or stored, and without a cluster secret nobody can log in as it.
CLUSTER_LINK_USER = "amqp-server-cluster-link"
# The user of this broker's own in-process links (a shovel or federation link whose URI has no
# host, as RabbitMQ's direct connections): full access to every vhost, with a secret made for
# this process that never leaves it (admit_local_links).
LOCAL_LINK_USER = "amqp-server-local-link"


class AuthenticationFailed(Exception):
    """Login refused. ``reason`` is for the broker log; ``reply_text`` is what
    RabbitMQ tells the client in the 403 ACCESS_REFUSED connection.close."""

    def __init__(self, reason: str, mechanism: str = "PLAIN") -> None:
        super().__init__(reason)
        self.reason = reason
        self.mechanism = mechanism

    @property
    def reply_text(self) -> str:
        return (
            f"ACCESS_REFUSED - Login was refused using authentication mechanism {self.mechanism}. "
            "For details see the broker logfile."
        )


class UnsupportedMechanism(AuthenticationFailed):
    """The client chose a SASL mechanism the broker does not offer.
    RabbitMQ answers this with 503 COMMAND_INVALID rather than 403."""

    @property
    def reply_text(self) -> str:
        return f"COMMAND_INVALID - unknown authentication mechanism '{self.mechanism}'"


class LoopbackOnly(AuthenticationFailed):
    """The right password for a user in ``loopback_users``, from a non-loopback address."""


def is_loopback_address(host: str | None) -> bool:
    """Is this peer address loopback (127.0.0.0/8, ::1, or either IPv4-mapped on a dual-stack socket)?"""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)


class _CompiledPermission:
    """One user's patterns on one vhost, compiled once. None means "permits nothing"."""

    __slots__ = ("config", "_patterns")

    def __init__(self, config: PermissionConfig) -> None:
        self.config = config
        self._patterns: dict[str, re.Pattern[str] | None] = {
            kind: re.compile(getattr(config, kind)) if getattr(config, kind) else None for kind in PERMISSION_KINDS
        }

    def permits(self, kind: str, resource: str) -> bool:
        pattern = self._patterns[kind]
        return pattern is not None and pattern.search(resource) is not None


class AccessControl:
    """The broker's user database and permission checks (in memory)."""

    def __init__(self, loopback_users: Iterable[str] = ("guest",), verify_updated_secret: bool = False) -> None:
        self.loopback_users = frozenset(loopback_users)
        self._users: dict[str, User] = {}
        self._permissions: dict[tuple[str, str], _CompiledPermission] = {}
        self._cluster_secret: bytes | None = None
        # connection.update-secret checks the new secret is the password (off: RabbitMQ's internal backend).
        self.verify_updated_secret = verify_updated_secret
        self.cluster_link_user: User | None = None  # set by admit_cluster_links
        self._local_secret: bytes | None = None
        self.local_link_user: User | None = None  # set by admit_local_links

    @classmethod
    def from_config(cls, config: ServerConfig) -> AccessControl:
        access = cls(config.loopback_users, config.verify_updated_secret)
        for user in config.users:
            access.add_user(user.name, user.password_hash, user.tags)
        for p in config.permissions:
            if access.user(p.user) is None:
                raise ConfigError(f"permissions for user {p.user!r}: no such user")
            access.set_permissions(p.user, p.vhost, p.configure, p.write, p.read)
        return access

    # ---- users ----

    def add_user(self, name: str, password_hash: str, tags: Iterable[str] = ()) -> User:
        """Add a user; raises ValueError if it already exists (like rabbitmqctl add_user)."""
        if name in self._users:
            raise ValueError(f"user {name!r} already exists")
        user = User(name, password_hash, list(tags))
        self._users[name] = user
        return user

    def set_user(self, name: str, password_hash: str, tags: Iterable[str]) -> bool:
        """Create the user or replace its password hash and tags; True if it was created."""
        user = self._users.get(name)
        if user is None:
            self.add_user(name, password_hash, tags)
            return True
        user.password_hash = password_hash
        user.tags = list(tags)
        return False

    def delete_user(self, name: str) -> None:
        """Remove a user and all its permissions; raises KeyError if unknown."""
        if name not in self._users:
            raise KeyError(f"no such user {name!r}")
        del self._users[name]
        for key in [k for k in self._permissions if k[0] == name]:
            del self._permissions[key]

    def change_password(self, name: str, password: str) -> None:
        """Set a new plain-text password (stored hashed); raises KeyError if unknown."""
        user = self._users.get(name)
        if user is None:
            raise KeyError(f"no such user {name!r}")
        user.password_hash = hash_password(password)

    def user(self, name: str) -> User | None:
        return self._users.get(name)

    def users(self) -> list[User]:
        return list(self._users.values())

    # ---- permissions ----

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        """Grant (or replace) a user's patterns on a vhost.
        Raises KeyError for an unknown user, ValueError for an invalid pattern."""
        if user not in self._users:
            raise KeyError(f"no such user {user!r}")
        config = PermissionConfig(user, vhost, configure, write, read)
        try:
            compiled = _CompiledPermission(config)
        except re.error as err:
            raise ValueError(f"invalid permission pattern for user {user!r} on vhost {vhost!r}: {err}") from err
        self._permissions[(user, vhost)] = compiled

    def clear_permissions(self, user: str, vhost: str) -> None:
        self._permissions.pop((user, vhost), None)

    def permissions(self) -> list[PermissionConfig]:
        return [p.config for p in self._permissions.values()]

    def forget_vhost(self, vhost: str) -> None:
        """Drop every user's permissions on a deleted vhost, so a vhost later made under the
        same name starts with none (as RabbitMQ's vhost deletion does)."""
        for key in [k for k in self._permissions if k[1] == vhost]:
            del self._permissions[key]

    def admit_cluster_links(self, secret: str) -> None:
        """Let the cluster's other nodes log in as CLUSTER_LINK_USER with `secret`."""
        self._cluster_secret = secret.encode()
        self.cluster_link_user = User(CLUSTER_LINK_USER, "", [])

    def admit_local_links(self, secret: str) -> None:
        """Let this process's in-process links log in as LOCAL_LINK_USER with `secret`."""
        self._local_secret = secret.encode()
        self.local_link_user = User(LOCAL_LINK_USER, "", [])

    def _is_internal(self, user: User) -> bool:
        return user is not None and (user is self.cluster_link_user or user is self.local_link_user)

    # ---- checks ----

    def authenticate(self, mechanism: str, response: bytes | str, peer_is_loopback: bool) -> User:
        """Return the user a connection.start-ok response logs in as, or raise AuthenticationFailed."""
        if mechanism not in SUPPORTED_MECHANISMS:
            raise UnsupportedMechanism(f"unknown authentication mechanism {mechanism!r}", mechanism)
        try:
            name, password = parse_sasl_response(mechanism, response)
        except SaslError as err:
            raise AuthenticationFailed(f"{mechanism} login refused: {err}", mechanism) from err
        if name == CLUSTER_LINK_USER and self.cluster_link_user is not None and self._cluster_secret is not None:
            if hmac.compare_digest(password.encode("utf-8", "surrogateescape"), self._cluster_secret):
                return self.cluster_link_user
            raise AuthenticationFailed(f"{mechanism} login refused: user '{name}' - invalid credentials", mechanism)
        if name == LOCAL_LINK_USER and self.local_link_user is not None and self._local_secret is not None:
            if hmac.compare_digest(password.encode("utf-8", "surrogateescape"), self._local_secret):
                return self.local_link_user
            raise AuthenticationFailed(f"{mechanism} login refused: user '{name}' - invalid credentials", mechanism)
        user = self._users.get(name)
        if user is None:
            raise AuthenticationFailed(f"{mechanism} login refused: user '{name}' - invalid credentials", mechanism)
        if not verify_password(user.password_hash, password):
            raise AuthenticationFailed(f"{mechanism} login refused: user '{name}' - invalid credentials", mechanism)
        if name in self.loopback_users and not peer_is_loopback:
            raise LoopbackOnly(f"user '{name}' can only connect via localhost", mechanism)
        return user

    def authenticate_external(self, name: str | None, peer_is_loopback: bool) -> User:
        """SASL EXTERNAL (rabbitmq_auth_mechanism_ssl): log in as `name`, the user the client's
        verified certificate names; no password. Raise AuthenticationFailed if it names none."""
        if name is None:
            raise AuthenticationFailed("EXTERNAL login refused: the client certificate names no user", "EXTERNAL")
        user = self._users.get(name)
        if user is None:
            raise AuthenticationFailed(f"EXTERNAL login refused: user '{name}' - invalid credentials", "EXTERNAL")
        if name in self.loopback_users and not peer_is_loopback:
            raise LoopbackOnly(f"user '{name}' can only connect via localhost", "EXTERNAL")
        return user

    def check_new_secret(self, name: str, mechanism: str, secret: bytes | str) -> User:
        """The user `name` as it is now, for connection.update-secret on a connection that logged
        in as `name` with `mechanism`; else AuthenticationFailed. Only the password mechanisms have
        a secret to renew, and only a user that still exists may renew it. As RabbitMQ's internal
        user database, any new secret is accepted (it has nothing to re-check: the connection
        keeps its identity); with `verify_updated_secret` (the [server] setting of that name) the
        secret must be the user's password, as a backend whose secrets expire would check."""
        if mechanism not in PASSWORD_MECHANISMS:
            raise AuthenticationFailed(f"mechanism {mechanism} has no secret to update", mechanism)
        user = self._users.get(name)
        if user is None:
            raise AuthenticationFailed(f"user '{name}' no longer exists", mechanism)
        if self.verify_updated_secret and not verify_password(user.password_hash, secret_text(secret)):
            raise AuthenticationFailed(f"user '{name}' - invalid credentials", mechanism)
        return user

    def can_access_vhost(self, user: User, vhost: str) -> bool:
        if self._is_internal(user):
            return True
        return (user.name, vhost) in self._permissions and user.name in self._users

    def is_permitted(self, user: User, vhost: str, kind: str, resource: str) -> bool:
        """May ``user`` do ``kind`` ("configure", "write" or "read") on the
        exchange or queue named ``resource`` in ``vhost``?"""
        permission = self._permissions.get((user.name, vhost))
        if permission is None:
            return self._is_internal(user)
        return permission.permits(kind, resource or "amq.default")
