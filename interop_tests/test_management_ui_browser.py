"""The management web UI in a real browser: headless Chromium against the real broker.

One broker and one browser for the module (tests log in as they need and keep apart by
unique names). An operator's round: log in, create a queue, publish to it, get the message
back with its headers, purge, bind; close a pika connection; add a user and see, as that
user, what it may not do; export and re-import definitions; watch the rate chart move while a
publisher runs; and time the overview against 10,000 queues (recorded in
docs/management-ui.md, not asserted). Every page is photographed for that doc.
"""

from __future__ import annotations

import http.server as http_server
import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import requests
from pika.exceptions import ConnectionClosedByBroker
from selenium.webdriver.common.by import By

from interop_tests.broker_process import BrokerProcess, free_port, launch
from interop_tests.browser import Ui, screenshot_dir, start_chromium

BULK_QUEUES = 10_000
PUBLISHER_LIMIT_S = 40.0


@pytest.fixture(scope="module")
def ui_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    port = free_port()
    broker = launch(tmp_path_factory.mktemp("ui-broker"), extra_args=("--management-port", str(port)))
    try:
        yield broker, f"http://127.0.0.1:{port}"
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def ui(ui_broker, downloads, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    _broker, base_url = ui_broker
    driver = start_chromium(downloads)
    try:
        yield Ui(driver, base_url, screenshot_dir(tmp_path_factory.mktemp("screenshots")))
    finally:
        driver.quit()


@pytest.fixture
def http(ui_broker) -> Iterator[requests.Session]:
    """The API as a script sees it (basic auth), to check what the UI did."""
    session = requests.Session()
    session.auth = ("guest", "guest")
    yield session
    session.close()


def api_url(ui_broker, path: str) -> str:
    return ui_broker[1] + path


def as_guest(ui: Ui) -> None:
    if ui.driver.find_elements(By.CSS_SELECTOR, "button[name=logout]") and "guest" in ui.find("header .who").text:
        return
    ui.log_in("guest", "guest")
    ui.find("nav.main")


def test_login_refuses_a_user_without_a_management_tag(ui):
    ui.open("/", reload=True)
    ui.find("input[name=username]")
    ui.log_in("limited", "limited")  # a user of the broker, without any management tag
    assert "Not management user" in ui.wait_for_text("Not management user", ".login .notice.error").text
    ui.screenshot("login")
    ui.log_in("guest", "wrong")
    ui.wait_for_text("Login failed", ".login .notice.error")
    ui.log_in("guest", "guest")
    assert "guest" in ui.find("header .who").text
    assert not ui.driver.find_elements(By.CSS_SELECTOR, ".login")


def test_create_publish_get_purge_and_bind_a_queue(ui, ui_broker, http, unique):
    as_guest(ui)
    queue = unique("ui-queue")
    ui.open("/queues")
    add = ui.section("Add a queue")
    ui.fill("name", queue, add)
    ui.fill("arguments", '{"x-max-length": 1000}', add)
    ui.press("Add queue", add)
    ui.wait_for_text(f"Queue {queue} declared", ".notice.ok")
    ui.fill("filter", queue + "\n")
    ui.click(By.LINK_TEXT, queue)
    ui.wait_for_text(f"Queue {queue}", "h1")

    publish = ui.section("Publish a message")
    ui.fill("publish_headers", '{"trace-id": "t-42", "attempt": 3}', publish)
    ui.fill("payload", "hello from the browser", publish)
    ui.press("Publish message", publish)
    ui.wait_for_text("Message published.", ".publish-result")

    got = ui.section("Get messages")
    ui.fill("ackmode", "ack_requeue_true", got)
    ui.press("Get messages", got)
    message = ui.find(".message[data-position='1']")
    assert ui.find("pre.payload", message).text == "hello from the browser"
    headers = ui.find(".headers", message).text
    assert "trace-id" in headers and "t-42" in headers and "attempt" in headers
    ui.screenshot("queue")

    ui.press("Purge messages", ui.section("Purge and delete"))
    assert "Purge queue" in ui.confirm()
    ui.wait_for_text(f"Queue {queue} purged.", ".notice.ok")
    assert http.get(api_url(ui_broker, f"/api/queues/%2F/{queue}")).json()["messages"] == 0

    bind_form = ui.find("input[name=source]").find_element(By.XPATH, "ancestor::form")
    ui.fill("source", "amq.direct", bind_form)
    ui.fill("routing_key", "ui-key", bind_form)
    ui.press("Bind", bind_form)
    ui.wait_for_text("amq.direct", ".panel table")
    bindings = http.get(api_url(ui_broker, f"/api/queues/%2F/{queue}/bindings")).json()
    assert {(b["source"], b["routing_key"]) for b in bindings} == {("", queue), ("amq.direct", "ui-key")}
    assert ui.errors() == []


# (table css, text of a cell, by header?) -> the cells of the first row with that cell, as a list
# or {header: text}; null when there is none yet.
ROW_CELLS = """
const [css, text, byHeader] = arguments;
for (const table of document.querySelectorAll(css)) {
  const headers = [...table.querySelectorAll('th')].map((th) => th.textContent);
  for (const row of table.querySelectorAll('tbody tr')) {
    const cells = [...row.querySelectorAll('td')].map((td) => td.textContent);
    if (cells.includes(text)) return byHeader ? Object.fromEntries(headers.map((h, i) => [h, cells[i]])) : cells;
  }
}
return null;"""
# The figures of a stream's panel, by their data-field, and its record count.
STREAM_FIGURES = """
const panel = document.querySelector('.panel.stream');
const figures = Object.fromEntries([...panel.querySelectorAll('[data-field]')].map((e) => [e.dataset.field, e.textContent]));
figures.records = [...panel.querySelectorAll('tr')].find((tr) => tr.querySelector('th')?.textContent === 'Records')
  .querySelector('td').textContent;
return figures;"""


def test_a_streams_page_shows_its_offsets_and_its_consumers_offsets(ui, ui_broker, http, unique):
    """A stream with records 0..9 and a consumer from offset 4 holding 3 unacked deliveries
    (prefetch 3): its page shows the offsets, the segment, the bytes on disk and that the
    consumer reads offset 7 next; the list shows its type."""
    as_guest(ui)
    broker, _base = ui_broker
    stream = unique("ui-stream")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    try:
        channel = connection.channel()
        channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        for index in range(10):
            channel.basic_publish("", stream, b"record %d" % index)
        channel.basic_qos(prefetch_count=3)
        delivered = []
        channel.basic_consume(stream, lambda _ch, method, properties, _body: delivered.append(
            properties.headers["x-stream-offset"]), consumer_tag="ui-stream-reader", arguments={"x-stream-offset": 4})
        deadline = time.monotonic() + 10
        while len(delivered) < 3 and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.1)
        assert delivered == [4, 5, 6]

        ui.open("/queues")
        ui.fill("filter", stream + "\n")
        # Read in one script each: the page redraws its tables every 5 s (no stale elements).
        cells = ui.wait(lambda d: ui.script(ROW_CELLS, "table", stream), what="the stream's row")
        assert "stream" in cells
        ui.click(By.LINK_TEXT, stream)
        ui.wait_for_text("Last offset", ".panel.stream")
        figures = ui.script(STREAM_FIGURES)
        shown = http.get(api_url(ui_broker, f"/api/queues/%2F/{stream}")).json()
        disk_bytes = shown["stream_disk_bytes"]
        assert 0 < disk_bytes < 1024  # shown in bytes
        assert figures == {"first-offset": "0", "last-offset": "9", "segments": "1", "disk-bytes": f"{disk_bytes} B",
                           "records": "10", "figures-node": shown["node"]}  # the node holding it: its own figures
        consumer = ui.wait(lambda d: ui.script(ROW_CELLS, "table", "ui-stream-reader", True), what="the consumer")
        assert consumer["Offset"] == "7"
        danger = ui.section("Purge and delete")
        assert not ui.find("button[name=purge]", danger).is_displayed(), "nothing to purge in a stream"
        assert ui.find("button[name=delete]", danger).is_displayed()
        assert not [s for s in ui.driver.find_elements(By.CSS_SELECTOR, "details.section > summary")
                    if s.text.strip() == "Get messages" and s.is_displayed()], "no get for a stream"
        assert ui.errors() == []
        ui.screenshot("stream")
    finally:
        connection.close()


