"""Runtime parameters, as RabbitMQ has them: per vhost, (component, name) -> a JSON value.

A *component* ("shovel", "federation-upstream", "federation-upstream-set") is whatever acts on
its parameters; it registers a `ParameterComponent` with the broker's `RuntimeParameters`: a
validator (RabbitMQ's "Validation failed" lines) and what to do when one of its parameters is
set or cleared. The store holds the values and keeps them durable (the broker's definition
store, kind "runtime_parameters") and, on a cluster, shared (the broker forwards each change to
the shared definitions, and the cluster applies the other nodes' changes through `set` and
`unset` here, so every node's components hear them).

A parameter of a component that has not registered (yet) is kept as it is and handed to the
component when it registers: the broker restores its definitions before the runtime starts
the components. RabbitMQ's own "vhost-limits" and "operator_policy" components are not kept
here: they are the vhost's limits and operator policies (the management API shows them under
/api/parameters as RabbitMQ does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

KIND = "runtime_parameters"  # the definition store's kind (persistence/definitions_codec.py)

# on_change(kind, entry, present): the broker records (and shares) each change.
ParameterChanged = Callable[[str, dict[str, Any], bool], None]


class ParameterError(ValueError):
    """A parameter refused: `problems` are RabbitMQ's lines after "Validation failed"."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class RuntimeParameter:
    vhost: str
    component: str
    name: str
    value: Any

    def as_json(self) -> dict[str, Any]:
        """RabbitMQ's shape, in the API, in an export and in the definition store."""
        return {"value": self.value, "vhost": self.vhost, "component": self.component, "name": self.name}


class ParameterComponent(Protocol):
    """What a component registers (after RabbitMQ's rabbit_runtime_parameter behaviour)."""

    @property
    def component(self) -> str:
        """Its name, e.g. "shovel"."""
        ...

    def validate(self, vhost: str, name: str, value: Any, user: str | None) -> list[str]:
        """What is wrong with `value` (RabbitMQ's validation lines, each naming its key); [] when
        it may be set. `user`: who sets it (None: the broker restoring or a cluster peer)."""
        ...

    def parameter_set(self, parameter: RuntimeParameter) -> None:
        """`parameter` was set (created or changed), here or on another node of the cluster."""
        ...

    def parameter_cleared(self, vhost: str, name: str) -> None:
        """The component's parameter `name` in `vhost` was cleared."""
        ...


class RuntimeParameters:
    """Every runtime parameter of the broker, and the components acting on them."""

    def __init__(self, on_change: ParameterChanged | None = None) -> None:
        self._on_change: ParameterChanged = on_change or (lambda kind, entry, present: None)
        self._values: dict[tuple[str, str, str], RuntimeParameter] = {}  # (vhost, component, name)
        self._components: dict[str, ParameterComponent] = {}

    # -- components -----------------------------------------------------------------------

    def register(self, component: ParameterComponent) -> None:
        """`component` acts on its parameters from now on; those already set are handed to it."""
        self._components[component.component] = component
        for parameter in self.matching(component=component.component):
            self._tell_set(component, parameter)

    def unregister(self, name: str) -> None:
        """The component stops hearing changes (its parameters stay)."""
        self._components.pop(name, None)

    def component(self, name: str) -> ParameterComponent | None:
        return self._components.get(name)

    @property
    def component_names(self) -> list[str]:
        return sorted(self._components)

    # -- reading ----------------------------------------------------------------------------

    def get(self, vhost: str, component: str, name: str) -> RuntimeParameter | None:
        return self._values.get((vhost, component, name))

    def matching(self, component: str | None = None, vhost: str | None = None) -> list[RuntimeParameter]:
        """The parameters of `component` and `vhost` (each None: all), by vhost, component, name."""
        return [parameter for key, parameter in sorted(self._values.items())
                if (component is None or key[1] == component) and (vhost is None or key[0] == vhost)]

    def __len__(self) -> int:
        return len(self._values)

    # -- changing ---------------------------------------------------------------------------

    def validate(self, vhost: str, component: str, name: str, value: Any, user: str | None = None) -> None:
        """ParameterError unless `component` is registered and takes `value` (RabbitMQ's order:
        an unknown component first)."""
        handler = self._components.get(component)
        if handler is None:
            raise ParameterError([f"component {component} not found"])
        problems = handler.validate(vhost, name, value, user)
        if problems:
            raise ParameterError(problems)

    def set(self, vhost: str, component: str, name: str, value: Any, user: str | None = None,
            validate: bool = True) -> bool:
        """Set the parameter (validated first unless `validate` is False: a stored or shared one,
        checked when it was set); True if it is new. Setting the same value again changes
        nothing and tells nobody."""
        if validate:
            self.validate(vhost, component, name, value, user)
        key = (vhost, component, name)
        previous = self._values.get(key)
        parameter = RuntimeParameter(vhost, component, name, value)
        if previous == parameter:
            return False
        self._values[key] = parameter
        self._on_change(KIND, parameter.as_json(), True)
        handler = self._components.get(component)
        if handler is not None:
            self._tell_set(handler, parameter)
        return previous is None

    def unset(self, vhost: str, component: str, name: str) -> bool:
        """Remove the parameter; False if there was none."""
        parameter = self._values.pop((vhost, component, name), None)
        if parameter is None:
            return False
        self._on_change(KIND, parameter.as_json(), False)
        handler = self._components.get(component)
        if handler is not None:
            try:
                handler.parameter_cleared(vhost, name)
            except Exception:  # one component's bug must not undo the change or stop the caller
                log.exception("component %s failed on clearing parameter '%s' in vhost '%s'", component, name, vhost)
        return True

    def forget_vhost(self, vhost: str) -> None:
        """The vhost is gone: its parameters go, and their components hear it (the definition
        store drops them with the vhost itself)."""
        for parameter in self.matching(vhost=vhost):
            del self._values[(vhost, parameter.component, parameter.name)]
            handler = self._components.get(parameter.component)
            if handler is not None:
                try:
                    handler.parameter_cleared(vhost, parameter.name)
                except Exception:
                    log.exception("component %s failed on clearing parameter '%s' in deleted vhost '%s'",
                                  parameter.component, parameter.name, vhost)

    def definitions(self) -> list[dict[str, Any]]:
        """Every parameter in the definition store's (and RabbitMQ's export) shape."""
        return [parameter.as_json() for parameter in self.matching()]

    @staticmethod
    def _tell_set(handler: ParameterComponent, parameter: RuntimeParameter) -> None:
        try:
            handler.parameter_set(parameter)
        except Exception:  # the parameter stays set; the component reports its own state
            log.exception("component %s failed on parameter '%s' in vhost '%s'", parameter.component,
                          parameter.name, parameter.vhost)
