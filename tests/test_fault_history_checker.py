"""The fault runs' checker (interop_tests/faults/history.py) on histories made by hand: each
property it judges, caught when broken and passed when kept."""

from __future__ import annotations

import pytest

from interop_tests.faults.history import check, fault_table, unavailability


def _published(*ids: str, acked: bool = True) -> list[dict]:
    events = []
    for message in ids:
        events.append({"t": 1.0, "type": "publish", "id": message, "node": "a"})
        if acked:
            events.append({"t": 1.1, "type": "ack", "id": message, "node": "a"})
    return events


def _delivered(message: str, redelivered: bool = False, t: float = 2.0) -> dict:
    return {"t": t, "type": "deliver", "id": message, "node": "b", "redelivered": redelivered, "consumer": 0}


def test_a_history_that_keeps_every_property_passes():
    events = _published("m1", "m2") + _published("m3", acked=False)
    events += [_delivered("m1"), _delivered("m2"), _delivered("m2", redelivered=True)]
    verdict = check(events)
    assert verdict.ok, verdict.summary()
    assert (verdict.confirmed, verdict.consumed, verdict.duplicates) == (2, 2, 1)


def test_a_confirmed_message_never_consumed_is_lost():
    verdict = check(_published("m1", "m2") + [_delivered("m1")])
    assert verdict.lost == ["m2"] and not verdict.ok


def test_an_unconfirmed_message_may_be_consumed_or_not():
    assert check(_published("m1", acked=False)).ok
    assert check(_published("m1", acked=False) + [_delivered("m1")]).ok


def test_a_message_consumed_that_nobody_published_is_caught():
    verdict = check(_published("m1") + [_delivered("m1"), _delivered("ghost")])
    assert verdict.unexpected == ["ghost"] and not verdict.ok


def test_a_duplicate_without_the_redelivered_flag_is_caught():
    verdict = check(_published("m1") + [_delivered("m1"), _delivered("m1", redelivered=False)])
    assert verdict.duplicates_unflagged == ["m1"] and not verdict.ok


def _observed(t: float, node: str, term: int, commit: int, role: str = "leader") -> dict:
    return {"t": t, "type": "observe", "observer": node, "role": role, "term": term, "commit_index": commit,
            "leader": node}


def test_two_nodes_confirming_as_leaders_of_one_term_are_caught():
    events = [_observed(1, "a", 3, 10), _observed(2, "a", 3, 20), _observed(1.5, "b", 3, 11), _observed(2.5, "b", 3, 19)]
    verdict = check(events)
    assert verdict.terms_with_two_leaders == {3: ["a", "b"]} and not verdict.ok
    # One leader per term, or a second claim that confirmed nothing (its commit index still): fine.
    assert check([_observed(1, "a", 3, 10), _observed(2, "a", 3, 20), _observed(3, "b", 4, 21)]).ok
    assert check([_observed(1, "a", 3, 10), _observed(2, "a", 3, 20), _observed(1.5, "b", 3, 11)]).ok


def test_unavailability_is_the_longest_time_without_a_confirm_from_the_fault_on():
    acks = [0.5, 1.0, 1.1, 4.6, 4.7, 9.0]
    assert unavailability(acks, 1.05, 6.0) == pytest.approx(3.5)
    assert unavailability([0.5, 12.0], 1.0, 6.0) == pytest.approx(11.0)  # nothing until after the window
    assert unavailability([0.5], 1.0, 6.0) == pytest.approx(5.0)  # nothing at all: the whole window


def test_the_fault_table_counts_per_kind_and_stops_each_window_at_the_next_fault():
    events = _published("m1", "m2")
    events += [{"t": 10.0 + k / 10, "type": "ack", "id": f"x{k}", "node": "a"} for k in range(10)]
    events += [{"t": 20.0, "type": "ack", "id": "late", "node": "a"}]
    events += [{"t": 5.0, "type": "fault", "kind": "pause-leader", "target": "a", "start": 5.0, "end": 8.0},
               {"t": 15.0, "type": "fault", "kind": "pause-leader", "target": "b", "start": 12.0, "end": 15.0}]
    events += [_delivered("m1"), _delivered("m2")]
    (row,) = fault_table(events)
    assert (row.kind, row.faults, row.lost) == ("pause-leader", 2, 0)
    assert row.unavailable == pytest.approx([5.0, 8.0])  # to the first ack at 10.0; from 12.0 to 20.0
    assert row.confirms == 10 + 1