def test_close_a_connection_opened_by_pika(ui, ui_broker):
    as_guest(ui)
    broker, _base = ui_broker
    parameters = pika.URLParameters(broker.url())
    parameters.client_properties = {"connection_name": "billing-worker"}
    connection = pika.BlockingConnection(parameters)
    try:
        ui.open("/connections")
        ui.click(By.XPATH, "//td[.//div[text()='billing-worker']]//a")
        ui.wait_for_text("Pika", ".panel")  # its client properties
        ui.screenshot("connection")
        ui.press("Close this connection")
        ui.confirm(typed="maintenance window")
        ui.wait_for_text("closed.", ".notice.ok")
        with pytest.raises(ConnectionClosedByBroker) as closed:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.5)
        assert closed.value.reply_code == 320
        assert "maintenance window" in closed.value.reply_text
    finally:
        if connection.is_open:
            connection.close()


def test_a_new_user_sees_what_it_may_not_do(ui, ui_broker, http, unique):
    as_guest(ui)
    user, protected = unique("viewer"), unique("protected")
    assert http.put(api_url(ui_broker, f"/api/queues/%2F/{protected}"), json={"durable": True}).status_code == 201
    ui.open("/admin/users")
    ui.fill("new-user", user)
    ui.fill("new-user-password", "viewer-secret")
    ui.press("Add user")
    ui.wait_for_text(f"User {user} added.", ".notice.ok")
    permission_form = ui.find("select[name=permission-user]").find_element(By.XPATH, "ancestor::form")
    ui.wait(lambda d: user in [o.text for o in d.find_elements(By.CSS_SELECTOR, "select[name=permission-user] option")],
            what="the new user in the permission form")
    ui.fill("permission-user", user, permission_form)
    ui.fill("permission-vhost", "/", permission_form)
    ui.fill("configure", "^$", permission_form)  # may declare and delete nothing
    ui.press("Set permissions", permission_form)
    ui.wait_for_text(f"Permissions of {user} in / set.", ".notice.ok")
    row = ui.find("main").find_element(By.XPATH, f".//tr[td[1]='{user}']")
    ui.press("Edit", row)
    ui.fill("new-password", "viewer-secret-2")
    ui.press("Update user")
    ui.wait_for_text(f"User {user} updated.", ".notice.ok")
    ui.screenshot("admin-users")

    ui.log_out()
    ui.log_in(user, "viewer-secret")
    ui.wait_for_text("Login failed", ".login .notice.error")  # the password was changed
    ui.log_in(user, "viewer-secret-2")
    ui.find("nav.main")
    assert [a.text for a in ui.driver.find_elements(By.CSS_SELECTOR, "nav.main a")] == [
        "Overview", "Connections", "Channels", "Exchanges", "Queues"], "no Admin for a management user"
    ui.open(f"/queues/%2F/{protected}")
    ui.press("Delete queue", ui.section("Purge and delete"))
    ui.confirm()
    error = ui.wait_for_text("Access refused.", ".notice.error")
    assert "401" in error.text
    assert http.get(api_url(ui_broker, f"/api/queues/%2F/{protected}")).status_code == 200, "still there"
    ui.screenshot("refused")
    ui.open("/admin")
    ui.wait_for_text("The admin pages are for users tagged administrator")
    ui.log_out()


