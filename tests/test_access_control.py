"""Logins and permission checks behave as RabbitMQ's internal auth backend does."""

from __future__ import annotations

import amqp.sasl
import pytest

from amqp_server.broker.access_control import AccessControl, AuthenticationFailed, UnsupportedMechanism, User, is_loopback_address
from amqp_server.config.auth import hash_password
from amqp_server.config.settings import ConfigError, PermissionConfig, ServerConfig, UserConfig, load_config


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


@pytest.fixture
def access() -> AccessControl:
    access = AccessControl(loopback_users=["guest"])
    access.add_user("guest", hash_password("guest"), ["administrator"])
    access.add_user("alice", hash_password("wonderland"))
    access.set_permissions("guest", "/", ".*", ".*", ".*")
    access.set_permissions("alice", "/", "^alice-", "^amq\\.topic$|^alice-", "")
    return access


# ---- authenticate ----

def test_valid_plain_login_returns_the_user(access: AccessControl) -> None:
    user = access.authenticate("PLAIN", plain("alice", "wonderland"), peer_is_loopback=False)
    assert user.name == "alice"


def test_valid_amqplain_login_from_kombu(access: AccessControl) -> None:
    response = amqp.sasl.AMQPLAIN("alice", "wonderland").start(None)
    assert access.authenticate("AMQPLAIN", response, peer_is_loopback=False).name == "alice"


def test_wrong_password_is_refused_with_rabbitmq_reply_text(access: AccessControl) -> None:
    with pytest.raises(AuthenticationFailed) as info:
        access.authenticate("PLAIN", plain("alice", "nope"), peer_is_loopback=True)
    assert "invalid credentials" in info.value.reason
    assert info.value.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )


def test_unknown_user_is_refused_like_a_wrong_password(access: AccessControl) -> None:
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        access.authenticate("PLAIN", plain("mallory", "x"), peer_is_loopback=True)


def test_guest_only_from_loopback(access: AccessControl) -> None:
    assert access.authenticate("PLAIN", plain("guest", "guest"), peer_is_loopback=True).name == "guest"
    with pytest.raises(AuthenticationFailed, match="can only connect via localhost"):
        access.authenticate("PLAIN", plain("guest", "guest"), peer_is_loopback=False)


def test_loopback_addresses_include_the_ipv4_mapped_ones_of_a_dual_stack_socket() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1", "localhost"):
        assert is_loopback_address(host), host
    for host in ("10.0.0.1", "::ffff:10.0.0.1", "192.0.2.2", "fd00::2", "", None, "example.com"):
        assert not is_loopback_address(host), host


def test_empty_loopback_users_lets_guest_in_remotely() -> None:
    access = AccessControl(loopback_users=[])
    access.add_user("guest", hash_password("guest"))
    assert access.authenticate("PLAIN", plain("guest", "guest"), peer_is_loopback=False).name == "guest"


def test_malformed_response_is_an_authentication_failure(access: AccessControl) -> None:
    with pytest.raises(AuthenticationFailed):
        access.authenticate("PLAIN", b"no nul bytes", peer_is_loopback=True)


def test_unsupported_mechanism(access: AccessControl) -> None:
    with pytest.raises(UnsupportedMechanism) as info:
        access.authenticate("EXTERNAL", b"", peer_is_loopback=True)
    assert info.value.reply_text.startswith("COMMAND_INVALID")


def test_user_without_password_hash_cannot_log_in(access: AccessControl) -> None:
    access.add_user("cert-only", "")
    with pytest.raises(AuthenticationFailed):
        access.authenticate("PLAIN", plain("cert-only", ""), peer_is_loopback=True)


def test_change_password_takes_effect(access: AccessControl) -> None:
    access.change_password("alice", "new-secret")
    with pytest.raises(AuthenticationFailed):
        access.authenticate("PLAIN", plain("alice", "wonderland"), peer_is_loopback=True)
    assert access.authenticate("PLAIN", plain("alice", "new-secret"), peer_is_loopback=True).name == "alice"


# ---- users ----

def test_add_existing_user_fails(access: AccessControl) -> None:
    with pytest.raises(ValueError):
        access.add_user("alice", hash_password("x"))


def test_delete_user_removes_login_and_permissions(access: AccessControl) -> None:
    alice = access.user("alice")
    assert alice is not None
    access.delete_user("alice")
    assert access.user("alice") is None
    assert not access.can_access_vhost(alice, "/")
    assert [p.user for p in access.permissions()] == ["guest"]
    with pytest.raises(KeyError):
        access.delete_user("alice")


