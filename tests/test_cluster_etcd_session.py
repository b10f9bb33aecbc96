"""The etcd backend's session: a lease that expired is replaced, even when etcd fails the first
attempt to grant the new one (the renewal task must not die of it, or the node's ephemeral keys
could never be held again)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid

import pytest

from cluster import connect, parse_cluster_address
from cluster.coordinator import CoordinationUnavailable
from interop_tests.coordination_services import start_etcd


def _revoke(client_url: str, lease_id: int) -> None:
    """What etcd does to a lease nobody renewed in time (a node cut off from etcd)."""
    request = urllib.request.Request(client_url + "/v3/lease/revoke", data=json.dumps({"ID": str(lease_id)}).encode(),
                                     method="POST")
    urllib.request.urlopen(request, timeout=5).close()


@pytest.mark.slow  # 5 s: a new etcd lease after a refused grant, then held past its TTL
def test_an_expired_lease_is_replaced_even_when_the_first_grant_fails(tmp_path):
    service = start_etcd(tmp_path / "etcd")
    try:
        async def scenario() -> None:
            coordinator = await connect(parse_cluster_address(service.url(f"s-{uuid.uuid4().hex[:6]}")), 2)
            try:
                real_call = coordinator._call
                refused: list[str] = []

                async def first_grant_refused(path, body, **options):
                    if path == "/v3/lease/grant" and not refused:
                        refused.append(path)
                        raise CoordinationUnavailable("etcd did not answer /v3/lease/grant (injected)")
                    return await real_call(path, body, **options)

                coordinator._call = first_grant_refused
                old_lease = coordinator._lease_id
                _revoke(service.etcd_members[0].client_url, old_lease)
                deadline = asyncio.get_running_loop().time() + 10
                while coordinator._lease_id == old_lease:
                    assert asyncio.get_running_loop().time() < deadline, (
                        f"no new lease within 10 s (grant attempts refused: {len(refused)})")
                    await asyncio.sleep(0.1)
                assert refused, "the first grant was not refused: the test did not test the retry"
                # The new session holds ephemeral keys beyond its TTL: it is being renewed.
                await coordinator.put("nodes/me", b"here", ephemeral=True)
                await asyncio.sleep(3)
                assert (await coordinator.get("nodes/me")).value == b"here"
            finally:
                await coordinator.close()

        asyncio.run(scenario())
    finally:
        service.stop()