def test_a_policymaker_gets_the_policies_tab_only(ui, ui_broker, http, unique):
    user = unique("policymaker")
    assert http.put(api_url(ui_broker, f"/api/users/{user}"), json={"password": "pm", "tags": "policymaker"}).status_code == 201
    assert http.put(api_url(ui_broker, f"/api/permissions/%2F/{user}"),
                    json={"configure": ".*", "write": ".*", "read": ".*"}).status_code == 201
    ui.log_in(user, "pm")
    ui.click(By.LINK_TEXT, "Admin")
    ui.wait_for_text("Policies", "main h2")
    assert [a.text for a in ui.driver.find_elements(By.CSS_SELECTOR, ".subnav a")] == ["Policies and limits"]
    assert ui.errors() == []
    ui.log_out()


def test_policies_and_limits_from_admin(ui, ui_broker, http, unique):
    as_guest(ui)
    policy, queue = unique("ui-ttl"), unique("ui-policed")
    ui.open("/admin/policies")
    add = ui.section("Add or update a policy")
    ui.fill("policy-name", policy, add)
    ui.fill("policy-pattern", "^ui-policed-", add)
    ui.fill("policy-apply-to", "queues", add)
    ui.fill("policy-definition", '{"message-ttl": 60000}', add)
    ui.press("Set policy", add)
    ui.wait_for_text(f"Policy {policy} set in /.", ".notice.ok")
    ui.wait_for_text(policy, ".panel table")

    limits = ui.find("select[name=limit-vhost]").find_element(By.XPATH, "ancestor::form")
    ui.fill("limit-vhost", "other", limits)
    ui.fill("vhost-limit", "max-connections", limits)
    ui.fill("vhost-limit-value", "10", limits)
    ui.press("Set virtual host limit", limits)
    ui.wait_for_text("max-connections: 10", ".panel table")
    ui.screenshot("admin-policies")

    assert http.put(api_url(ui_broker, f"/api/queues/%2F/{queue}"), json={}).status_code == 201
    assert http.get(api_url(ui_broker, f"/api/queues/%2F/{queue}")).json()["policy"] == policy
    ui.open("/queues")
    ui.fill("filter", queue + "\n")
    ui.wait_for_text(policy, ".list-table .badge.policy")

    ui.open("/admin/policies")
    ui.press("Clear", ui.wait_for_text("max-connections: 10", ".panel table"))
    ui.confirm()
    ui.wait_for_text("No virtual host limits.")
    ui.press("Delete", ui.wait_for_text(policy, ".panel table"))
    assert policy in ui.confirm()
    ui.wait_for_text("No policies.")
    assert http.get(api_url(ui_broker, "/api/vhost-limits/other")).json() == []
    assert ui.errors() == []


