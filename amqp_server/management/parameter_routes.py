"""/api/parameters: RabbitMQ's runtime parameters, listed, shown, set and cleared.

    GET    /api/parameters                               every parameter the caller may see
    GET    /api/parameters/{component}                   one component's (an unknown one: [])
    GET    /api/parameters/{component}/{vhost}           ... in one vhost (404 if it does not exist)
    GET    /api/parameters/{component}/{vhost}/{name}    one (404 if unset)
    PUT    /api/parameters/{component}/{vhost}/{name}    body {"value": ...}: 201 created, 204 updated
    DELETE /api/parameters/{component}/{vhost}/{name}    204, 404 if unset

They need the `policymaker` or `administrator` tag and access to the vhost, as RabbitMQ's. A
refused value answers 400 with RabbitMQ's text: "Validation failed", then one line per problem,
each naming its key, with < and > escaped as RabbitMQ 3.10 escapes them; a body without
"value" answers 400 "[{key_missing,value}]". The store and the components are
amqp_server/broker/runtime_parameters.py. RabbitMQ lists a vhost's limits (component
"vhost-limits") and operator policies ("operator_policy") among its parameters: so does this
API, read from the vhost, and a PUT or DELETE of those goes to the vhost's limits and operator
policies (administrators only, as /api/vhost-limits and /api/operator-policies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.broker.policies import parse_policy
from amqp_server.broker.runtime_parameters import ParameterError, RuntimeParameter
from amqp_server.config.limit_definitions import VHOST_LIMITS, LimitError, check_limits
from amqp_server.management import api_errors
from amqp_server.management.caller import ADMINISTRATOR, Caller
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import (
    created_or_updated, item_reply, list_reply, no_content, read_body, vhost_for_write, vhost_named,
)
from queues.arguments.policy_keys import PolicyError

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost

POLICYMAKER = "policymaker"
VHOST_LIMITS_COMPONENT = "vhost-limits"
OPERATOR_POLICY_COMPONENT = "operator_policy"
_VHOST_COMPONENTS = (VHOST_LIMITS_COMPONENT, OPERATOR_POLICY_COMPONENT)


def validation_failed(problems: list[str]) -> api_errors.ApiError:
    """RabbitMQ's 400 for a refused parameter: its lines, < and > escaped as 3.10 does."""
    text = "\n".join(problems).replace("<", "&lt;").replace(">", "&gt;")
    return api_errors.bad_request(f"Validation failed\n\n{text}\n")


def _require_rights(user: Caller) -> None:
    if not (POLICYMAKER in user.tags or ADMINISTRATOR in user.tags):
        raise api_errors.ApiError(401, "not_authorised", "User not authorised to access object")


def _vhost_parameters(vhost: "VirtualHost") -> list[dict[str, Any]]:
    """The vhost's limits and operator policies, as RabbitMQ lists them among its parameters."""
    items = []
    if vhost.limits.as_value():
        items.append(RuntimeParameter(vhost.name, VHOST_LIMITS_COMPONENT, "limits", vhost.limits.as_value()).as_json())
    for policy in vhost.operator_policies:
        value = {key: item for key, item in policy.as_json().items() if key not in ("vhost", "name")}
        items.append(RuntimeParameter(vhost.name, OPERATOR_POLICY_COMPONENT, policy.name, value).as_json())
    return items


def _parameters_of(request: web.Request, vhost: "VirtualHost", component: str | None) -> list[dict[str, Any]]:
    items = [parameter.as_json()
             for parameter in context(request).broker.parameters.matching(component=component, vhost=vhost.name)]
    if component is None or component in _VHOST_COMPONENTS:
        items.extend(item for item in _vhost_parameters(vhost) if component is None or item["component"] == component)
    return items


def _by_vhost_component_and_name(item: dict[str, Any]) -> tuple[str, str, str]:
    return (item["vhost"], item["component"], item["name"])


