"""The brokers a run measures: a label, an AMQP URL and (for CPU and memory figures) the broker's pid."""

from __future__ import annotations

from dataclasses import dataclass

from bench import procfs
from bench.lean_client import BrokerAddress


@dataclass(frozen=True)
class Target:
    label: str
    url: str
    pid: int | None
    # Publishers connect here instead of `url` (another node of the same cluster: the messages
    # are forwarded to the queues' owner, which `url` is).
    publish_via: str | None = None
    # The cluster's nodes, each at an address that reaches it alone (`amqp-server --workers N`:
    # each worker's own port, from /api/nodes): scenarios that place queues and clients on
    # chosen nodes (bench/scenarios.py, "spread" and "hot-queue").
    nodes: tuple[str, ...] = ()
    # The directory the broker keeps its streams under (ours: <data_dir>/streams; RabbitMQ:
    # <mnesia dir>/stream): the streams scenario's retention variant measures a stream's files.
    stream_dir: str | None = None

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress.from_url(self.url)

    @property
    def publish_url(self) -> str:
        return self.publish_via or self.url


def parse_targets(target_args: list[str], url_args: list[str], pid_args: list[str],
                  publish_via_args: list[str] = (), node_args: list[str] = (),
                  stream_dir_args: list[str] = ()) -> list[Target]:
    """Build targets from `--target label=url` and `--url url` options, in the order given.

    `--broker-pid label=pid` names a target's broker process; otherwise the pid is
    found as the process listening on the URL's port (falling back to the single
    beam.smp process for a target whose label mentions rabbit).
    """
    pairs: list[tuple[str, str]] = []
    for arg in target_args:
        label, sep, url = arg.partition("=")
        if not sep or not label or not url:
            raise ValueError(f"--target wants label=amqp://..., got {arg!r}")
        pairs.append((label, url))
    for url in url_args:
        address = BrokerAddress.from_url(url)
        pairs.append((f"{address.host}:{address.port}", url))
    labels = [label for label, _ in pairs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"target labels must be unique: {labels}")
    pids: dict[str, int] = {}
    for arg in pid_args:
        label, sep, pid = arg.partition("=")
        if not sep or label not in labels:
            raise ValueError(f"--broker-pid wants label=pid for a known label, got {arg!r}")
        pids[label] = int(pid)
    via: dict[str, str] = {}
    for arg in publish_via_args:
        label, sep, url = arg.partition("=")
        if not sep or label not in labels or not url:
            raise ValueError(f"--publish-via wants label=amqp://... for a known label, got {arg!r}")
        via[label] = url
    nodes: dict[str, tuple[str, ...]] = {}
    for arg in node_args:
        label, sep, urls = arg.partition("=")
        if not sep or label not in labels or not urls:
            raise ValueError(f"--nodes wants label=amqp://...,amqp://... for a known label, got {arg!r}")
        nodes[label] = tuple(url for url in urls.split(",") if url)
    stream_dirs: dict[str, str] = {}
    for arg in stream_dir_args:
        label, sep, directory = arg.partition("=")
        if not sep or label not in labels or not directory:
            raise ValueError(f"--stream-dir wants label=DIR for a known label, got {arg!r}")
        stream_dirs[label] = directory
    return [Target(label, url, pids.get(label) or _find_pid(label, url), via.get(label), nodes.get(label, ()),
                   stream_dirs.get(label))
            for label, url in pairs]


def _find_pid(label: str, url: str) -> int | None:
    address = BrokerAddress.from_url(url)
    if address.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        pid = procfs.pid_listening_on(address.port)
        if pid is not None:
            return pid
    if "rabbit" in label.lower():
        return procfs.beam_pid()
    return None
