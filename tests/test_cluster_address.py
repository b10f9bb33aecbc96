"""Cluster addresses as --cluster takes them: etcd:// or zookeeper://, host list, prefix."""

import pytest

from amqp_server.config.cluster_address import Backend, parse_cluster_address


def test_etcd_address_with_several_members_and_a_prefix():
    address = parse_cluster_address("etcd://127.0.0.1:2379,127.0.0.1:22379/prod")
    assert address.backend is Backend.ETCD
    assert address.endpoints == (("127.0.0.1", 2379), ("127.0.0.1", 22379))
    assert address.prefix == "prod"


def test_default_ports_and_prefix():
    assert parse_cluster_address("zookeeper://zk1,zk2").endpoints == (("zk1", 2181), ("zk2", 2181))
    assert parse_cluster_address("etcd://e1").prefix == "amqp-server"


@pytest.mark.parametrize("text, complaint", [
    ("127.0.0.1:2379", "must start with etcd:// or zookeeper://"),
    ("consul://h:1/p", "unknown backend 'consul'"),
    ("etcd://h:99999/p", "port 99999 out of range"),
    ("etcd://h:x/p", "'h:x' is not host[:port]"),
])
def test_bad_addresses_say_what_is_wrong(text, complaint):
    with pytest.raises(ValueError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster_address(text)
