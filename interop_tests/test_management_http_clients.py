"""HTTP clients written for RabbitMQ's management API, pointed at this broker.

Celery Flower's broker view builds its URL and reads queue lengths like this
(flower/utils/broker.py: `urljoin(http_api, 'queues/' + quote(vhost, ''))`, basic auth,
then `[q for q in info if q['name'] in names]`); monitoring scripts poll /api/overview.
Counts are current at once (RabbitMQ's lag up to 5 s).
"""

from __future__ import annotations

import urllib.parse

import pika
import pytest
import requests

from interop_tests.broker_process import free_port


@pytest.fixture
def api_broker(broker_factory):
    port = free_port()
    broker = broker_factory(extra_args=("--management-port", str(port), "--metrics-port", "0"))
    return broker, f"http://guest:guest@127.0.0.1:{port}/api/"


def flower_queues(http_api: str, vhost: str, names: list[str]) -> list[dict]:
    """What Flower's RabbitMQ.queues() does, with requests instead of tornado."""
    url = urllib.parse.urljoin(http_api, "queues/" + urllib.parse.quote(vhost, ""))
    parsed = urllib.parse.urlparse(http_api)
    response = requests.get(url, auth=(parsed.username, parsed.password), timeout=5)
    response.raise_for_status()
    return [queue for queue in response.json() if queue["name"] in names]


def test_flower_reads_queue_lengths(api_broker, unique):
    broker, http_api = api_broker
    celery, other = unique("celery"), unique("other")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.confirm_delivery()
    for queue, count in ((celery, 7), (other, 2)):
        channel.queue_declare(queue, durable=True)
        for _ in range(count):
            channel.basic_publish("", queue, b"task")
    worker = connection.channel()
    worker.basic_qos(prefetch_count=2)
    worker.basic_consume(celery, lambda *args: None)
    connection.process_data_events(time_limit=0.2)
    try:
        [queue] = flower_queues(http_api, "/", [celery])
        assert (queue["messages"], queue["messages_ready"], queue["messages_unacknowledged"]) == (7, 5, 2)
        assert queue["consumers"] == 1
        assert queue["message_stats"]["publish"] == 7
        assert queue["message_stats"]["deliver_get"] == 2
    finally:
        connection.close()


def test_overview_polling_with_basic_auth(api_broker, unique):
    broker, http_api = api_broker
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare(unique("polled"))
    channel.basic_publish("", unique("polled"), b"x")
    channel.basic_publish("", "nowhere-at-all", b"dropped")
    overview = requests.get(http_api + "overview", auth=("guest", "guest"), timeout=5).json()
    assert overview["object_totals"]["connections"] == 1
    assert overview["object_totals"]["queues"] == 1
    assert overview["queue_totals"]["messages"] == 1
    assert overview["message_stats"]["publish"] == 2
    assert overview["message_stats"]["drop_unroutable"] == 1
    assert isinstance(overview["message_stats"]["publish_details"]["rate"], float)
    assert requests.get(http_api + "overview", auth=("guest", "nope"), timeout=5).status_code == 401
    connection.close()


def test_rest_style_declare_and_delete(api_broker, unique):
    """The calls infrastructure tools make to provision a broker before clients start."""
    broker, http_api = api_broker
    auth = ("guest", "guest")
    queue = unique("provisioned")
    response = requests.put(http_api + f"queues/%2F/{queue}", json={"durable": True, "arguments": {"x-message-ttl": 1000}},
                            auth=auth, timeout=5)
    assert response.status_code == 201
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    ok = connection.channel().queue_declare(queue, durable=True, arguments={"x-message-ttl": 1000})
    assert ok.method.queue == queue
    connection.close()
    assert requests.delete(http_api + f"queues/%2F/{queue}", auth=auth, timeout=5).status_code == 204
    assert requests.get(http_api + f"queues/%2F/{queue}", auth=auth, timeout=5).status_code == 404