def test_users_lists_everyone(access: AccessControl) -> None:
    assert sorted(u.name for u in access.users()) == ["alice", "guest"]
    assert access.user("guest").tags == ["administrator"]  # type: ignore[union-attr]


# ---- permissions ----

def test_vhost_access_needs_a_permission_entry(access: AccessControl) -> None:
    alice = access.user("alice")
    assert alice is not None
    assert access.can_access_vhost(alice, "/")
    assert not access.can_access_vhost(alice, "other")


def test_entry_with_only_empty_patterns_still_grants_vhost_access(access: AccessControl) -> None:
    access.set_permissions("alice", "empty", "", "", "")
    alice = access.user("alice")
    assert alice is not None
    assert access.can_access_vhost(alice, "empty")
    assert not access.is_permitted(alice, "empty", "read", "anything")


def test_patterns_are_unanchored_searches(access: AccessControl) -> None:
    access.set_permissions("alice", "v", "queue", "queue", "queue")
    alice = access.user("alice")
    assert alice is not None
    assert access.is_permitted(alice, "v", "configure", "my-queue-1")
    assert not access.is_permitted(alice, "v", "configure", "my-exchange")


def test_each_kind_has_its_own_pattern(access: AccessControl) -> None:
    alice = access.user("alice")
    assert alice is not None
    assert access.is_permitted(alice, "/", "configure", "alice-q")
    assert not access.is_permitted(alice, "/", "configure", "bob-q")
    assert access.is_permitted(alice, "/", "write", "amq.topic")
    assert not access.is_permitted(alice, "/", "configure", "amq.topic")
    # read pattern "" permits nothing, not even the empty string match
    assert not access.is_permitted(alice, "/", "read", "alice-q")


def test_default_exchange_is_checked_as_amq_default(access: AccessControl) -> None:
    access.set_permissions("alice", "v", "", "^amq\\.default$", "")
    alice = access.user("alice")
    assert alice is not None
    assert access.is_permitted(alice, "v", "write", "")


def test_no_entry_permits_nothing(access: AccessControl) -> None:
    alice = access.user("alice")
    assert alice is not None
    assert not access.is_permitted(alice, "other", "read", "alice-q")


def test_clear_permissions(access: AccessControl) -> None:
    access.clear_permissions("alice", "/")
    alice = access.user("alice")
    assert alice is not None
    assert not access.can_access_vhost(alice, "/")


def test_set_permissions_validates(access: AccessControl) -> None:
    with pytest.raises(KeyError):
        access.set_permissions("nobody", "/", ".*", ".*", ".*")
    with pytest.raises(ValueError, match="invalid permission pattern"):
        access.set_permissions("alice", "/", "(", ".*", ".*")


def test_permissions_reports_what_was_set(access: AccessControl) -> None:
    assert PermissionConfig("alice", "/", "^alice-", "^amq\\.topic$|^alice-", "") in access.permissions()


def test_unknown_user_object_is_not_permitted(access: AccessControl) -> None:
    ghost = User("ghost", "")
    assert not access.can_access_vhost(ghost, "/")
    assert not access.is_permitted(ghost, "/", "read", "q")


# ---- from_config ----

def test_default_config_gives_guest_full_access_from_loopback(tmp_path) -> None:
    access = AccessControl.from_config(load_config(["--data-dir", str(tmp_path)], environ={}))
    guest = access.authenticate("PLAIN", plain("guest", "guest"), peer_is_loopback=True)
    assert "administrator" in guest.tags
    assert access.is_permitted(guest, "/", "configure", "anything")
    with pytest.raises(AuthenticationFailed):
        access.authenticate("PLAIN", plain("guest", "guest"), peer_is_loopback=False)


def test_from_config_with_custom_users() -> None:
    config = ServerConfig(
        loopback_users=[],
        users=[UserConfig("svc", hash_password("pw"), ["monitoring"])],
        vhosts=["/", "prod"],
        permissions=[PermissionConfig("svc", "prod", "", "^out$", "^in$")],
    )
    access = AccessControl.from_config(config)
    svc = access.authenticate("PLAIN", plain("svc", "pw"), peer_is_loopback=False)
    assert access.can_access_vhost(svc, "prod") and not access.can_access_vhost(svc, "/")
    assert access.is_permitted(svc, "prod", "read", "in")
    assert access.user("guest") is None


def test_from_config_rejects_permission_for_missing_user() -> None:
    config = ServerConfig(users=[UserConfig("svc", hash_password("pw"))])  # default perms still name guest
    with pytest.raises(ConfigError, match="guest"):
        AccessControl.from_config(config)
