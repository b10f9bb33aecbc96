"""The [cluster] settings: flag > environment > TOML, validated; absent means a single node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from amqp_server.config.settings import ConfigError, load_config


def test_cluster_from_file_environment_and_flags(tmp_path: Path) -> None:
    config_file = tmp_path / "c.toml"
    config_file.write_text('[cluster]\nurl = "zookeeper://zk:2181/file"\nnode_name = "from-file"\nsession_ttl = 3\n')
    from_file = load_config(["--config", str(config_file)], {})
    assert (from_file.cluster.url, from_file.cluster.node_name, from_file.cluster.session_ttl) == (
        "zookeeper://zk:2181/file", "from-file", 3.0)
    env = {"AMQP_SERVER_CLUSTER": "etcd://e1:2379/env", "AMQP_SERVER_NODE_NAME": "from-env"}
    from_env = load_config(["--config", str(config_file)], env)
    assert (from_env.cluster.url, from_env.cluster.node_name) == ("etcd://e1:2379/env", "from-env")
    from_flags = load_config(["--config", str(config_file), "--cluster", "etcd://a,b/flag", "--node-name", "n"], env)
    assert (from_flags.cluster.url, from_flags.cluster.node_name) == ("etcd://a,b/flag", "n")


def test_without_a_cluster_the_node_runs_alone() -> None:
    assert load_config([], {}).cluster.url is None


@pytest.mark.parametrize("argv, document, complaint", [
    (["--cluster", "consul://x/p"], "", "--cluster cluster address 'consul://x/p': unknown backend 'consul'"),
    ([], '[cluster]\nsession_ttl = 0\n', "[cluster] session_ttl must be a number of seconds between 1 and 60"),
    ([], '[cluster]\nurls = "etcd://x"\n', "[cluster] has unknown key 'urls'"),
])
def test_bad_cluster_settings_are_named(tmp_path: Path, argv, document, complaint) -> None:
    config_file = tmp_path / "c.toml"
    config_file.write_text(document)
    with pytest.raises(ConfigError) as error:
        load_config(["--config", str(config_file), *argv], {})
    assert complaint in str(error.value)


def test_a_single_node_imports_no_cluster_code_or_client() -> None:
    probe = ("import sys; from amqp_server.config.settings import load_config; import amqp_server.runtime.server, amqp_server.runtime.cli; "
             "load_config([], {}); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cluster', 'kazoo')))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"
