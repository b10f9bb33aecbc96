"""The fault runs' checker (interop_tests/faults/history.py) on histories made by hand: each
property it judges, caught when broken and passed when kept."""

from __future__ import annotations

import pytest

from interop_tests.faults.history import check, check_stream, fault_table, unavailability


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


# -- a stream's run (check_stream) --------------------------------------------------------------


def _read(message: str, offset: int, consumer: int = 0, t: float = 2.0) -> dict:
    return {"t": t, "type": "deliver", "id": message, "node": "b", "offset": offset, "consumer": consumer}


def _final(node: str, *messages: str, t: float = 30.0) -> list[dict]:
    return [{"t": t, "type": "final", "node": node, "offset": offset, "id": message}
            for offset, message in enumerate(messages)]


def _replicas(*digests: str) -> list[dict]:
    return [{"t": 31.0, "type": "replica-files", "node": node, "digest": digest}
            for node, digest in zip("abc", digests)]


def _stream_run(*extra: dict) -> list[dict]:
    """m1, m2 confirmed, m3 not; a consumer read m1, m2; every node's final read holds m1, m2, m3."""
    events = _published("m1", "m2") + _published("m3", acked=False)
    events += [_read("m1", 0), _read("m2", 1)]
    for node in "abc":
        events += _final(node, "m1", "m2", "m3")
    return events + _replicas("d", "d", "d") + list(extra)


def test_a_stream_history_that_keeps_every_property_passes():
    verdict = check_stream(_stream_run())
    assert verdict.ok, verdict.summary()
    assert (verdict.confirmed, verdict.length, verdict.read) == (2, 3, 3)


def test_a_confirmed_record_missing_from_one_nodes_final_read_is_lost():
    events = _published("m1", "m2") + _final("a", "m1", "m2") + _final("b", "m1", "m2") + _final("c", "m1")
    verdict = check_stream(events)
    assert verdict.lost == ["m2"] and not verdict.ok


def test_a_record_read_at_two_offsets_is_caught():
    verdict = check_stream(_stream_run(_read("m1", 2, consumer=1)))
    assert verdict.moved == {"m1": [0, 2]} and not verdict.ok


def test_an_offset_read_as_two_different_records_is_caught():
    # Consumer 1 read m3 at offset 1, where the stream holds m2 (what a leader that confirmed
    # without a majority gives out before the new leader reuses its offsets).
    verdict = check_stream(_stream_run(_read("m3", 0, consumer=1), _read("m3", 1, consumer=1)))
    assert verdict.conflicts[1] == ["m2", "m3"] and not verdict.ok


def test_a_record_read_that_nobody_published_is_caught():
    events = _stream_run()
    events += [_read("ghost", 2)]
    verdict = check_stream(events)
    assert verdict.unexpected == ["ghost"] and not verdict.ok


def test_a_reader_that_skips_an_offset_or_sees_one_twice_is_caught():
    skipped = check_stream(_stream_run(_read("m1", 0, consumer=1), _read("m3", 2, consumer=1)))
    assert skipped.gaps == ["consumer 1: offset 2 after 0 (a hole)"] and not skipped.ok
    again = check_stream(_stream_run(_read("m1", 0, consumer=1), _read("m2", 1, consumer=1),
                                     _read("m2", 1, consumer=1)))
    assert again.gaps == ["consumer 1: offset 1 after 1 (again)"] and not again.ok
    # A final read that does not start at offset 0 has a hole too (the stream lost its head).
    headless = _published("m1") + [{"t": 30.0, "type": "final", "node": "a", "offset": 1, "id": "m1"}]
    assert check_stream(headless).gaps == ["final read on a: offset 1 after -1 (a hole)"]


def test_replicas_whose_files_differ_are_caught():
    events = [e for e in _stream_run() if e["type"] != "replica-files"] + _replicas("d", "d", "e")
    verdict = check_stream(events)
    assert verdict.replicas_differ == {"a": "d", "b": "d", "c": "e"} and not verdict.ok


def test_two_confirming_leaders_of_one_term_are_caught_on_a_stream_too():
    events = _stream_run(_observed(1, "a", 3, 10), _observed(2, "a", 3, 20), _observed(1.5, "b", 3, 11),
                         _observed(2.5, "b", 3, 19))
    assert check_stream(events).terms_with_two_leaders == {3: ["a", "b"]}


def test_a_fault_after_which_confirms_come_late_is_caught_unless_it_is_not_a_single_node_fault():
    # (Confirms of m1 and m2 again: what matters here is when confirms came.)
    acks = [{"t": t, "type": "ack", "id": message, "node": "a"}
            for t, message in ((4.0, "m1"), (5.0, "m2"), (14.5, "m1"), (15.0, "m2"))]
    fault = {"t": 8.0, "type": "fault", "kind": "pause-leader", "target": "a", "start": 5.0, "end": 8.0}
    verdict = check_stream(_stream_run(*acks, fault), served_within=7.0)
    assert verdict.slow_faults == ["pause-leader at 5.0 s: 9.5 s"] and not verdict.ok
    assert check_stream(_stream_run(*acks, fault), served_within=10.0).ok
    assert check_stream(_stream_run(*acks, dict(fault, kind="flapping")), served_within=7.0).ok


def test_a_streams_fault_table_counts_its_losses_and_records_at_two_offsets_not_rereads():
    events = _published("m1", "m2", "m3")
    events += [{"t": 0.5, "type": "fault", "kind": "kill-restart", "target": "a", "start": 0.5, "end": 3.0}]
    events += [_read("m1", 0), _read("m2", 1), _read("m1", 0, consumer=1), _read("m2", 1, consumer=1),
               _read("m2", 2, consumer=1)]
    events += _final("a", "m1", "m2") + _final("b", "m1", "m2") + _final("c", "m1", "m2")
    verdict = check_stream(events)
    (row,) = fault_table(events, stream=verdict)
    assert (row.lost, row.duplicates) == (1, 1)  # m3 lost; m2 at offsets 1 and 2