def test_export_and_reimport_definitions(ui, ui_broker, http, downloads, unique):
    as_guest(ui)
    queue = unique("defs-queue")
    assert http.put(api_url(ui_broker, f"/api/queues/%2F/{queue}"),
                    json={"durable": True, "arguments": {"x-message-ttl": 60000}}).status_code == 201
    ui.open("/admin/definitions")
    ui.press("Download broker definitions")
    ui.wait_for_text("Definitions exported.", ".notice.ok")
    exported = ui.wait(lambda d: next((p for p in downloads.glob("definitions-*.json") if p.stat().st_size), None),
                       what="the downloaded definitions file")
    definitions = json.loads(exported.read_text())
    assert {"name": queue, "vhost": "/", "durable": True, "auto_delete": False,
            "arguments": {"x-message-ttl": 60000}} in definitions["queues"]

    assert http.delete(api_url(ui_broker, f"/api/queues/%2F/{queue}")).status_code == 204
    upload = ui.find("input[name=definitions-file]")
    upload.send_keys(str(exported))
    ui.press("Upload broker definitions")
    assert "Import definitions-" in ui.confirm()
    ui.wait_for_text(f"Definitions imported from {exported.name}.", ".notice.ok")
    restored = http.get(api_url(ui_broker, f"/api/queues/%2F/{queue}")).json()
    assert (restored["durable"], restored["arguments"]) == (True, {"x-message-ttl": 60000})
    ui.screenshot("admin-definitions")


def test_move_messages_to_another_queue_with_a_shovel(ui, ui_broker, http, unique):
    """The queue page's "Move messages" makes RabbitMQ's "Move from <queue>" shovel, which
    moves what the queue holds into the destination and deletes itself."""
    as_guest(ui)
    broker, _base = ui_broker
    queue, destination = unique("move-from"), unique("move-to")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for i in range(25):
        channel.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    connection.close()
    ui.open(f"/queues/%2F/{queue}")
    ui.wait_for_text(f"Queue {queue}", "h1")
    move = ui.section("Move messages")
    ui.fill("destination_queue", destination, move)
    ui.press("Move messages", move)
    ui.wait_for_text(f"Moving messages from {queue} to {destination}.", ".notice.ok")
    ui.wait_for_text("Messages moved.", ".move-status", timeout=30)
    assert http.get(api_url(ui_broker, f"/api/queues/%2F/{destination}")).json()["messages"] == 25
    assert http.get(api_url(ui_broker, f"/api/queues/%2F/{queue}")).json()["messages"] == 0
    assert http.get(api_url(ui_broker, "/api/parameters/shovel")).json() == []
    assert ui.errors() == []


