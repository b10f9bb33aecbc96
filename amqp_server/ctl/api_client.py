"""A small blocking client for the management HTTP API: JSON in, JSON out, basic auth.

Standard library only (urllib), so the CLI starts fast and needs nothing the broker does not.
"""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from amqp_server.ctl.exit_codes import EX_NOPERM, EX_UNAVAILABLE, CtlError


class ApiError(Exception):
    """The API answered with an error status; `error` and `reason` are RabbitMQ's JSON fields."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason


def quote(segment: str) -> str:
    """One path segment of an API URL: vhost "/" becomes "%2F", as the API expects."""
    return urllib.parse.quote(segment, safe="")


class ManagementClient:
    def __init__(self, host: str, port: int, username: str, password: str, timeout: float = 60.0) -> None:
        self.base_url = f"http://{host}:{port}"
        self.timeout = timeout
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._headers = {"Authorization": f"Basic {token}", "Accept": "application/json"}

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str, headers: dict[str, str] | None = None) -> Any:
        return self.request("DELETE", path, headers=headers)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """The decoded JSON reply (None for an empty one); ApiError for 4xx/5xx answers,
        CtlError when the API cannot be reached or refuses the credentials."""
        data = None
        all_headers = dict(self._headers)
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            raise self._api_error(error) from None
        except (urllib.error.URLError, ConnectionError, socket.timeout) as error:
            reason = getattr(error, "reason", error)
            raise CtlError(
                EX_UNAVAILABLE,
                f"unable to reach the management API at {self.base_url}/ ({reason}). "
                "Is the broker running, with its management port enabled (--management-port)?",
            ) from None
        return json.loads(payload) if payload.strip() else None

    def _api_error(self, error: urllib.error.HTTPError) -> Exception:
        try:
            body = json.loads(error.read() or b"{}")
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if error.code == 401:
            return CtlError(EX_NOPERM, f"the management API refused the credentials: {body.get('reason', 'unauthorized')}")
        return ApiError(error.code, str(body.get("error", error.reason)), str(body.get("reason", "")))
