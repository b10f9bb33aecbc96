"""/api/policies and /api/operator-policies: list, show, set and clear, as RabbitMQ's API does.

Policies need the `policymaker` or `administrator` tag and access to the vhost; operator
policies need `administrator`. A PUT body is `{"pattern", "definition", "priority",
"apply-to"}` (priority 0 and apply-to "all" when left out); a refused one answers 400 with
RabbitMQ's "Validation failed" text. Setting or clearing one applies at once to the queues and
exchanges that exist (policy_application.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.caller import ADMINISTRATOR, Caller
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import (
    created_or_updated,
    item_reply,
    list_reply,
    no_content,
    read_body,
    vhost_for_write,
    vhost_named,
)
from amqp_server.broker.policies import PolicySet, parse_policy
from queues.arguments.policy_keys import PolicyError

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost

POLICYMAKER = "policymaker"


def validation_failed(error: Exception, escape_tags: bool = False) -> api_errors.ApiError:
    """RabbitMQ's 400 for a refused runtime parameter (a policy, a limit). RabbitMQ 3.10 escapes
    < and > in a refused policy's text (not in an operator policy's, nor a limit's)."""
    if isinstance(error, PolicyError) and not error.validation:
        return api_errors.bad_request(str(error))
    text = str(error)
    if escape_tags:
        text = text.replace("<", "&lt;").replace(">", "&gt;")
    return api_errors.bad_request(f"Validation failed\n\n{text}\n")


def _require_policy_rights(user: Caller, operator: bool) -> None:
    if operator or not (POLICYMAKER in user.tags or ADMINISTRATOR in user.tags):
        user.require_admin()


def _operator(request: web.Request) -> bool:
    return request.path.startswith("/api/operator-policies")


def _policies_in(request: web.Request, writing: bool = False) -> tuple["VirtualHost", PolicySet, bool]:
    """The URL's vhost, its policies or operator policies, and which, once the caller may
    manage them there. A missing vhost is 404 "Object Not Found", or RabbitMQ's
    `vhost_not_found` when `writing` (a PUT)."""
    user, operator = caller(request), _operator(request)
    _require_policy_rights(user, operator)
    broker, name = context(request).broker, request.match_info["vhost"]
    vhost = vhost_for_write(broker, name) if writing else vhost_named(broker, name)
    user.require_vhost(vhost.name)
    return vhost, (vhost.operator_policies if operator else vhost.policies), operator


def _by_priority(item: dict[str, Any]) -> tuple[Any, ...]:
    """RabbitMQ lists policies by ascending priority (rabbit_policy:sort_by_priority), in the
    API and in rabbitmqctl alike; ties, which it leaves unordered, by vhost and name here."""
    return (item["priority"], item["vhost"], item["name"])


async def list_policies(request: web.Request) -> web.Response:
    if "vhost" in request.match_info:
        _vhost, policies, _operator_ = _policies_in(request)
        return list_reply(request, [policy.as_json() for policy in policies], default_order=_by_priority)
    user, operator = caller(request), _operator(request)
    _require_policy_rights(user, operator)
    items = [
        policy.as_json()
        for vhost in context(request).broker.vhosts.values()
        if user.is_admin or user.may_see_vhost_contents(vhost.name)
        for policy in (vhost.operator_policies if operator else vhost.policies)
    ]
    return list_reply(request, items, default_order=_by_priority)


async def show_policy(request: web.Request) -> web.Response:
    _vhost, policies, _operator_ = _policies_in(request)
    policy = policies.get(request.match_info["name"])
    if policy is None:
        raise api_errors.not_found()
    return item_reply(request, policy.as_json())


async def put_policy(request: web.Request) -> web.Response:
    vhost, policies, operator = _policies_in(request, writing=True)
    name = request.match_info["name"]
    try:
        policy = parse_policy(vhost.name, name, await read_body(request), operator)
    except PolicyError as error:
        raise validation_failed(error, escape_tags=not operator) from None
    created = policies.get(name) is None
    vhost.set_policy(policy, operator)
    return created_or_updated(created)


async def delete_policy(request: web.Request) -> web.Response:
    vhost, _policies, operator = _policies_in(request)
    if not vhost.clear_policy(request.match_info["name"], operator):
        raise api_errors.not_found()
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    for base in ("/api/policies", "/api/operator-policies"):
        router.add_get(base, list_policies)
        router.add_get(base + "/{vhost}", list_policies)
        router.add_get(base + "/{vhost}/{name}", show_policy)
        router.add_put(base + "/{vhost}/{name}", put_policy)
        router.add_delete(base + "/{vhost}/{name}", delete_policy)
