"""Every query of the RabbitMQ-Overview Grafana dashboard finds its metrics and labels here.

docs/grafana/rabbitmq-overview-queries.json holds the dashboard's PromQL (current and 2022
revisions). For each query: every metric it names is in our /metrics and /metrics/per-object
output, every label it filters on or groups by is on that metric (or is added by Prometheus
itself: instance, job, namespace), and the labels it joins in with group_left are on
rabbitmq_identity_info, of which each endpoint serves exactly one series (so the
many-to-one join matches).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pamqp import commands
from prometheus_client.parser import text_string_to_metric_families

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from amqp_server.broker.broker import Broker
from amqp_server.metrics.core_collector import AGGREGATED, PER_OBJECT, CoreCollector
from tests.frame_driver import opened_client
from tests.test_metrics_values import FIXED_PROCESS

QUERIES = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "rabbitmq-overview-queries.json"
DOCUMENT = json.loads(QUERIES.read_text())
PROMETHEUS_LABELS = set(DOCUMENT["labels_added_by_prometheus"])

_MODIFIER = re.compile(r"\b(on|ignoring|by|without|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"\b(rabbitmq_[a-z0-9_]+)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")
_LABEL_VALUES = re.compile(r"label_values\(\s*(rabbitmq_[a-z0-9_]+)\s*(\{[^}]*\})?\s*,\s*([a-zA-Z_]\w*)\s*\)")


class ParsedQuery:
    """The metrics a PromQL expression selects, with the labels it needs on each."""

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.join_labels: set[str] = set()  # group_left(...): brought in from identity_info
        self.grouping_labels: set[str] = set()  # on(...)/by(...): needed after the join
        for match in _MODIFIER.finditer(expr):
            labels = {label.strip() for label in match.group(2).split(",") if label.strip()}
            if match.group(1) in ("group_left", "group_right"):
                self.join_labels |= labels
            else:
                self.grouping_labels |= labels
        rest = _MODIFIER.sub(" ", expr)
        self.selectors: list[tuple[str, set[str]]] = [
            (name, {label for label, _op in _MATCHER.findall(matchers or "")})
            for name, matchers in _SELECTOR.findall(rest)
        ]


def _scrape(broker: Broker, endpoint: str) -> dict[str, list[set[str]]]:
    """metric name -> the label-name sets of its series, as Prometheus would store them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoreCollector(broker, endpoint, lambda: FIXED_PROCESS))
    series: dict[str, list[set[str]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(set(sample.labels))
    return series


@pytest.fixture(scope="module")
def busy_broker() -> Broker:
    broker = Broker()
    client = opened_client(broker, channels=(1, 2))
    client.call(1, commands.Queue.Declare(queue="q"))
    client.publish(1, b"x", routing_key="q")
    client.send(2, commands.Basic.Consume(queue="q", consumer_tag="c"))
    return broker


def _queries() -> list[tuple[str, str]]:
    found = []
    for dashboard in DOCUMENT["dashboards"]:
        for panel in dashboard["panels"]:
            found.append((f"{dashboard['revision']}: {panel['title']}", panel["expr"]))
    return found


@pytest.mark.parametrize("endpoint", [AGGREGATED, PER_OBJECT])
@pytest.mark.parametrize("title,expr", _queries(), ids=[title for title, _expr in _queries()])
def test_every_panel_query_finds_its_metrics_and_labels(busy_broker, endpoint, title, expr):
    series = _scrape(busy_broker, endpoint)
    query = ParsedQuery(expr)
    assert query.selectors, f"no metric found in {expr}"
    identity = series["rabbitmq_identity_info"]
    assert len(identity) == 1, "group_left needs exactly one identity series per scrape target"
    assert query.join_labels <= identity[0], f"{title}: identity_info lacks {query.join_labels - identity[0]}"
    for name, filtered in query.selectors:
        assert name in series, f"{title}: {name} is not exposed on /metrics ({endpoint})"
        for labels in series[name]:
            missing = filtered - labels - PROMETHEUS_LABELS
            assert not missing, f"{title}: {name} has no label {missing}"
    available = identity[0] | PROMETHEUS_LABELS
    assert query.grouping_labels <= available, f"{title}: cannot group by {query.grouping_labels - available}"


@pytest.mark.parametrize("dashboard", DOCUMENT["dashboards"], ids=[d["revision"] for d in DOCUMENT["dashboards"]])
def test_template_variables_find_their_labels_on_identity_info(busy_broker, dashboard):
    identity = _scrape(busy_broker, AGGREGATED)["rabbitmq_identity_info"][0] | PROMETHEUS_LABELS
    for variable in dashboard["variables"]:
        metric, matchers, label = _LABEL_VALUES.search(variable["query"]).groups()
        assert metric == "rabbitmq_identity_info"
        assert label in identity, f"variable {variable['name']}: no label {label}"
        assert {name for name, _op in _MATCHER.findall(matchers or "")} <= identity


def test_the_query_list_covers_both_metric_families():
    """The stored queries use the current global counters and the legacy channel names."""
    names = {name for _title, expr in _queries() for name, _labels in ParsedQuery(expr).selectors}
    assert "rabbitmq_global_messages_received_total" in names
    assert "rabbitmq_channel_messages_published_total" in names
    assert len(_queries()) >= 80
