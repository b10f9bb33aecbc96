"""The broker with fault-injection hooks for the replicated-queue race tests; the hooks live
here, in the test harness, never in the product.

`python -m interop_tests.replication_hooks_broker ARGS` runs the broker as `python -m
amqp_server ARGS` does. A hook is on while a file of its name exists next to the node's data
directory (``<--data-dir>/../<name>``, the node's working directory), so a test turns it on and off for one node at a time:

- ``hold-reattach``: the node's stand-ins of replicated queues see their owner as not serving
  the queue, so their consumers wait (parked) instead of consuming on a new leader; removed,
  the waiting consumers try again within a second (`RemoteQueue._retry_parked`).
"""

from __future__ import annotations

from pathlib import Path

from cluster.links.node_links import ClusterLinks

HOLD_REATTACH = "hold-reattach"


def _hook_on(name: str) -> bool:
    # The harness starts each node in the parent of its data directory (broker_process.launch).
    return (Path.cwd() / name).exists()


def install() -> None:
    """Put the hooks in place (in the node's process only, not in the test importing names)."""
    queue_available = ClusterLinks.queue_available

    def held_queue_available(self: ClusterLinks, vhost: str, queue: str, owner: str) -> bool:
        if _hook_on(HOLD_REATTACH):
            return False
        return queue_available(self, vhost, queue, owner)

    ClusterLinks.queue_available = held_queue_available  # type: ignore[method-assign]


if __name__ == "__main__":
    from amqp_server.runtime.cli import main

    install()
    raise SystemExit(main())
