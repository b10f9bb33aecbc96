"""`--workers N`: its settings, and what each worker is given (name, data directory, HTTP ports).
The processes themselves are tested in interop_tests/test_cluster_workers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_server.config.settings import ConfigError, load_config
from amqp_server.runtime.workers import plan_workers, worker_node_name

CLUSTER = ["--cluster", "etcd://127.0.0.1:2379/w"]


def test_workers_from_file_environment_and_flag(tmp_path: Path) -> None:
    config_file = tmp_path / "c.toml"
    config_file.write_text('[server]\nworkers = 2\n[cluster]\nurl = "etcd://e:2379/p"\n')
    assert load_config([], {}).workers == 1
    assert load_config(["--config", str(config_file)], {}).workers == 2
    assert load_config(["--config", str(config_file)], {"AMQP_SERVER_WORKERS": "3"}).workers == 3
    assert load_config(["--config", str(config_file), "--workers", "4"], {"AMQP_SERVER_WORKERS": "3"}).workers == 4


@pytest.mark.parametrize("argv, complaint", [
    (["--workers", "2"], "workers = 2 needs a cluster: give --cluster"),
    (["--workers", "0", *CLUSTER], "--workers must be between 1 and 64, got 0"),
    (["--workers", "two", *CLUSTER], "--workers must be an integer, got 'two'"),
])
def test_bad_workers_settings_are_named(argv, complaint) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(argv, {})
    assert complaint in str(error.value)


def test_one_worker_needs_no_cluster() -> None:
    assert load_config(["--workers", "1"], {}).cluster.url is None


def test_each_worker_is_a_node_of_its_own(tmp_path: Path) -> None:
    config = load_config(["--workers", "3", *CLUSTER, "--node-name", "rabbit@mq1", "--data-dir", str(tmp_path),
                          "--management-port", "15672", "--metrics-port", "15692"], {})
    plans = plan_workers(config)
    assert [p.node_name for p in plans] == ["rabbit-1@mq1", "rabbit-2@mq1", "rabbit-3@mq1"]
    assert [p.data_dir for p in plans] == [tmp_path / "worker-1", tmp_path / "worker-2", tmp_path / "worker-3"]
    assert [p.management_port for p in plans] == [15672, 15673, 15674]
    assert [p.metrics_port for p in plans] == [15692, 15693, 15694]
    # HTTPS listeners stay with worker 1 (their default ports sit next to the plain ones).
    assert [p.https_management_port for p in plans] == [15671, 0, 0]
    worker_2 = plans[1].apply(config)
    assert (worker_2.cluster.node_name, worker_2.data_dir, worker_2.management_port, worker_2.tls.metrics_port) == (
        "rabbit-2@mq1", tmp_path / "worker-2", 15673, 0)
    assert config.cluster.node_name == "rabbit@mq1"  # the parent's configuration is left as it was


def test_disabled_http_ports_stay_disabled_and_names_without_a_host_get_a_suffix() -> None:
    config = load_config(["--workers", "2", *CLUSTER, "--node-name", "edge", "--management-port", "0",
                          "--metrics-port", "0"], {})
    assert [(p.node_name, p.management_port, p.metrics_port) for p in plan_workers(config)] == [
        ("edge-1", 0, 0), ("edge-2", 0, 0)]
    assert worker_node_name(None, 2).startswith("amqp-server-2@")


def test_ports_the_workers_would_share_are_refused() -> None:
    config = load_config(["--workers", "2", *CLUSTER, "--management-port", "15692", "--metrics-port", "15693"], {})
    with pytest.raises(ConfigError) as error:
        plan_workers(config)
    assert "port 15693 would be both worker 1's metrics port and worker 2's management port" in str(error.value)