def test_federation_upstreams_and_links_from_admin(ui, ui_broker, http, unique):
    """Admin > Federation: an upstream set from the form, the link a policy then starts (here
    from this same broker, over TCP), its Restart, and the upstream deleted."""
    as_guest(ui)
    broker, _base = ui_broker
    upstream, exchange, source = unique("ui-up"), unique("ui-fed"), unique("ui-src")
    assert http.put(api_url(ui_broker, f"/api/exchanges/%2F/{source}"), json={"type": "fanout"}).status_code == 201
    ui.open("/admin/federation")
    form = ui.find("input[name=upstream-name]").find_element(By.XPATH, "ancestor::form")
    ui.fill("upstream-name", upstream, form)
    ui.fill("upstream-uri", broker.url(), form)
    ui.fill("upstream-exchange", source, form)
    ui.press("Set upstream", form)
    ui.wait_for_text(f"Upstream {upstream} set in /.", ".notice.ok")
    ui.wait_for_text(upstream, ".panel table")
    assert "guest:guest@" not in ui.find("main").text, "the URI is shown without its password"
    assert http.put(api_url(ui_broker, f"/api/policies/%2F/{upstream}"), json={
        "pattern": f"^{exchange}$", "definition": {"federation-upstream": upstream}}).status_code == 201
    assert http.put(api_url(ui_broker, f"/api/exchanges/%2F/{exchange}"), json={"type": "fanout"}).status_code == 201
    row = ui.wait(lambda d: next((r for r in d.find_elements(By.XPATH, f"//tr[td[2]='exchange {exchange}']")
                                  if "running" in r.text), None), timeout=20, what="the link running")
    ui.screenshot("admin-federation")
    ui.press("Restart", row)
    ui.wait_for_text("Link restarting.", ".notice.ok")
    ui.press("Delete", ui.find("main").find_element(By.XPATH, f".//tr[td[2]='{upstream}']"))
    assert upstream in ui.confirm()
    ui.wait_for_text(f"Upstream {upstream} deleted.", ".notice.ok")
    ui.wait(lambda d: not d.find_elements(By.XPATH, f"//tr[td[2]='exchange {exchange}']"), timeout=20,
            what="the link gone with its upstream")
    assert http.get(api_url(ui_broker, "/api/federation-links")).json() == []
    assert ui.errors() == []


PUBLISHER_RATE = 100.0  # messages/s: far above what the other tests publish, far below the publisher


def top_publish_rate(ui: Ui) -> float:
    """The highest point of the publish series the overview's rate chart draws now."""
    series = ui.script("const chart = window.amqpUi.charts['message-rates']; return chart ? chart.data[1] : [];") or []
    return max([rate for rate in series if rate is not None], default=0.0)


def test_the_rate_chart_moves_while_a_publisher_runs(ui, ui_broker):
    as_guest(ui)
    broker, _base = ui_broker
    ui.open("/", reload=True)
    ui.find(".overview[data-ready]")
    assert top_publish_rate(ui) < PUBLISHER_RATE, "quiet before the publisher starts"
    stop = threading.Event()

    def publish() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
        channel = connection.channel()
        channel.queue_declare("ui-rate-chart", auto_delete=True)
        deadline = time.monotonic() + PUBLISHER_LIMIT_S
        while not stop.is_set() and time.monotonic() < deadline:
            for _ in range(50):
                channel.basic_publish("", "ui-rate-chart", b"tick")
            connection.process_data_events(time_limit=0.05)
        connection.close()

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        # The broker samples every 5 s and the page polls every 5 s: two samples after the start.
        ui.wait(lambda d: top_publish_rate(ui) > PUBLISHER_RATE, timeout=35, what="the publish rate to rise")
        ui.screenshot("overview")
    finally:
        stop.set()
        publisher.join()


