"""The management API's error replies, with RabbitMQ's status codes and JSON bodies.

Handlers raise `ApiError`; the middleware in app.py turns it (and the broker's own AMQPError)
into `{"error": ..., "reason": ...}` as RabbitMQ's management plugin answers.
"""

from __future__ import annotations

from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError

REALM = 'Basic realm="RabbitMQ Management"'


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        return {"error": self.error, "reason": self.reason}


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def vhost_not_found(status: int = 404) -> ApiError:
    """RabbitMQ's answer when a write names a vhost that does not exist (404 for declaring a queue,
    exchange or binding and for a definitions import, 400 for a vhost definitions export)."""
    return ApiError(status, "not_found" if status == 404 else "bad_request", "vhost_not_found")


def no_such(kind: str, name: str, vhost: str, prefix: str = "") -> ApiError:
    """404 naming the missing queue or exchange, as RabbitMQ reports it from the broker's own
    refusal (`prefix` "NOT_FOUND - " where RabbitMQ quotes the AMQP reply text whole)."""
    return ApiError(404, "not_found", f"{prefix}no {kind} '{name}' in vhost '{vhost}'")


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def login_failed() -> ApiError:
    return ApiError(401, "not_authorized", "Login failed")


def loopback_only() -> ApiError:
    """A user in `loopback_users` (guest by default) with the right password, from another address."""
    return ApiError(401, "not_authorised", "User can only log in via localhost")


def too_many_failed_logins(retry_after: int) -> ApiError:
    """Not in RabbitMQ: this address failed to log in too often (management/login_throttle.py)."""
    return ApiError(429, "too_many_requests",
                    f"Too many failed logins from this address; retry in {retry_after} s",
                    headers={"Retry-After": str(retry_after)})


def not_management_user() -> ApiError:
    return ApiError(401, "not_authorised", "Not management user")


def not_administrator() -> ApiError:
    return ApiError(401, "not_authorised", "Not administrator user")


def vhost_not_authorised() -> ApiError:
    return ApiError(401, "not_authorised", "User not authorised to access virtual host")


def access_refused() -> ApiError:
    return ApiError(401, "not_authorised", "Access refused.")


def not_stored(failure: str, error: Exception) -> ApiError:
    """A change the API made could not be stored (disk) or committed (the cluster's coordination
    service out of reach): it was undone, and the caller gets a 500 saying why."""
    return ApiError(500, "internal_server_error", f"{failure}: {error}")


def from_amqp_error(error: AMQPError) -> ApiError:
    """A broker refusal (inequivalent arguments, reserved names...) as the API reports it."""
    if error.code == errors.ACCESS_REFUSED:
        return access_refused()
    if error.code == errors.NOT_FOUND:
        return not_found()
    # RabbitMQ's reason is the explanation without the "PRECONDITION_FAILED - " prefix.
    return bad_request(error.explanation)
