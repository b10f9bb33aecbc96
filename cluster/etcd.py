"""The etcd backend: etcd v3's JSON gateway on the client port, over aiohttp.

Requests go to the first endpoint that answers; a refused or failed endpoint sends the request
to the next, so a three-member etcd keeps serving while one member (its leader included) is
down. The session is one etcd lease, renewed every third of its TTL by a background task.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any

import aiohttp

from amqp_server.config.cluster_address import ClusterAddress
from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, KeyValue, VersionConflict, WatchEvent,
)

log = logging.getLogger(__name__)

REQUEST_DEADLINE_S = 10.0  # how long one call keeps trying members (covers a leader election)
ATTEMPT_S = 5.0  # how long one member has to answer one request
# How long a member has to accept a connection: a member on the other side of a partition drops
# packets silently, and the next member is tried after this rather than after ATTEMPT_S.
CONNECT_S = 1.0
RETRY_PAUSE_S = 0.2
LIST_PAGE = 1000  # keys per range request when listing a directory


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _range_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdCoordinator(Coordinator):
    def __init__(self, address: ClusterAddress, session: aiohttp.ClientSession, session_ttl: float) -> None:
        self._endpoints = [f"http://{host}:{port}" for host, port in address.endpoints]
        self._root = address.prefix + "/"
        self._http = session
        self._ttl = max(2, round(session_ttl))  # etcd grants whole seconds, 2 at least
        self._lease_id = 0
        self._keepalive: asyncio.Task[None] | None = None
        self._give_up_at: float | None = None  # loop time after which calls fail at once (`hurry`)
        self._watching: dict[str, set[aiohttp.ClientResponse]] = {}  # member -> its open watch streams

    @classmethod
    async def open(cls, address: ClusterAddress, session_ttl: float) -> "EtcdCoordinator":
        coordinator = cls(address, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)), session_ttl)
        try:
            await coordinator._grant_lease()
        except BaseException:
            await coordinator._http.close()
            raise
        coordinator._keepalive = asyncio.create_task(coordinator._keep_lease_alive())
        return coordinator

    # ---- transport ----

    def hurry(self, within_s: float) -> None:
        self._give_up_at = asyncio.get_running_loop().time() + within_s

    async def _call(self, path: str, body: dict[str, Any], attempt_s: float = ATTEMPT_S) -> dict[str, Any]:
        """POST to the first member that answers within `attempt_s`, trying them in turn for
        REQUEST_DEADLINE_S (or until the `hurry` deadline)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REQUEST_DEADLINE_S
        if self._give_up_at is not None:
            deadline = min(deadline, self._give_up_at)
        last_error = "no endpoint"
        while True:
            for index, endpoint in enumerate(list(self._endpoints)):
                left = deadline - loop.time()
                if left <= 0 and self._give_up_at is not None:
                    raise CoordinationUnavailable(f"etcd did not answer {path} in time: {last_error}")
                try:
                    async with self._http.post(endpoint + path, json=body, timeout=aiohttp.ClientTimeout(
                            total=min(attempt_s, max(left, 0.1)), sock_connect=CONNECT_S)) as response:
                        reply: dict[str, Any] = await response.json(content_type=None)  # (JSON: Any)
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
                    last_error = f"{endpoint}: {error!r}"
                    self._member_failed(endpoint)
                    continue
                if response.status == 200:
                    if index:  # remember the member that answered, try it first next time
                        self._endpoints.insert(0, self._endpoints.pop(index))
                    return reply
                # 503 and friends: no leader yet, or this member is cut off; try another.
                last_error = f"{endpoint}: {response.status} {reply.get('error') or reply.get('message')}"
                self._member_failed(endpoint)
            if asyncio.get_running_loop().time() > deadline:
                raise CoordinationUnavailable(f"etcd did not answer {path}: {last_error}")
            await asyncio.sleep(RETRY_PAUSE_S)

    def _member_failed(self, endpoint: str) -> None:
        """A request to `endpoint` failed: the watches streaming from it may be as stuck (a
        member cut off by a partition keeps its streams open and silent): end them, so they
        resume on another member from their last revision."""
        for response in list(self._watching.get(endpoint, ())):
            response.close()

    def _key(self, key: str) -> bytes:
        return (self._root + key).encode()

    def _kv(self, item: dict[str, Any]) -> KeyValue:
        key = _unb64(item["key"]).decode()[len(self._root):]
        revision = int(item.get("mod_revision", 0))
        return KeyValue(key, _unb64(item.get("value")), revision, revision)

    # ---- the session lease ----

    async def _grant_lease(self) -> None:
        reply = await self._call("/v3/lease/grant", {"TTL": self._ttl})
        self._lease_id = int(reply["ID"])

    async def _keep_lease_alive(self) -> None:
        while True:
            await asyncio.sleep(self._ttl / 3)
            try:
                # Each member has a third of the TTL to answer: one cut off by a partition must
                # not hold the renewal until the lease expires (the next one is tried instead).
                reply = await self._call("/v3/lease/keepalive", {"ID": str(self._lease_id)},
                                         attempt_s=max(0.5, self._ttl / 3))
            except CoordinationUnavailable as error:
                log.warning("cannot renew the etcd session lease: %s", error)
                continue
            if not int(reply.get("result", {}).get("TTL", 0)):
                # Expired while we could not reach etcd: our ephemeral keys are gone. A new
                # lease lets new ephemeral writes work; their owners re-register them.
                log.warning("etcd session lease %x expired; granting a new one", self._lease_id)
                try:
                    await self._grant_lease()
                except CoordinationUnavailable as error:
                    # Out of reach again: this task must live on (it alone renews the session),
                    # and the next round finds the lease still expired and tries again.
                    log.warning("cannot grant a new etcd session lease yet: %s", error)

    # ---- keys ----

    async def get(self, key: str) -> KeyValue | None:
        reply = await self._call("/v3/kv/range", {"key": _b64(self._key(key))})
        kvs = reply.get("kvs") or []
        return self._kv(kvs[0]) if kvs else None

    def _put_request(self, key: str, value: bytes, ephemeral: bool) -> dict[str, Any]:
        request: dict[str, Any] = {"key": _b64(self._key(key)), "value": _b64(value)}
        if ephemeral:
            request["lease"] = str(self._lease_id)
        return request

    async def put(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        reply = await self._call("/v3/kv/put", self._put_request(key, value, ephemeral))
        return int(reply["header"]["revision"])

    def _compare(self, key: str, expected_version: int | None) -> dict[str, Any]:
        if expected_version is None:  # absent: its create revision is 0
            return {"key": _b64(self._key(key)), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        return {"key": _b64(self._key(key)), "target": "MOD", "result": "EQUAL",
                "mod_revision": str(expected_version)}

    async def _txn(self, key: str, expected_version: int | None, success: dict[str, Any]) -> dict[str, Any]:
        reply = await self._call("/v3/kv/txn", {
            "compare": [self._compare(key, expected_version)],
            "success": [success],
            "failure": [{"request_range": {"key": _b64(self._key(key))}}],
        })
        if not reply.get("succeeded"):
            kvs = reply["responses"][0]["response_range"].get("kvs") or []
            raise VersionConflict(key, self._kv(kvs[0]) if kvs else None)
        return reply

    async def compare_and_set(self, key: str, value: bytes, expected_version: int | None, *,
                              ephemeral: bool = False) -> int:
        reply = await self._txn(key, expected_version, {"request_put": self._put_request(key, value, ephemeral)})
        return int(reply["header"]["revision"])

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        request = {"request_delete_range": {"key": _b64(self._key(key))}}
        if expected_version is None:
            reply = await self._call("/v3/kv/deleterange", request["request_delete_range"])
            return int(reply.get("deleted", 0)) > 0
        reply = await self._txn(key, expected_version, request)
        return int(reply["responses"][0]["response_delete_range"].get("deleted", 0)) > 0

    def _directory_range(self, directory: str) -> tuple[bytes, bytes]:
        start = self._key(directory.strip("/") + "/")
        return start, _range_end(start)

    def _directly_in(self, directory: str, key: str) -> bool:
        return "/" not in key[len(directory.strip("/")) + 1:]

    async def list(self, directory: str) -> tuple[list[KeyValue], int]:
        # In pages, all at the first page's revision: one consistent listing, however many keys
        # (10,000 bindings would not fit one gRPC message of the gateway).
        start, end = self._directory_range(directory)
        request: dict[str, Any] = {"key": _b64(start), "range_end": _b64(end), "limit": str(LIST_PAGE)}
        items: list[KeyValue] = []
        revision = 0
        while True:
            reply = await self._call("/v3/kv/range", request)
            kvs = reply.get("kvs") or []
            items += [self._kv(item) for item in kvs]
            if not revision:
                revision = int(reply["header"]["revision"])
                request["revision"] = str(revision)
            if not reply.get("more") or not kvs:
                break
            request["key"] = _b64(_unb64(kvs[-1]["key"]) + b"\0")
        return [kv for kv in items if self._directly_in(directory, kv.key)], revision

    async def watch(self, directory: str, after_revision: int,
                    known_keys: Collection[str] | None = None) -> AsyncIterator[WatchEvent]:
        # etcd replays its own history, deletions included: known_keys is not needed.
        start, end = self._directory_range(directory)
        next_revision = after_revision + 1
        while True:
            try:
                async for event in self._watch_stream(start, end, next_revision):
                    next_revision = event.revision + 1
                    if self._directly_in(directory, event.key):
                        yield event
            except (aiohttp.ClientError, asyncio.TimeoutError, CoordinationUnavailable) as error:
                # The member we watched died: resume on another from where we were.
                log.info("etcd watch on %s broke (%s); resuming at revision %d", directory, error, next_revision)
                await asyncio.sleep(RETRY_PAUSE_S)

    async def _watch_stream(self, start: bytes, end: bytes, start_revision: int) -> AsyncIterator[WatchEvent]:
        request = {"create_request": {"key": _b64(start), "range_end": _b64(end),
                                      "start_revision": str(start_revision)}}
        endpoint = self._endpoints[0]
        try:
            async for event in self._watch_member(endpoint, request):
                yield event
        except (aiohttp.ClientError, asyncio.TimeoutError, CoordinationUnavailable):
            if self._endpoints[0] == endpoint:  # (a call may have put an answering member first)
                self._endpoints.append(self._endpoints.pop(0))
            raise

    async def _watch_member(self, endpoint: str, request: dict[str, Any]) -> AsyncIterator[WatchEvent]:
        async with self._http.post(endpoint + "/v3/watch", json=request,
                                   timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S)) as response:
            watching = self._watching.setdefault(endpoint, set())
            watching.add(response)
            try:
                async for event in self._events(response, request["create_request"]["start_revision"]):
                    yield event
            finally:
                watching.discard(response)

    async def _events(self, response: aiohttp.ClientResponse, start_revision: str) -> AsyncIterator[WatchEvent]:
        """The events of one watch stream, until it ends."""
        if response.status != 200:
            raise CoordinationUnavailable(f"etcd watch answered {response.status}")
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                message = json.loads(line)
                if "error" in message:
                    raise CoordinationUnavailable(f"etcd watch failed: {message['error']}")
                result = message.get("result", {})
                if int(result.get("compact_revision", 0)):
                    raise HistoryLost(f"etcd compacted history past revision {start_revision}")
                for item in result.get("events") or []:
                    kv = self._kv(item["kv"])
                    if item.get("type") == "DELETE":
                        yield WatchEvent(EventKind.DELETE, kv.key, b"", kv.revision)
                    else:
                        yield WatchEvent(EventKind.PUT, kv.key, kv.value, kv.revision)
        raise CoordinationUnavailable("etcd closed the watch stream")

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        for responses in self._watching.values():  # (their tasks are cancelled by their owners)
            for response in list(responses):
                response.close()
        try:
            await self._call("/v3/lease/revoke", {"ID": str(self._lease_id)})
        except CoordinationUnavailable:
            pass  # it expires on its own
        await self._http.close()
