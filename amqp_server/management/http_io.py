"""Reading requests and writing JSON replies the way RabbitMQ's management API does.

- Request bodies are JSON; booleans and numbers may arrive as strings ("true", "1"), which
  rabbitmqadmin sends and RabbitMQ accepts.
- Lists accept `columns=a,b.c` (dotted paths into nested objects), `sort=` and
  `sort_reverse=true`, and `page`/`page_size`/`name`/`use_regex` pagination.
- AMQP table values JSON cannot hold (bytes, Decimal, datetime) are written as text.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.context import caller, context

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.management.caller import Caller
    from amqp_server.broker.vhost import VirtualHost

MAX_PAGE_SIZE = 500  # RabbitMQ's limit
T = TypeVar("T")


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default)


def json_reply(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, dumps=dumps)


def no_content() -> web.Response:
    return web.Response(status=204)


def created_or_updated(created: bool) -> web.Response:
    return web.Response(status=201 if created else 204)


async def read_body(request: web.Request) -> dict[str, Any]:
    """The JSON object sent with the request ({} when there is none)."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise api_errors.bad_request(f"invalid JSON: {error}") from None
    if not isinstance(body, dict):
        raise api_errors.bad_request("the request body must be a JSON object")
    return body


def as_bool(value: Any, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise api_errors.bad_request(f"not a boolean: {value!r}")


def as_int(value: Any, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise api_errors.bad_request(f"not an integer: {value!r}") from None


def as_table(value: Any) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise api_errors.bad_request(f"arguments must be a JSON object, got {value!r}")
    return value


def vhost_named(broker: "Broker", name: str) -> "VirtualHost":
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise api_errors.not_found()
    return vhost


def vhost_for_write(broker: "Broker", name: str, status: int = 404) -> "VirtualHost":
    """The vhost a declaration or import names; RabbitMQ's `vhost_not_found` error if none."""
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise api_errors.vhost_not_found(status)
    return vhost


# -- lists -------------------------------------------------------------------------------


def visible_vhost(request: web.Request) -> "VirtualHost":
    """The vhost the URL names, for reading its queues, exchanges or bindings (404 if there is
    none, 401 if the caller may not see inside it)."""
    vhost = vhost_named(context(request).broker, request.match_info["vhost"])
    caller(request).require_vhost_contents(vhost.name)
    return vhost


def vhosts_visible_to(broker: "Broker", user: "Caller") -> list["VirtualHost"]:
    """The vhosts that appear in the caller's vhost list and totals."""
    return [vhost for vhost in broker.vhosts.values() if user.may_see_vhost(vhost.name)]


def vhosts_in_scope(request: web.Request) -> list["VirtualHost"]:
    """What a listing of queues, exchanges or bindings covers: the URL's vhost if it names one,
    else every vhost the caller may see inside."""
    if "vhost" in request.match_info:
        return [visible_vhost(request)]
    user = caller(request)
    return [vhost for vhost in context(request).broker.vhosts.values() if user.may_see_vhost_contents(vhost.name)]


def _lookup(item: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(item, dict) or key not in item:
            return None
        item = item[key]
    return item


def select_columns(item: dict[str, Any], columns: list[list[str]]) -> dict[str, Any]:
    """Keep only the dotted `columns` of `item` (absent ones are left out, as RabbitMQ does)."""
    chosen: dict[str, Any] = {}
    for path in columns:
        value = item
        found = True
        for key in path:
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                found = False
                break
        if not found:
            continue
        target = chosen
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return chosen


def _columns(request: web.Request) -> list[list[str]]:
    spec = request.query.get("columns", "")
    return [column.split(".") for column in spec.split(",") if column]


def _sort_key(path: list[str]) -> Callable[[dict[str, Any]], tuple[int, Any, str]]:
    def key(item: dict[str, Any]) -> tuple[int, Any, str]:
        value = _lookup(item, path)
        # None first, then numbers, then text: mixed types must not break sorting.
        if value is None:
            return (0, 0, "")
        if isinstance(value, (int, float)):
            return (1, value, "")
        return (2, 0, str(value))
    return key


def _by_vhost_and_name(item: dict[str, Any]) -> tuple[str, str]:
    return (str(item.get("vhost", "")), str(item.get("name", "")))


def list_reply(
    request: web.Request,
    items: list[dict[str, Any]],
    default_order: Callable[[dict[str, Any]], Any] = _by_vhost_and_name,
    paginated: bool = False,
) -> web.Response:
    """A list in RabbitMQ's form: sorted and cut to `columns` as asked. Only `paginated` lists
    answer `page` with a page object; RabbitMQ 3.10 pages vhosts, exchanges, queues, connections
    and channels, and ignores `page` everywhere else (bindings, consumers, users...), returning
    the plain list."""
    query = request.query
    sort = query.get("sort")
    if sort:
        items = sorted(items, key=_sort_key(sort.split(".")), reverse=query.get("sort_reverse") == "true")
    else:
        items = sorted(items, key=default_order)
    if paginated and "page" in query:
        return json_reply(_page(request, items))
    columns = _columns(request)
    if columns:
        items = [select_columns(item, columns) for item in items]
    return json_reply(items)


def lazy_page_reply(request: web.Request, objects: list[T], name_of: Callable[[T], str],
                    vhost_of: Callable[[T], str], build: Callable[[T], dict[str, Any]]) -> web.Response:
    """`list_reply(request, [build(o) for o in objects], paginated=True)`, the same answer, but
    when the request asks for a page sorted by name or vhost (or not sorted), only that page's
    objects are built: a page of 10,000 queues costs 100 queue_json calls, not 10,000."""
    query = request.query
    sort = query.get("sort") or None
    if "page" not in query or sort not in (None, "name", "vhost"):
        return list_reply(request, [build(o) for o in objects], paginated=True)
    if sort is None:
        ordered = sorted(objects, key=lambda o: (vhost_of(o), name_of(o)))
    else:
        ordered = sorted(objects, key=name_of if sort == "name" else vhost_of, reverse=query.get("sort_reverse") == "true")
    return json_reply(_page(request, ordered, name_of, build))


def _item_name(item: dict[str, Any]) -> str:
    return str(item.get("name", ""))


def _page(request: web.Request, items: list[Any], name_of: Callable[[Any], str] = _item_name,
          build: Callable[[Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    query = request.query
    page = as_int(query.get("page"), 1)
    page_size = as_int(query.get("page_size"), 100)
    if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
        raise api_errors.ApiError(
            400, "invalid_pagination_parameters",
            f"Invalid pagination parameters: page number {page}, page size {query.get('page_size', 'undefined')}",
        )
    total = len(items)
    name = query.get("name")
    if name:
        if query.get("use_regex") == "true":
            try:
                pattern = re.compile(name)
            except re.error as error:
                raise api_errors.bad_request(f"invalid regular expression: {error}") from None
            items = [item for item in items if pattern.search(name_of(item))]
        else:
            items = [item for item in items if name in name_of(item)]
    filtered = len(items)
    page_count = max(1, math.ceil(filtered / page_size))
    if page > page_count:
        raise api_errors.ApiError(
            400, "page_out_of_range", f"Page out of range, page: {page} page size: {page_size}, len: {filtered}"
        )
    chosen = items[(page - 1) * page_size: page * page_size]
    if build is not None:
        chosen = [build(item) for item in chosen]
    columns = _columns(request)
    if columns:
        chosen = [select_columns(item, columns) for item in chosen]
    return {
        "filtered_count": filtered,
        "item_count": len(chosen),
        "items": chosen,
        "page": page,
        "page_count": page_count,
        "page_size": page_size,
        "total_count": total,
    }


def item_reply(request: web.Request, item: dict[str, Any]) -> web.Response:
    columns = _columns(request)
    return json_reply(select_columns(item, columns) if columns else item)
