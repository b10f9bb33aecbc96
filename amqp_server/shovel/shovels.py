"""The broker's shovels: the "shovel" runtime parameter component, and the static shovels of the
configuration file.

`Shovels` registers with the broker's runtime parameters (broker/runtime_parameters.py): it
checks a value (definition.py, plus RabbitMQ's check that the user setting a shovel may enter
the vhost a host-less URI names), and starts, changes or stops a `Shovel` (worker.py) as its
parameter is set, changed or cleared, here or on another node of a cluster. Static shovels come
from `[[shovels]]` in the configuration file and live as long as the process.

Where a shovel runs: on a single node, here. On a cluster, the cluster plug-in places each on
exactly one node under a lease in the coordination service (`LinkPlacement`,
broker/cluster_interface.py): the node holding the lease runs it, and when that node dies its
lease expires and another node takes it. A shovel placed elsewhere is listed with the node that
holds it.

Until `start` (the runtime calls it on the event loop), parameters are only recorded.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from amqp_server.broker.runtime_parameters import RuntimeParameter
from amqp_server.peer_link.client import LocalOpener
from amqp_server.peer_link.uri import local_vhost_refused
from amqp_server.shovel.definition import COMPONENT, ShovelDefinition, parse_shovel, validate_shovel
from amqp_server.shovel.worker import Shovel, ShovelState

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

log = logging.getLogger(__name__)

PLACEMENT_KIND = "shovel"  # what a shovel's lease is named by (with its vhost and name)

Key = tuple[str, str]  # (vhost, name)


class StaticShovelRefused(ValueError):
    """A static shovel of the configuration file that RabbitMQ would refuse; the text says why."""


class Shovels:
    """Every shovel of this broker (see the module docstring)."""

    component = COMPONENT

    def __init__(self, broker: "Broker", local_opener: LocalOpener | None = None,
                 local_credentials: tuple[str, str] | None = None) -> None:
        self._broker = broker
        self._local_opener = local_opener
        self._local_credentials = local_credentials
        self._definitions: dict[Key, ShovelDefinition] = {}  # every shovel known, running here or not
        self._workers: dict[Key, Shovel] = {}  # the ones this node runs
        self._static: set[Key] = set()
        self._started = False
        self._stopping: set[asyncio.Task[None]] = set()

    # -- the ParameterComponent interface ----------------------------------------------------------

    def validate(self, vhost: str, name: str, value: Any, user: str | None) -> list[str]:
        problems = validate_shovel(vhost, name, value)
        if problems or user is None:
            return problems
        uris = [uri for key in ("src-uri", "dest-uri")
                for uri in (value[key] if isinstance(value[key], list) else [value[key]])]
        return local_vhost_refused(self._broker, user, uris, vhost)

    def parameter_set(self, parameter: RuntimeParameter) -> None:
        problems = validate_shovel(parameter.vhost, parameter.name, parameter.value)
        if problems:  # stored by a version that took what this one refuses
            log.error("shovel '%s' in vhost '%s' is not started: %s", parameter.name, parameter.vhost,
                      "; ".join(problems))
            return
        self._define(parse_shovel(parameter.vhost, parameter.name, parameter.value))

    def parameter_cleared(self, vhost: str, name: str) -> None:
        self._forget((vhost, name))

    # -- static shovels ---------------------------------------------------------------------------

    def add_static(self, vhost: str, name: str, value: dict[str, Any]) -> None:
        """A shovel of the configuration file; StaticShovelRefused with RabbitMQ's text if it is not one."""
        problems = validate_shovel(vhost, name, value)
        if problems:
            raise StaticShovelRefused(f"static shovel '{name}' in vhost '{vhost}': " + "; ".join(problems))
        if (vhost, name) in self._definitions:
            raise StaticShovelRefused(f"static shovel '{name}' in vhost '{vhost}' is defined twice")
        self._static.add((vhost, name))
        self._define(parse_shovel(vhost, name, value, kind="static"))

    # -- running ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Run the shovels recorded so far, and those set from now on (on the event loop)."""
        self._started = True
        for key in list(self._definitions):
            self._place(key)

    async def close(self) -> None:
        """Stop every shovel this node runs (unconfirmed messages go back to their sources)."""
        self._started = False
        workers = list(self._workers.values())
        self._workers.clear()
        for worker in workers:
            await worker.stop()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        placement = self._broker.link_placement
        if placement is not None:
            for vhost, name in list(self._definitions):
                placement.release(PLACEMENT_KIND, vhost, name)

    def _define(self, definition: ShovelDefinition) -> None:
        key = (definition.vhost, definition.name)
        previous = self._definitions.get(key)
        if previous is not None and previous.value == definition.value:
            return
        self._definitions[key] = definition
        worker = self._workers.pop(key, None)
        if worker is not None:  # changed: the old one goes, the new one starts where it ran
            self._stop_later(worker)
            self._run_here(key)
        elif self._started:
            self._place(key)

    def _forget(self, key: Key) -> None:
        if self._definitions.pop(key, None) is None:
            return
        self._static.discard(key)
        worker = self._workers.pop(key, None)
        if worker is not None:
            self._stop_later(worker)
        placement = self._broker.link_placement
        if placement is not None:
            placement.release(PLACEMENT_KIND, *key)

    def _place(self, key: Key) -> None:
        placement = self._broker.link_placement
        if placement is None:
            self._run_here(key)
            return
        placement.place(PLACEMENT_KIND, key[0], key[1], on_run=lambda: self._run_here(key),
                        on_stop=lambda: self._stop_here(key))

    def _run_here(self, key: Key) -> None:
        """This node holds the shovel (alone, or under its lease): start its worker."""
        definition = self._definitions.get(key)
        if definition is None or key in self._workers or not self._started:
            return
        broker = self._broker
        worker = Shovel(definition, broker.node_name, broker.cluster_name, self._completed, self._local_opener,
                        self._local_credentials)
        self._workers[key] = worker
        worker.start()

    def _stop_here(self, key: Key) -> None:
        """This node lost the shovel's lease: its worker stops (another node takes it)."""
        worker = self._workers.pop(key, None)
        if worker is not None:
            self._stop_later(worker)

    def _stop_later(self, worker: Shovel) -> None:
        task = asyncio.get_running_loop().create_task(worker.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _completed(self, worker: Shovel) -> None:
        """src-delete-after reached: a dynamic shovel deletes itself, as RabbitMQ's does."""
        definition = worker.definition
        if definition.kind == "dynamic":
            self._broker.parameters.unset(definition.vhost, COMPONENT, definition.name)

    # -- reading ------------------------------------------------------------------------------------

    def statuses(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """What GET /api/shovels lists: the shovels this node runs, and where the others run."""
        placement = self._broker.link_placement
        items = []
        for key, definition in sorted(self._definitions.items()):
            if vhost is not None and key[0] != vhost:
                continue
            worker = self._workers.get(key)
            if worker is not None:
                items.append(worker.status())
                continue
            holder = placement.holder(PLACEMENT_KIND, *key) if placement is not None else None
            items.append({"node": holder or "", "name": definition.name, "vhost": definition.vhost,
                          "type": definition.kind,
                          "state": ShovelState.RUNNING.value if holder else ShovelState.STARTING.value})
        return items

    def worker(self, vhost: str, name: str) -> Shovel | None:
        """The worker of a shovel this node runs."""
        return self._workers.get((vhost, name))

    def exists(self, vhost: str, name: str) -> bool:
        return (vhost, name) in self._definitions

    def is_static(self, vhost: str, name: str) -> bool:
        return (vhost, name) in self._static

    async def restart(self, vhost: str, name: str) -> bool:
        """Stop and start the shovel (a terminated one runs again); False if there is none here."""
        worker = self._workers.get((vhost, name))
        if worker is None:
            return False
        await worker.restart()
        return True

    @property
    def workers(self) -> list[Shovel]:
        return list(self._workers.values())
