"""Who this node is, in the names RabbitMQ's dashboards and management clients look for.

`RABBITMQ_COMPATIBLE_VERSION` is the RabbitMQ release whose management JSON and metric names
this broker reproduces (and was checked against); tools that branch on rabbitmq_version see
that. The broker's own name and version are reported as product_name / product_version.
"""

from __future__ import annotations

import base64
import hashlib
import platform
from typing import TYPE_CHECKING

from amqp_server.connection.handshake import PRODUCT, VERSION

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

RABBITMQ_COMPATIBLE_VERSION = "3.10.8"
PRODUCT_NAME = PRODUCT
PRODUCT_VERSION = VERSION
# Where RabbitMQ names its Erlang/OTP release, we name the runtime that actually runs.
RUNTIME_VERSION = f"Python {platform.python_version()}"
PROMETHEUS_PLUGIN_VERSION = VERSION


def prometheus_client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prometheus-client")
    except PackageNotFoundError:
        return "unknown"


def cluster_permanent_id(broker: "Broker") -> str:
    """A stable id in RabbitMQ's form, derived from the cluster name."""
    digest = hashlib.sha256(broker.cluster_name.encode()).digest()[:16]
    return "rabbitmq-cluster-id-" + base64.urlsafe_b64encode(digest).decode().rstrip("=")