def test_an_alarm_in_force_is_shown_on_the_overview(ui, ui_broker, http):
    as_guest(ui)
    watermark = api_url(ui_broker, "/api/amqp-server/vm-memory-high-watermark")
    assert http.put(watermark, json={"absolute": 1}).status_code == 204  # any memory use is over it
    try:
        ui.open("/", reload=True)
        alarm = ui.wait_for_text("Memory alarm", ".alarm-box")
        assert "Publishing connections are blocked" in alarm.text
        ui.screenshot("overview-alarm")
    finally:
        assert http.put(watermark, json={"relative": 0.4}).status_code == 204
    ui.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, ".alarm-box"), timeout=20, what="the alarm to clear")


def test_names_from_clients_are_shown_as_text_never_run(ui, ui_broker, http):
    as_guest(ui)
    name = '<img src=x onerror="window.injected=1">'
    queue_path = "/api/queues/%2F/" + requests.utils.quote(name, safe="")
    assert http.put(api_url(ui_broker, queue_path), json={}).status_code == 201
    try:
        ui.open("/queues")
        ui.fill("filter", "onerror\n")
        ui.wait_for_text(name, ".list-table")
        ui.click(By.LINK_TEXT, name)
        ui.wait_for_text(name, "h1")
        assert ui.script("return window.injected === undefined && document.querySelectorAll('main img').length === 0")
    finally:
        http.delete(api_url(ui_broker, queue_path))


ATTACK_PAGE = """<!doctype html><title>cat pictures</title>
<form id="import" method="POST" action="{api}/api/definitions" enctype="text/plain">
<input name='{{"users": [{{"name": "csrf-admin", "password": "x", "tags": "administrator"}}], "ignored": "' value='"}}'>
</form>
<script>
const api = "{api}";
Promise.allSettled([
  fetch(api + "/api/vhosts/csrf-vhost", {{method: "PUT", credentials: "include",
    headers: {{"Content-Type": "application/json"}}, body: "{{}}"}}),
  fetch(api + "/api/queues/%2F/csrf-queue", {{method: "PUT", credentials: "include", mode: "no-cors", body: "{{}}"}}),
  fetch(api + "/api/definitions", {{method: "POST", credentials: "include", mode: "no-cors",
    body: JSON.stringify({{users: [{{name: "csrf-admin", password: "x", tags: "administrator"}}]}})}}),
]).then(() => document.getElementById("import").submit());
</script>"""


