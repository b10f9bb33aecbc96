"""`ctl status`: the node's runtime, alarms, memory, file descriptors, disk, totals and
listeners, in the sections and wording of `rabbitmqctl status`."""

from __future__ import annotations

import json
from typing import Any, TextIO

from amqp_server.ctl.admin_commands import Session, _call
from amqp_server.ctl.alarm_commands import ALARMS_PATH
from amqp_server.ctl.api_client import ApiError
from amqp_server.ctl.exit_codes import EX_OK

GB = 1_000_000_000  # rabbitmqctl status prints decimal gigabytes


def _gb(value: Any) -> str:
    """Decimal gigabytes rounded to 4 places, printed as rabbitmqctl does: 0.05 gb, 1.0 gb, 10.1106 gb."""
    return f"{round(value / GB, 4)} gb" if isinstance(value, (int, float)) else "unknown"


def watermark_line(node: dict[str, Any], alarms: dict[str, Any] | None) -> str:
    """rabbitmqctl's "Memory high watermark setting" line: the setting as configured, then bytes."""
    computed = _gb(node.get("mem_limit"))
    setting = (alarms or {}).get("vm_memory_high_watermark", {})
    if "relative" in setting:
        return f"Memory high watermark setting: {setting['relative']} of available memory, computed to: {computed}"
    if "absolute" in setting:
        return f"Memory high watermark setting: {_gb(setting['absolute'])}, computed to: {computed}"
    return f"Memory high watermark: {computed}"


def gather(session: Session) -> dict[str, Any]:
    overview = _call(lambda: session.client.get("/api/overview"))
    nodes = _call(lambda: session.client.get("/api/nodes"))
    node = nodes[0] if nodes else {}
    vhosts = _call(lambda: session.client.get("/api/vhosts"))
    try:
        alarms = session.client.get(ALARMS_PATH)
    except ApiError:  # a broker without this route (or a user without monitoring rights)
        alarms = None
    return {"overview": overview, "node": node, "vhost_count": len(vhosts), "alarms": alarms}


def alarm_lines(node: dict[str, Any]) -> list[str]:
    name = node.get("name", "?")
    lines = []
    if node.get("disk_free_alarm"):
        lines.append(f"Free disk space alarm on node {name}")
    if node.get("mem_alarm"):
        lines.append(f"Memory alarm on node {name}")
    return lines or ["(none)"]


def write_status(out: TextIO, overview: dict[str, Any], node: dict[str, Any], vhost_count: int,
                 alarms: dict[str, Any] | None = None) -> None:
    totals = overview.get("object_totals", {})
    uptime_ms = node.get("uptime")
    sections: list[tuple[str, list[str]]] = [
        ("Runtime", [
            f"OS PID: {node.get('os_pid', '?')}",
            f"Uptime (seconds): {uptime_ms // 1000 if isinstance(uptime_ms, int) else '?'}",
            f"{overview.get('product_name', 'amqp-server')} version: {overview.get('product_version', '?')} "
            f"(RabbitMQ-compatible {overview.get('rabbitmq_version', '?')})",
            f"Node name: {node.get('name', '?')}",
            f"Runtime: {overview.get('erlang_version', '?')}",
        ]),
        ("Data directory", [f"Node data directory: {node.get('db_dir', '?')}"]),
        ("Config files", [f" * {path}" for path in node.get("config_files", [])]),
        ("Alarms", alarm_lines(node)),
        ("Memory", [
            f"Total memory used: {_gb(node.get('mem_used'))}",
            f"Calculation strategy: {node.get('mem_calculation_strategy', 'rss')}",
            watermark_line(node, alarms),
        ]),
        ("File Descriptors", [
            f"Total: {node.get('fd_used', '?')}, limit: {node.get('fd_total', '?')}",
            f"Sockets: {node.get('sockets_used', '?')}, limit: {node.get('sockets_total', '?')}",
        ]),
        ("Free Disk Space", [
            f"Low free disk space watermark: {_gb(node.get('disk_free_limit'))}",
            f"Free disk space: {_gb(node.get('disk_free'))}",
        ]),
        ("Totals", [
            f"Connection count: {totals.get('connections', '?')}",
            f"Queue count: {totals.get('queues', '?')}",
            f"Virtual host count: {vhost_count}",
        ]),
        ("Listeners", [
            f"Interface: [::], port: {listener.get('port')}, protocol: {listener.get('protocol')}"
            for listener in overview.get("listeners", [])
        ]),
    ]
    out.write(f"Status of node {node.get('name', '?')} ...\n")
    for title, lines in sections:
        out.write(f"{title}\n\n" + "".join(line + "\n" for line in lines) + "\n")


def status(session: Session, formatter: str = "table") -> int:
    gathered = gather(session)
    if formatter == "json":
        session.out.write(json.dumps(gathered, ensure_ascii=False) + "\n")
    else:
        write_status(session.out, gathered["overview"], gathered["node"], gathered["vhost_count"], gathered["alarms"])
    return EX_OK