async def list_parameters(request: web.Request) -> web.Response:
    user = caller(request)
    _require_rights(user)
    broker = context(request).broker
    component = request.match_info.get("component")
    if "vhost" in request.match_info:
        vhost = vhost_named(broker, request.match_info["vhost"])
        user.require_vhost(vhost.name)
        vhosts = [vhost]
    else:
        vhosts = [vhost for vhost in broker.vhosts.values() if user.is_admin or user.may_see_vhost_contents(vhost.name)]
    items = [item for vhost in vhosts for item in _parameters_of(request, vhost, component)]
    return list_reply(request, items, default_order=_by_vhost_component_and_name)


def _addressed(request: web.Request, writing: bool = False) -> tuple["VirtualHost", str, str]:
    """The URL's vhost (404, or RabbitMQ's vhost_not_found for a PUT), component and name, once
    the caller may manage parameters there."""
    user = caller(request)
    _require_rights(user)
    broker, name = context(request).broker, request.match_info["vhost"]
    vhost = vhost_for_write(broker, name) if writing else vhost_named(broker, name)
    user.require_vhost(vhost.name)
    return vhost, request.match_info["component"], request.match_info["name"]


async def show_parameter(request: web.Request) -> web.Response:
    vhost, component, name = _addressed(request)
    for item in _parameters_of(request, vhost, component):
        if item["name"] == name:
            return item_reply(request, item)
    raise api_errors.not_found()


async def put_parameter(request: web.Request) -> web.Response:
    vhost, component, name = _addressed(request, writing=True)
    body = await read_body(request)
    if "value" not in body:
        raise api_errors.bad_request("[{key_missing,value}]")
    value = body["value"]
    if component in _VHOST_COMPONENTS:
        return _put_vhost_component(request, vhost, component, name, value)
    user = caller(request)
    parameters = context(request).broker.parameters
    try:
        created = parameters.set(vhost.name, component, name, value, user=user.name)
    except ParameterError as error:
        raise validation_failed(error.problems) from None
    return created_or_updated(created)


def _put_vhost_component(request: web.Request, vhost: "VirtualHost", component: str, name: str,
                         value: Any) -> web.Response:
    caller(request).require_admin()
    if component == VHOST_LIMITS_COMPONENT:
        try:
            limits = check_limits(value, VHOST_LIMITS, "vhost limits")
        except LimitError as error:
            raise validation_failed([str(error)]) from None
        vhost.set_limits(limits)
        return no_content()  # RabbitMQ answers 204 for a limits parameter, new or not
    if not isinstance(value, dict):
        raise validation_failed([f"operator policy value must be an object, actually was {value!r}"])
    try:
        policy = parse_policy(vhost.name, name, value, True)
    except PolicyError as error:
        raise validation_failed([str(error)]) from None
    created = vhost.operator_policies.get(name) is None
    vhost.set_policy(policy, True)
    return created_or_updated(created)


async def delete_parameter(request: web.Request) -> web.Response:
    vhost, component, name = _addressed(request)
    if component == VHOST_LIMITS_COMPONENT:
        caller(request).require_admin()
        if not vhost.limits.as_value():
            raise api_errors.not_found()
        vhost.set_limits({})
        return no_content()
    if component == OPERATOR_POLICY_COMPONENT:
        caller(request).require_admin()
        if not vhost.clear_policy(name, True):
            raise api_errors.not_found()
        return no_content()
    if not context(request).broker.parameters.unset(vhost.name, component, name):
        raise api_errors.not_found()
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/parameters", list_parameters)
    router.add_get("/api/parameters/{component}", list_parameters)
    router.add_get("/api/parameters/{component}/{vhost}", list_parameters)
    router.add_get("/api/parameters/{component}/{vhost}/{name}", show_parameter)
    router.add_put("/api/parameters/{component}/{vhost}/{name}", put_parameter)
    router.add_delete("/api/parameters/{component}/{vhost}/{name}", delete_parameter)
