"""The web UI's files come from the package, with headers that stop framing, sniffing and
foreign scripts; and /api/overview answers RabbitMQ's `samples` for the UI's charts."""

from __future__ import annotations

import re

from amqp_server.management.rates import HISTORY_SECONDS, RateSampler, SampleWindow
from amqp_server.management.web_ui import UI_DIR, ui_files

from tests.test_management_client import api, broker  # noqa: F401  (fixtures)


def test_the_page_is_served_at_the_root_without_credentials(api):
    page = api.request("GET", "/", user="")
    assert page.status == 200
    assert page.headers["Content-Type"].startswith("text/html")
    assert '<script type="module" src="ui/js/main.js">' in page.text
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["X-Content-Type-Options"] == "nosniff"


def test_every_file_the_page_loads_is_in_the_package(api):
    page = api.request("GET", "/", user="").text
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert referenced, "the page loads its scripts and styles"
    for path in referenced:
        assert path.startswith("ui/"), f"{path} is not served by the broker"
        reply = api.request("GET", "/" + path, user="")
        assert reply.status == 200, path
    assert api.request("GET", "/ui/js/main.js", user="").headers["Content-Type"].startswith("text/javascript")


def test_scripts_import_only_the_packages_own_modules():
    for name, path in ui_files().items():
        if not name.endswith(".js") or name.startswith("vendor/"):
            continue
        for target in re.findall(r"^import .* from '([^']+)';", path.read_text(), flags=re.MULTILINE):
            assert target.startswith("./") or target.startswith("../"), f"{name} imports {target}"
            assert (path.parent / target).resolve().is_file(), f"{name} imports missing {target}"


def test_the_vendored_chart_library_ships_with_its_license():
    files = ui_files()
    assert "vendor/uplot/uPlot.iife.min.js" in files
    assert "MIT" in files["vendor/uplot/LICENSE"].read_text()
    assert (UI_DIR / "vendor" / "uplot" / "VERSION").read_text().strip() == "1.6.32"


def test_paths_outside_the_ui_files_are_not_served(api):
    for path in ("/ui/../app.py", "/ui/%2e%2e/app.py", "/ui/", "/ui/nothing.js", "/ui/js/../../app.py"):
        assert api.request("GET", path, user="").status == 404, path


def test_overview_answers_samples_for_its_charts():
    clock, wall = [100.0], [1_700_000_000.0]
    rates = RateSampler(clock=lambda: clock[0], wall_clock=lambda: wall[0], history_keys=("overview",))
    for published in (0, 10, 30, 60):
        rates.record([("overview", {"publish": published}), ("queue", {"publish": published})])
        clock[0] += 5
        wall[0] += 5
    details = rates.details("overview", {"publish": 70}, SampleWindow(age=60, incr=5))["publish_details"]
    assert [s["sample"] for s in details["samples"]] == [60, 30, 10, 0]
    assert [s["timestamp"] for s in details["samples"]] == [1_700_000_015_000, 1_700_000_010_000, 1_700_000_005_000,
                                                          1_700_000_000_000]
    sparse = rates.details("overview", {"publish": 70}, SampleWindow(age=60, incr=10))["publish_details"]["samples"]
    assert [s["sample"] for s in sparse] == [60, 10]
    short = rates.details("overview", {"publish": 70}, SampleWindow(age=10, incr=5))["publish_details"]["samples"]
    assert [s["sample"] for s in short] == [60, 30]
    assert rates.details("queue", {"publish": 70}, SampleWindow(60, 5))["publish_details"]["samples"] == []


def test_the_overview_keeps_an_hour_of_samples_and_no_more():
    clock = [0.0]
    rates = RateSampler(clock=lambda: clock[0], history_keys=("overview",))
    for n in range(2 * HISTORY_SECONDS // 5):
        rates.record([("overview", {"messages": n})])
        clock[0] += 5
    samples = rates.samples("overview", "messages", SampleWindow(age=10 * HISTORY_SECONDS, incr=5))
    assert HISTORY_SECONDS // 5 <= len(samples) <= HISTORY_SECONDS // 5 + 2


def test_overview_route_takes_rabbitmqs_age_and_incr_parameters(api):
    overview = api.get("/api/overview?lengths_age=60&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5")
    assert overview["queue_totals"]["messages_details"]["samples"] == []  # no sampling round ran in this test app
    assert overview["message_stats"]["publish_details"]["samples"] == []
    assert "samples" not in api.get("/api/overview")["message_stats"]["publish_details"]
    bad = api.request("GET", "/api/overview?msg_rates_age=-1&msg_rates_incr=5")
    assert (bad.status, bad.json()["error"]) == (400, "bad_request")
