"""The streams benchmark's own logic (bench/streams.py): finding a broker's stream directory,
measuring it, sampling peaks, the per-target filled stream, and the broker_microbench scenario."""

from __future__ import annotations

import pytest

from bench import streams
from bench.broker_microbench import stream_read_10
from bench.orchestrator import Outcome
from bench.scenarios import Options, variants
from bench.targets import Target, parse_targets
from bench.workers import Timing
from persistence.stream_segment import stream_path


def test_our_stream_directory_is_found_by_its_hashed_path(tmp_path):
    ours = stream_path(tmp_path, "/", "bench-stream-1")
    ours.mkdir(parents=True)
    stream_path(tmp_path, "/", "bench-stream-2").mkdir(parents=True)
    assert streams.stream_directory(tmp_path / "streams", "/", "bench-stream-1") == ours


def test_a_rabbitmq_stream_directory_is_the_entry_named_after_the_queue(tmp_path):
    # RabbitMQ 3.10: <mnesia dir>/stream/<vhost>_<queue>_<timestamp>, "/" written as "_"
    (tmp_path / "__bench-stream-other_1669912345678901234").mkdir()
    found = tmp_path / "__bench-stream-abc_1669912345678901235"
    found.mkdir()
    assert streams.stream_directory(tmp_path, "/", "bench-stream-abc") == found
    assert streams.stream_directory(tmp_path, "/", "bench-stream-missing") is None
    assert streams.stream_directory(tmp_path / "absent", "/", "bench-stream-abc") is None


def test_disk_bytes_counts_what_the_files_below_take_on_disk(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "00000000.seg").write_bytes(b"x" * 100_000)
    (tmp_path / "00000001.seg").write_bytes(b"x" * 10_000)
    assert 110_000 <= streams.disk_bytes(tmp_path) < 110_000 + 64 * 1024


def test_the_sampler_keeps_first_peak_and_last_and_skips_failed_reads():
    values = iter([5.0, None, OSError("gone"), 9.0, 7.0])

    def read():
        value = next(values)
        if isinstance(value, Exception):
            raise value
        return value

    sampler = streams.PeakSampler(read)
    for _ in range(5):
        sampler.sample()
    assert (sampler.first, sampler.peak, sampler.last) == (5.0, 9.0, 7.0)


def test_the_sampler_samples_on_entry_and_exit():
    calls = []
    with streams.PeakSampler(lambda: calls.append(1) or float(len(calls)), interval_s=60) as sampler:
        pass
    assert (sampler.first, sampler.last) == (1.0, 2.0)


def test_stream_dirs_are_given_per_target():
    targets = parse_targets(["ours=amqp://127.0.0.1:1/", "rabbitmq=amqp://127.0.0.1:2/"], [], [],
                            stream_dir_args=["ours=/data/streams"])
    assert [t.stream_dir for t in targets] == ["/data/streams", None]
    with pytest.raises(ValueError):
        parse_targets(["ours=amqp://127.0.0.1:1/"], [], [], stream_dir_args=["nobody=/x"])


def test_the_streams_variants_fill_first_then_time_then_read_then_retain():
    names = [v.name for v in variants("streams", Options(stream_messages=2000, stream_windows=(64, 1, 16)))]
    assert names[0] == "publish 2,000 with confirms, 64 in flight"
    assert names[1:3] == ["publish with confirms, 1 in flight", "publish with confirms, 16 in flight"]
    assert names[3].startswith("1 consumer from first, 2,000 messages")
    assert names[4].startswith("10 consumers from first, 2,000 messages each")
    assert names[5].startswith("retention: max-length-bytes 100 MB, segments 10 MB, 300 MB published")


def test_each_target_keeps_one_filled_stream(monkeypatch):
    deleted = []
    monkeypatch.setattr(streams, "_delete", lambda target, stream: deleted.append((target.label, stream)))
    fixtures = streams.StreamFixtures()
    ours, theirs = Target("ours", "amqp://127.0.0.1:1/", None), Target("rabbitmq", "amqp://127.0.0.1:2/", None)
    fixtures.keep(ours, "s1", 2000)
    fixtures.keep(theirs, "r1", 2000)
    fixtures.keep(ours, "s2", 2000)  # a second round's publish: the first round's stream goes
    assert deleted == [("ours", "s1")]
    assert fixtures.get(ours, Options(stream_messages=2000)) == "s2"  # no filling: nothing to reach
    fixtures.drop(ours)
    fixtures.drop(ours)
    assert deleted == [("ours", "s1"), ("ours", "s2")]


def test_cpu_per_message_is_the_runs_broker_cpu_over_its_messages():
    outcome = Outcome(Timing(0.0, None, 1000), [], [], 0.5, broker_cpu_s=2.0)
    assert streams.cpu_per_message_us(outcome, 1_000_000) == pytest.approx(2.0)
    assert streams.cpu_per_message_us(Outcome(Timing(0.0, None, 1), [], [], None), 10) is None


def test_the_stream_read_microbenchmark_reads_what_it_filled():
    assert stream_read_10(50) > 0  # ten readers of a STREAM_FILL-record stream, 50 each
