"""/api/users and /api/permissions (administrator only, as in RabbitMQ).

PUT /api/users/{name} needs `tags` (a list or a comma-separated string) and `password` or
`password_hash`; without either, an existing user keeps its password and a new one gets none
(it cannot log in with a password). Every change is saved through the definitions store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.definitions_transfer import password_hash_of, set_user, user_tags
from amqp_server.management.http_io import created_or_updated, item_reply, list_reply, no_content, read_body
from amqp_server.management.node_json import permission_json, user_json

if TYPE_CHECKING:
    from amqp_server.broker.access_control import User
    from amqp_server.config.settings import PermissionConfig

PERMISSION_FIELDS = ("configure", "write", "read")


async def list_users(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    limits = broker.user_limits()
    return list_reply(request, [user_json(u, limits.get(u.name)) for u in broker.access.users()])


async def users_without_permissions(request: web.Request) -> web.Response:
    caller(request).require_admin()
    access = context(request).broker.access
    with_permissions = {p.user for p in access.permissions()}
    return list_reply(request, [user_json(u) for u in access.users() if u.name not in with_permissions])


def _user_named(request: web.Request) -> User:
    user = context(request).broker.access.user(request.match_info["user"])
    if user is None:
        raise api_errors.not_found()
    return user


async def show_user(request: web.Request) -> web.Response:
    caller(request).require_admin()
    user = _user_named(request)
    return item_reply(request, user_json(user, context(request).broker.user_limits().get(user.name)))


async def put_user(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    body = await read_body(request)
    if "tags" not in body:
        raise api_errors.bad_request("tags_not_present")
    name = request.match_info["user"]
    existing = broker.access.user(name)
    if "password" in body or "password_hash" in body:
        password_hash = password_hash_of(body)
    else:
        password_hash = existing.password_hash if existing is not None else ""
    created = set_user(broker, name, password_hash, user_tags(body["tags"]))
    broker.save_definitions()
    return created_or_updated(created)


async def delete_user(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    broker.delete_user(_user_named(request).name)
    return no_content()


async def bulk_delete_users(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    names = (await read_body(request)).get("users")
    if not isinstance(names, list):
        raise api_errors.bad_request("users must be a list of names")
    for name in names:
        if broker.access.user(str(name)) is not None:
            broker.delete_user(str(name))
    broker.save_definitions()
    return no_content()


async def user_permissions(request: web.Request) -> web.Response:
    caller(request).require_admin()
    user = _user_named(request)
    permissions = context(request).broker.access.permissions()
    return list_reply(request, [permission_json(p) for p in permissions if p.user == user.name])


async def user_topic_permissions(request: web.Request) -> web.Response:
    """Always empty: this broker has no topic permissions (RabbitMQ answers [] for a user with none)."""
    caller(request).require_admin()
    _user_named(request)
    return list_reply(request, [])


async def list_permissions(request: web.Request) -> web.Response:
    caller(request).require_admin()
    return list_reply(request, [permission_json(p) for p in context(request).broker.access.permissions()])


def _permission_of(request: web.Request) -> PermissionConfig:
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    for permission in context(request).broker.access.permissions():
        if permission.vhost == vhost and permission.user == user:
            return permission
    raise api_errors.not_found()


async def show_permission(request: web.Request) -> web.Response:
    caller(request).require_admin()
    return item_reply(request, permission_json(_permission_of(request)))


async def put_permission(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    body = await read_body(request)
    account = broker.access.user(user)
    if vhost not in broker.vhosts or account is None:
        raise api_errors.bad_request("vhost_or_user_not_found")
    patterns = []
    for field in PERMISSION_FIELDS:
        if not isinstance(body.get(field), str):
            raise api_errors.bad_request(f"{field}_not_present" if field not in body else f"{field} must be a string")
        patterns.append(body[field])
    created = not broker.access.can_access_vhost(account, vhost)
    try:
        broker.access.set_permissions(user, vhost, *patterns)
    except ValueError as error:
        raise api_errors.bad_request(str(error)) from None
    broker.save_definitions()
    return created_or_updated(created)


async def delete_permission(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    permission = _permission_of(request)
    broker.access.clear_permissions(permission.user, permission.vhost)
    broker.save_definitions()
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/users", list_users)
    router.add_get("/api/users/without-permissions", users_without_permissions)
    router.add_post("/api/users/bulk-delete", bulk_delete_users)
    router.add_get("/api/users/{user}", show_user)
    router.add_put("/api/users/{user}", put_user)
    router.add_delete("/api/users/{user}", delete_user)
    router.add_get("/api/users/{user}/permissions", user_permissions)
    router.add_get("/api/users/{user}/topic-permissions", user_topic_permissions)
    router.add_get("/api/permissions", list_permissions)
    router.add_get("/api/permissions/{vhost}/{user}", show_permission)
    router.add_put("/api/permissions/{vhost}/{user}", put_permission)
    router.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
