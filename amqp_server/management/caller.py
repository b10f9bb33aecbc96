"""Who is calling the management API, and what RabbitMQ's user tags let them see and do.

Basic auth against the broker's own users. As in RabbitMQ, users in `loopback_users` (guest)
are refused from other addresses with 401 "User can only log in via localhost"; unlike
RabbitMQ, an address that fails to log in too often gets 429 for a while (login_throttle.py).
The tags:

- no management tag: refused ("Not management user");
- `management` (and `policymaker`): the vhosts they have permissions on, and only their own
  connections, channels and consumers;
- `monitoring`: every vhost in the vhost list, every connection and channel, read-only; but,
  as in RabbitMQ 3.10, the queues, exchanges and bindings of a vhost only with permissions there;
- `administrator`: everything, including users, vhosts, permissions and definitions.

Creating, deleting, purging, publishing and getting on queues, exchanges and bindings is also
checked against the user's AMQP permissions (configure / write / read), as RabbitMQ does: the
tag alone does not grant them.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amqp_server.broker.access_control import AccessControl, AuthenticationFailed, LoopbackOnly, User, is_loopback_address
from amqp_server.management import api_errors
from amqp_server.management.login_throttle import LoginThrottle

if TYPE_CHECKING:
    from amqp_server.connection.connection import Connection

ADMINISTRATOR = "administrator"
MONITORING = "monitoring"
MANAGEMENT_TAGS = frozenset({"management", "policymaker", MONITORING, ADMINISTRATOR})


@dataclass
class Caller:
    user: User
    access: AccessControl

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def tags(self) -> list[str]:
        return list(self.user.tags)

    @property
    def is_admin(self) -> bool:
        return ADMINISTRATOR in self.user.tags

    @property
    def is_monitor(self) -> bool:
        return self.is_admin or MONITORING in self.user.tags

    def may_see_vhost(self, vhost: str) -> bool:
        """May the vhost itself appear in lists and totals?"""
        return self.is_monitor or self.access.can_access_vhost(self.user, vhost)

    def may_see_vhost_contents(self, vhost: str) -> bool:
        """May the vhost's queues, exchanges, bindings and consumers be shown?"""
        return self.is_admin or self.access.can_access_vhost(self.user, vhost)

    def may_see_connection(self, connection: "Connection") -> bool:
        return self.is_monitor or (connection.user is not None and connection.user.name == self.name)

    def require_admin(self) -> None:
        if not self.is_admin:
            raise api_errors.not_administrator()

    def require_vhost(self, vhost: str) -> None:
        """Acting in a vhost needs permissions there (administrators included, as in RabbitMQ)."""
        if not self.access.can_access_vhost(self.user, vhost):
            raise api_errors.access_refused()

    def require_vhost_contents(self, vhost: str) -> None:
        """Reading a vhost's queues, exchanges or bindings (see may_see_vhost_contents)."""
        if not self.may_see_vhost_contents(vhost):
            raise api_errors.vhost_not_authorised()

    def require_permission(self, kind: str, vhost: str, resource: str) -> None:
        """`kind` is "configure", "write" or "read"; `resource` an exchange or queue name."""
        if not self.access.is_permitted(self.user, vhost, kind, resource):
            raise api_errors.access_refused()


def authenticate(access: AccessControl, authorization: str | None, remote: str | None,
                 throttle: LoginThrottle) -> Caller:
    """The Caller for an `Authorization: Basic ...` header; ApiError otherwise: 401 as RabbitMQ
    answers, or 429 while `remote` has failed to log in too often (the password is then not
    checked). A request without credentials (a browser's first try) is not counted as a failure."""
    if not authorization or not authorization.lower().startswith("basic "):
        raise api_errors.login_failed()
    retry_after = throttle.retry_after(remote)
    if retry_after is not None:
        raise api_errors.too_many_failed_logins(retry_after)
    try:
        name, password = _basic_credentials(authorization)
    except AuthenticationFailed:
        throttle.record_failure(remote)
        raise api_errors.login_failed() from None
    return _verified(access, name, password, remote, throttle)


def check_credentials(access: AccessControl, name: str, password: str, remote: str | None,
                      throttle: LoginThrottle) -> Caller:
    """The Caller for a name and password, by the rules of `authenticate` (the web UI's login
    form comes here, so it meets the same throttle, loopback rule and tag rule)."""
    retry_after = throttle.retry_after(remote)
    if retry_after is not None:
        raise api_errors.too_many_failed_logins(retry_after)
    return _verified(access, name, password, remote, throttle)


def _verified(access: AccessControl, name: str, password: str, remote: str | None,
              throttle: LoginThrottle) -> Caller:
    try:
        user = access.authenticate("PLAIN", b"\0" + name.encode() + b"\0" + password.encode(),
                                   is_loopback_address(remote))
    except LoopbackOnly:
        raise api_errors.loopback_only() from None
    except AuthenticationFailed:
        throttle.record_failure(remote)
        raise api_errors.login_failed() from None
    return management_caller(user, access)


def management_caller(user: User, access: AccessControl) -> Caller:
    """The Caller for an authenticated user; 401 "Not management user" without a management tag."""
    if not MANAGEMENT_TAGS.intersection(user.tags):
        raise api_errors.not_management_user()
    return Caller(user, access)


def _basic_credentials(authorization: str) -> tuple[str, str]:
    """(name, password) of a Basic Authorization header; AuthenticationFailed if it is malformed."""
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationFailed("malformed Basic credentials") from None
    name, separator, password = decoded.partition(":")
    if not separator:
        raise AuthenticationFailed("malformed Basic credentials")
    return name, password