def test_a_foreign_page_cannot_use_the_operators_session(ui, ui_broker, http):
    """Another origin on the same machine (same site for the browser: SameSite does not help
    here) tries a preflighted JSON write, simple no-cors writes and a text/plain form import
    while the operator is logged in; the CSRF token and the Origin check refuse them all."""
    as_guest(ui)
    page = ATTACK_PAGE.format(api=ui_broker[1]).encode()

    class AttackPage(http_server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            pass

    attacker = http_server.HTTPServer(("127.0.0.1", 0), AttackPage)
    serving = threading.Thread(target=attacker.serve_forever)
    serving.start()
    try:
        ui.driver.get(f"http://127.0.0.1:{attacker.server_address[1]}/")
        ui.wait(lambda d: d.current_url.endswith("/api/definitions"), what="the forged form to be sent")
        assert "forbidden" in ui.page_text()
    finally:
        attacker.shutdown()
        serving.join()
        attacker.server_close()
    assert http.get(api_url(ui_broker, "/api/users/csrf-admin")).status_code == 404
    assert http.get(api_url(ui_broker, "/api/vhosts/csrf-vhost")).status_code == 404
    assert http.get(api_url(ui_broker, "/api/queues/%2F/csrf-queue")).status_code == 404
    as_guest(ui)


def test_overview_time_to_interactive_with_10000_queues(ui, ui_broker, http):
    as_guest(ui)
    assert http.put(api_url(ui_broker, "/api/vhosts/bulk"), json={}).status_code in (201, 204)
    queues = [{"name": f"bulk-{n:05d}", "vhost": "bulk", "durable": False, "auto_delete": False, "arguments": {}}
              for n in range(BULK_QUEUES)]
    imported = http.post(api_url(ui_broker, "/api/definitions"), json={"queues": queues})
    assert imported.status_code == 204
    assert http.get(api_url(ui_broker, "/api/overview")).json()["object_totals"]["queues"] >= BULK_QUEUES

    timings = []
    for _ in range(5):
        ui.open("/", reload=True)
        ui.find(".overview[data-ready]")
        timings.append(ui.script("return performance.getEntriesByName('overview-ready')[0].startTime"))
    print(f"\noverview ready with {BULK_QUEUES} queues: median {statistics.median(timings):.0f} ms "
          f"(runs: {', '.join(f'{t:.0f}' for t in timings)})")

    ui.open("/queues")
    started = time.monotonic()
    ui.fill("filter", "bulk-0999\n")
    ui.wait_for_text("10 match the filter", ".pager")
    print(f"queue list filtered among {BULK_QUEUES} queues in {1000 * (time.monotonic() - started):.0f} ms")
    total = http.get(api_url(ui_broker, "/api/queues?page=1&page_size=1")).json()["total_count"]
    ui.fill("filter", "\n")
    ui.wait(lambda d: "match the filter" not in ui.find(".pager").text, what="the unfiltered list")
    assert f"Page 1 of {-(-total // 100)} · {total:,} in all" in ui.find(".pager").text
    assert len(ui.driver.find_elements(By.CSS_SELECTOR, ".list-table tbody tr")) == 100, "one page of 100 reached the browser"
    ui.fill("page-size", "20")
    ui.wait_for_text(f"Page 1 of {-(-total // 20)} ·", ".pager")
    ui.screenshot("queues")


PAGES = [
    ("/exchanges", "exchanges", "amq.topic"),
    ("/exchanges/%2F/amq.direct", "exchange", "Bindings from this exchange"),
    ("/channels", "channels", "Channel"),
    ("/admin/vhosts", "admin-vhosts", "Tracing (firehose)"),
    ("/admin/features", "admin-features", "quorum_queue"),
]


def test_every_page_shows_without_errors(ui, ui_broker, http, unique):
    as_guest(ui)
    vhost = unique("ui-vhost")
    broker, _base = ui_broker
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_qos(prefetch_count=10)
        channel.queue_declare("ui-consumed")
        channel.basic_consume("ui-consumed", lambda *args: None, consumer_tag="ui-consumer")
        for path, name, text in PAGES:
            ui.open(path)
            ui.wait_for_text(text, "main")
            assert ui.errors() == [], path
            ui.screenshot(name)

        ui.open("/admin/vhosts")
        ui.fill("vhost-name", vhost)
        ui.fill("vhost-description", "made in the browser")
        ui.press("Add virtual host")
        row = ui.wait(lambda d: d.find_element(By.XPATH, f"//tr[td[1]='{vhost}']"), what="the new vhost")
        row.find_element(By.CSS_SELECTOR, "input[name=tracing]").click()
        ui.wait_for_text(f"Tracing on in {vhost}", ".notice.ok")
        assert http.get(api_url(ui_broker, "/api/vhosts/" + vhost)).json()["tracing"] is True
        assert http.get(api_url(ui_broker, "/api/vhosts/" + vhost)).json()["description"] == "made in the browser"
        ui.press("Delete", ui.find("main").find_element(By.XPATH, f".//tr[td[1]='{vhost}']"))
        assert vhost in ui.confirm()
        ui.wait_for_text(f"Virtual host {vhost} deleted.", ".notice.ok")
        assert http.get(api_url(ui_broker, "/api/vhosts/" + vhost)).status_code == 404
        ui.open("/channels")
        ui.click(By.PARTIAL_LINK_TEXT, "(1)")
        ui.wait_for_text("ui-consumer", "main")
        assert ui.find("main").find_element(By.XPATH, ".//tr[th='Confirm mode']/td").text == "on"
        assert ui.errors() == []
        ui.screenshot("channel")
    finally:
        connection.close()
