"""Where the coordination service is: ``etcd://h:p,h:p/prefix`` or ``zookeeper://h:p,.../prefix``."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Backend(enum.Enum):
    ETCD = "etcd"
    ZOOKEEPER = "zookeeper"


@dataclass(frozen=True)
class ClusterAddress:
    backend: Backend
    endpoints: tuple[tuple[str, int], ...]
    prefix: str  # every key of this cluster lives under it; no leading or trailing "/"


_DEFAULT_PORTS = {Backend.ETCD: 2379, Backend.ZOOKEEPER: 2181}
_ENDPOINT = re.compile(r"([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\])(?::(\d{1,5}))?")


def parse_cluster_address(text: str) -> ClusterAddress:
    """Parse a cluster address; raises ValueError saying what is wrong with it."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ValueError(f"cluster address {text!r} must start with etcd:// or zookeeper://")
    try:
        backend = Backend(scheme.lower())
    except ValueError:
        raise ValueError(f"cluster address {text!r}: unknown backend {scheme!r} (etcd or zookeeper)") from None
    hosts, _, prefix = rest.partition("/")
    endpoints = []
    for item in hosts.split(","):
        match = _ENDPOINT.fullmatch(item.strip())
        if not match:
            raise ValueError(f"cluster address {text!r}: {item!r} is not host[:port]")
        port = int(match.group(2)) if match.group(2) else _DEFAULT_PORTS[backend]
        if not 0 < port < 65536:
            raise ValueError(f"cluster address {text!r}: port {port} out of range")
        endpoints.append((match.group(1).strip("[]"), port))
    prefix = prefix.strip("/") or "amqp-server"
    return ClusterAddress(backend, tuple(endpoints), prefix)
