"""Fixtures shared by every interop test: a real broker reached over TCP."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from interop_tests.broker_process import BrokerProcess, external_broker, launch
from interop_tests.scenario_programs import ControlledBroker
from interop_tests.scenario_programs import controlled_broker as start_controlled_broker

# The helper modules that assert on the tests' behalf (none of them imported above): rewrite
# their asserts too, so failures show values.
pytest.register_assert_rewrite("interop_tests.pika_helpers", "interop_tests.aio_pika_helpers",
                               "interop_tests.client_expectations")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the whole session; tests keep apart by using unique names."""
    external = external_broker()
    if external is not None:
        yield external
        return
    process = launch(tmp_path_factory.mktemp("broker"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start dedicated brokers (own config, own data dir) that a test may kill or restart."""
    started: list[BrokerProcess] = []

    def start(config_text: str | None = None, extra_args: tuple[str, ...] = ()) -> BrokerProcess:
        workdir = tmp_path / f"broker{len(started)}"
        kwargs = {"extra_args": extra_args}
        if config_text is not None:
            kwargs["config_text"] = config_text
        process = launch(workdir, **kwargs)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@pytest.fixture(scope="module")
def controlled_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlledBroker]:
    """A broker of the test module's own with an AMQPS listener, which its tests may put under a
    memory alarm and restart (scenario_programs.ControlledBroker); the external one with
    INTEROP_BROKER_URL."""
    with start_controlled_broker(tmp_path_factory.mktemp("controlled")) as broker:
        yield broker


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Names that no other test uses, so tests can share one broker."""
    token = uuid.uuid4().hex[:8]
    return lambda prefix: f"{prefix}-{token}"
