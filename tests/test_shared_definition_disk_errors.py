"""A shared definition this node cannot store (a full disk) is one log line, not a traceback:
a node restarted on a full data directory applies every definition again, and a traceback for
each buried the one line that says why (docs/reliability.md)."""

from __future__ import annotations

import errno
import logging

import pytest

from amqp_server.broker.broker import Broker
from cluster.definitions import apply as apply_module
from cluster.definitions.apply import LocalDefinitions
from cluster.definitions.keys import SharedValue


def _definitions() -> LocalDefinitions:
    return LocalDefinitions(Broker(), "a", mirror=None, is_pending=lambda key: False,  # type: ignore[arg-type]
                            set_ownership=lambda *args: None)


def test_a_definition_a_full_disk_refuses_is_one_error_line_without_a_traceback(monkeypatch, caplog) -> None:
    def full_disk(definitions, key, value):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setitem(apply_module._APPLIERS, "vhosts", full_disk)
    with caplog.at_level(logging.ERROR, logger="cluster.definitions.apply"):
        _definitions().apply("/vhosts/v1", SharedValue("vhosts", {"name": "v1"}, by="b:1", seq=1))
    [record] = caplog.records
    assert "/vhosts/v1" in record.getMessage() and "No space left on device" in record.getMessage()
    assert record.exc_info is None


@pytest.mark.parametrize("error", [ValueError("a bug"), KeyError("name")])
def test_any_other_failure_still_logs_its_traceback(monkeypatch, caplog, error) -> None:
    def broken(definitions, key, value):
        raise error

    monkeypatch.setitem(apply_module._APPLIERS, "vhosts", broken)
    with caplog.at_level(logging.ERROR, logger="cluster.definitions.apply"):
        _definitions().apply("/vhosts/v1", SharedValue("vhosts", {"name": "v1"}, by="b:1", seq=1))
    [record] = caplog.records
    assert record.exc_info is not None
