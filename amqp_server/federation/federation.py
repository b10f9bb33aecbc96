"""The federation component: which links should run, and running them.

It registers the two runtime-parameter components (`federation-upstream`,
`federation-upstream-set`: their values are checked by upstreams.py) and watches the topology
(broker/topology_watch.py). Whenever an upstream, a set, a policy, an exchange or a queue
changes, it works out the links the vhost should have now: one per upstream of each exchange
and queue a federation policy applies to (upstreams.upstreams_for), and starts, restarts (its
upstream changed) or stops (for good: it cleans up the upstream) the links that differ. A
binding of a federated exchange is handed to its exchange links.

On a cluster a link runs on one node only, the one that holds its lease in the coordination
service (broker/cluster_interface.py `Leases`): every node knows every link, and a node that
gets a link's lease (its holder died or stopped) starts it. A queue link runs only where its
queue lives.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqp_server.broker import policy_application
from amqp_server.federation.demand import DEMAND_CHECK_S
from amqp_server.federation.links import ExchangeLink, Link, QueueLink
from amqp_server.federation.loops import is_federation_resource
from amqp_server.federation.status import EXCHANGE, QUEUE, LinkKey, LinkStatus
from amqp_server.federation.upstreams import (
    UPSTREAM_COMPONENT,
    UPSTREAM_SET_COMPONENT,
    Upstream,
    federates,
    safe_uri,
    upstream_problems,
    upstream_set_problems,
    upstreams_for,
)
from amqp_server.peer_link.client import LocalOpener
from amqp_server.peer_link.uri import local_vhost_refused
from queues.queue import Queue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.runtime_parameters import RuntimeParameter
    from amqp_server.broker.vhost import VirtualHost
    from exchanges.exchange import Exchange

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Wanted:
    """A link a vhost should have: its kind, its upstream as it applies, its policy."""

    kind: str
    name: str
    upstream: Upstream
    policy: str | None


class FederationComponent:
    """One runtime-parameter component of federation (broker/runtime_parameters.py); the
    management API finds the federation through it (`federation_of`)."""

    def __init__(self, federation: "Federation", component: str) -> None:
        self._federation = federation
        self._component = component

    @property
    def component(self) -> str:
        return self._component

    @property
    def federation(self) -> "Federation":
        return self._federation

    def validate(self, vhost: str, name: str, value: Any, user: str | None) -> list[str]:
        if self._component != UPSTREAM_COMPONENT:
            return upstream_set_problems(name, value)
        problems = upstream_problems(name, value)
        if problems or user is None:
            return problems
        uris = [value["uri"]] if isinstance(value["uri"], str) else value["uri"]
        return local_vhost_refused(self._federation.broker, user, uris, vhost)

    def parameter_set(self, parameter: "RuntimeParameter") -> None:
        self._federation.reconcile(parameter.vhost)

    def parameter_cleared(self, vhost: str, name: str) -> None:
        self._federation.reconcile(vhost)


class Federation:
    """See the module docstring. `local_opener` reaches this broker in-process (the downstream
    end of every link), logging in with `local_credentials`."""

    def __init__(self, broker: "Broker", local_opener: LocalOpener | None,
                 local_credentials: tuple[str, str] | None = None) -> None:
        self.broker = broker
        self._local_opener = local_opener
        self._local_credentials = local_credentials
        self._links: dict[LinkKey, Link] = {}
        self._wanted: dict[LinkKey, _Wanted] = {}
        self._components = (FederationComponent(self, UPSTREAM_COMPONENT), FederationComponent(self, UPSTREAM_SET_COMPONENT))
        self._started = False
        self._stopping: set[asyncio.Task[None]] = set()
        self._held: set[LinkKey] = set()  # on a cluster: the links whose lease this node holds
        self._demand_ticker: asyncio.Task[None] | None = None

    # -- what a link asks of its host (links.LinkHost) ------------------------------------------

    @property
    def cluster_name(self) -> str:
        return self.broker.cluster_name

    @property
    def local_opener(self) -> LocalOpener | None:
        return self._local_opener

    @property
    def local_credentials(self) -> tuple[str, str] | None:
        return self._local_credentials

    def vhost(self, name: str) -> "VirtualHost | None":
        return self.broker.vhosts.get(name)

    # -- starting and stopping -----------------------------------------------------------------

    def register_components(self) -> None:
        """Check and keep federation parameters from now on (before the broker restores them,
        or at start: those already kept are handed over)."""
        for component in self._components:
            self.broker.parameters.register(component)

    def start(self) -> None:
        """Run the links every federation policy asks for, and follow every change."""
        self._started = True
        self.register_components()
        self.broker.topology_watchers.watch(self)
        self._demand_ticker = asyncio.get_running_loop().create_task(self._tick_demand())
        for name in list(self.broker.vhosts):
            self.reconcile(name)

    async def _tick_demand(self) -> None:
        """One timer for every queue link's consumer demand (demand.py): each looks at its queue
        every DEMAND_CHECK_S, at the cost of a few attribute reads when nothing changed."""
        while True:
            await asyncio.sleep(DEMAND_CHECK_S)
            for link in list(self._links.values()):
                if isinstance(link, QueueLink):
                    link.check_demand()

    async def stop(self) -> None:
        """Stop every link; what they made upstream stays (the broker only stops)."""
        self._started = False
        self.broker.topology_watchers.unwatch(self)
        if self._demand_ticker is not None:
            self._demand_ticker.cancel()
            self._demand_ticker = None
        links, self._links = list(self._links.values()), {}
        placement = self.broker.link_placement
        if placement is not None:
            for key in self._wanted:
                placement.release(PLACEMENT_KIND, key.vhost, lease_name(key))
        self._wanted.clear()
        await asyncio.gather(*(link.stop(cleanup=False) for link in links), *self._stopping,
                             return_exceptions=True)

    # -- the links ---------------------------------------------------------------------------------

    @property
    def links(self) -> list[Link]:
        """The links running on this node."""
        return list(self._links.values())

    def link_list(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """The links running here, as /api/federation-links shows them (of one vhost, or all)."""
        node = self.broker.node_name
        return [self._links[key].status.as_json(node) for key in sorted(self._links, key=_order)
                if vhost is None or key.vhost == vhost]

    def elsewhere(self, vhost: str | None = None) -> list[tuple[LinkKey, str | None]]:
        """On a cluster, the links wanted here that another node runs (or none yet), with that
        node (None: no node holds its lease now)."""
        placement = self.broker.link_placement
        if placement is None:
            return []
        return [(key, placement.holder(PLACEMENT_KIND, key.vhost, lease_name(key)))
                for key in sorted(self._wanted, key=_order)
                if key not in self._links and (vhost is None or key.vhost == vhost)]

    def waiting_json(self, key: LinkKey, node: str | None) -> dict[str, Any]:
        """A link no node runs now (or whose node did not answer), as the listing shows it."""
        wanted = self._wanted[key]
        status = LinkStatus(key, safe_uri(wanted.upstream.uris[0]),
                            consumer_tag=wanted.upstream.consumer_tag if key.kind == QUEUE else None)
        return status.as_json(node or "")

    def restart(self, vhost: str, link_id: str) -> bool:
        """Restart the link of `vhost` with that id running here (its upstream resources stay);
        False if there is none."""
        for key, link in list(self._links.items()):
            if key.vhost == vhost and key.id == link_id:
                self._links.pop(key)
                self._in_background(self._restart(key, link))
                return True
        return False

    async def _restart(self, key: LinkKey, link: Link) -> None:
        await link.stop(cleanup=False)
        if self._started and key in self._wanted and key not in self._links and self._may_run(key):
            self._run(key)

    def reconcile(self, vhost_name: str) -> None:
        """Start, restart or stop links until the vhost has those its policies ask for."""
        if not self._started:
            return
        vhost = self.broker.vhosts.get(vhost_name)
        wanted: dict[LinkKey, _Wanted] = {}
        if vhost is not None:
            upstreams, sets = self._parameters(vhost_name)
            for exchange in list(vhost.exchanges.values()):
                wanted.update(self._exchange_links(vhost, exchange, upstreams, sets))
            for queue in list(vhost.queues.values()):
                wanted.update(self._queue_links(vhost, queue, upstreams, sets))
        self._apply(vhost_name, wanted, lambda key: True)

    def _apply(self, vhost_name: str, wanted: dict[LinkKey, _Wanted], in_scope: Any) -> None:
        """Make the links of `vhost_name` for which `in_scope(key)` holds be `wanted`."""
        for key in [key for key in self._wanted if key.vhost == vhost_name and in_scope(key)]:
            if key not in wanted:
                self._unwant(key)
            elif wanted[key] != self._wanted[key]:  # its upstream or policy changed: restart it
                self._wanted[key] = wanted[key]
                link = self._links.pop(key, None)
                if link is not None:
                    self._in_background(self._restart(key, link))
        for key, link_wanted in wanted.items():
            if key not in self._wanted:
                self._want(key, link_wanted)

    # A link wanted here runs once this node may run it: at once alone, under its lease on a
    # cluster (the lease's node runs it; another takes it over when that node dies).

    def _want(self, key: LinkKey, wanted: _Wanted) -> None:
        self._wanted[key] = wanted
        placement = self.broker.link_placement
        if placement is None:
            self._run(key)
            return
        self._held.discard(key)
        placement.place(PLACEMENT_KIND, key.vhost, lease_name(key), lambda: self._lease_changed(key, True),
                        lambda: self._lease_changed(key, False))

    def _lease_changed(self, key: LinkKey, held: bool) -> None:
        if held:
            self._held.add(key)
            if self._started and key in self._wanted and key not in self._links:
                self._run(key)
            return
        self._held.discard(key)
        link = self._links.pop(key, None)
        if link is not None:  # another node may run it now: stop at once, keep what is upstream
            self._in_background(link.stop(cleanup=False))

    def _may_run(self, key: LinkKey) -> bool:
        return self.broker.link_placement is None or key in self._held

    def _run(self, key: LinkKey) -> None:
        wanted = self._wanted[key]
        link_class = ExchangeLink if wanted.kind == EXCHANGE else QueueLink
        link: Link = link_class(self, key.vhost, wanted.name, wanted.upstream, wanted.policy)
        self._links[key] = link
        link.start()

    def _unwant(self, key: LinkKey) -> None:
        """The link is no longer asked for: it stops for good (and cleans up its upstream)."""
        del self._wanted[key]
        link = self._links.pop(key, None)
        placement = self.broker.link_placement

        async def stop() -> None:
            if link is not None:
                await link.stop(cleanup=True)
            if placement is not None:
                placement.release(PLACEMENT_KIND, key.vhost, lease_name(key))
            self._held.discard(key)

        self._in_background(stop())

    def _in_background(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _parameters(self, vhost: str) -> tuple[dict[str, Any], dict[str, Any]]:
        parameters = self.broker.parameters
        upstreams = {p.name: p.value for p in parameters.matching(component=UPSTREAM_COMPONENT, vhost=vhost)}
        sets = {p.name: p.value for p in parameters.matching(component=UPSTREAM_SET_COMPONENT, vhost=vhost)}
        return upstreams, sets

    def _exchange_links(self, vhost: "VirtualHost", exchange: "Exchange", upstreams: dict[str, Any],
                        sets: dict[str, Any]) -> dict[LinkKey, _Wanted]:
        if exchange is vhost.default_exchange or is_federation_resource(exchange.arguments):
            return {}
        in_force = policy_application.for_exchange(vhost, exchange.name)
        return self._links_for(EXCHANGE, vhost.name, exchange.name, in_force, upstreams, sets)

    def _queue_links(self, vhost: "VirtualHost", queue: Queue, upstreams: dict[str, Any],
                     sets: dict[str, Any]) -> dict[LinkKey, _Wanted]:
        # Only a classic or quorum queue this node holds: its consumers are here (a stream has
        # no consumer demand; a queue another node holds is federated there).
        if type(queue) is not Queue or queue.home_node or is_federation_resource(queue.arguments):
            return {}
        in_force = policy_application.for_queue(vhost, queue.name, queue.settings.queue_type)
        return self._links_for(QUEUE, vhost.name, queue.name, in_force, upstreams, sets)

    @staticmethod
    def _links_for(kind: str, vhost: str, name: str, in_force: Any, upstreams: dict[str, Any],
                   sets: dict[str, Any]) -> dict[LinkKey, _Wanted]:
        definition = in_force.definition
        if not federates(definition):
            return {}
        policy = in_force.policy.name if in_force.policy is not None else None
        found = {}
        for upstream in upstreams_for(definition, upstreams, sets, name):
            upstream_name = upstream.exchange if kind == EXCHANGE else upstream.queue
            found[LinkKey(vhost, kind, name, upstream.name, upstream_name)] = _Wanted(kind, name, upstream, policy)
        return found

    # -- the topology (broker/topology_watch.py) ----------------------------------------------

    def exchange_added(self, vhost: "VirtualHost", exchange: "Exchange") -> None:
        self._one_changed(vhost, EXCHANGE, exchange.name)

    def exchange_removed(self, vhost: "VirtualHost", exchange: "Exchange") -> None:
        self._one_changed(vhost, EXCHANGE, exchange.name)

    def queue_added(self, vhost: "VirtualHost", queue: Queue) -> None:
        self._one_changed(vhost, QUEUE, queue.name)

    def queue_removed(self, vhost: "VirtualHost", queue: Queue) -> None:
        self._one_changed(vhost, QUEUE, queue.name)

    def _one_changed(self, vhost: "VirtualHost", kind: str, name: str) -> None:
        if not self._started:
            return
        upstreams, sets = self._parameters(vhost.name)
        if not upstreams:
            return self._apply(vhost.name, {}, lambda key: key.kind == kind and key.name == name)
        wanted: dict[LinkKey, _Wanted] = {}
        if kind == EXCHANGE:
            exchange = vhost.exchanges.get(name)
            if exchange is not None:
                wanted = self._exchange_links(vhost, exchange, upstreams, sets)
        else:
            queue = vhost.queues.get(name)
            if queue is not None:
                wanted = self._queue_links(vhost, queue, upstreams, sets)
        self._apply(vhost.name, wanted, lambda key: key.kind == kind and key.name == name)

    def binding_added(self, vhost: "VirtualHost", source: "Exchange", destination: Hashable, routing_key: str,
                      arguments: dict[str, Any]) -> None:
        self._binding_changed(vhost, source, True, destination, routing_key, arguments)

    def binding_removed(self, vhost: "VirtualHost", source: "Exchange", destination: Hashable, routing_key: str,
                        arguments: dict[str, Any]) -> None:
        self._binding_changed(vhost, source, False, destination, routing_key, arguments)

    def _binding_changed(self, vhost: "VirtualHost", source: "Exchange", added: bool, destination: Hashable,
                         routing_key: str, arguments: dict[str, Any]) -> None:
        for key, link in self._links.items():
            if isinstance(link, ExchangeLink) and key.vhost == vhost.name and key.name == source.name:
                link.binding_changed(added, destination, routing_key, arguments)

    def policies_changed(self, vhost: "VirtualHost") -> None:
        self.reconcile(vhost.name)


def federation_of(broker: "Broker") -> "Federation | None":
    """The federation running in `broker`, if any (it registered its components)."""
    component = broker.parameters.component(UPSTREAM_COMPONENT)
    return component.federation if isinstance(component, FederationComponent) else None


PLACEMENT_KIND = "federation"


def lease_name(key: LinkKey) -> str:
    """The link's name among the cluster's placed links (its lease), unique in its vhost."""
    return json.dumps([key.kind, key.name, key.upstream, key.upstream_name])


def _order(key: LinkKey) -> tuple[str, str, str, str]:
    return (key.vhost, key.kind, key.name, key.upstream)
