"""SASL parsing against what real clients send, and RabbitMQ-compatible password hashes."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import subprocess
import sys

import amqp.sasl
import pika.credentials
import pika.spec
import pytest
from pamqp import encode, frame

from amqp_server.config import auth
from amqp_server.config.auth import SaslError, hash_password, parse_sasl_response, verify_password

# Made by RabbitMQ 3.10.8: `rabbitmqctl add_user hashcheck s3cret`, then
# `rabbitmqctl export_definitions /tmp/defs.json`, users[].password_hash.
RABBITMQ_HASH_OF_S3CRET = "Sq1v7NDvP6o5CX8uSgsKc8mSZ92Tma5g4XCDohtxFsXTf5Xz"


def through_pamqp(mechanism: str, response: bytes) -> str | bytes:
    """What the broker's codec hands over: the response of a start-ok frame
    carrying ``response`` on the wire, as decoded by pamqp."""
    payload = (
        struct.pack(">HH", 10, 11)
        + encode.field_table({})
        + encode.short_string(mechanism)
        + struct.pack(">I", len(response))
        + response
        + encode.short_string("en_US")
    )
    wire = struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"
    return frame.unmarshal(wire)[2].response


# ---- password hashes ----

def test_hash_exported_by_rabbitmq_verifies() -> None:
    assert verify_password(RABBITMQ_HASH_OF_S3CRET, "s3cret")
    assert not verify_password(RABBITMQ_HASH_OF_S3CRET, "s3cret ")
    assert not verify_password(RABBITMQ_HASH_OF_S3CRET, "S3cret")


def test_hash_has_rabbitmq_layout() -> None:
    salt = b"\x01\x02\x03\x04"
    raw = base64.b64decode(hash_password("s3cret", salt))
    assert len(raw) == 36 and raw[:4] == salt


def test_same_salt_same_hash_and_rabbitmq_salt_reproduces_its_hash() -> None:
    salt = base64.b64decode(RABBITMQ_HASH_OF_S3CRET)[:4]
    assert hash_password("s3cret", salt) == RABBITMQ_HASH_OF_S3CRET


def test_fresh_salt_each_time_and_both_verify() -> None:
    first, second = hash_password("pw"), hash_password("pw")
    assert first != second
    assert verify_password(first, "pw") and verify_password(second, "pw")


def test_non_ascii_password_round_trips() -> None:
    hashed = hash_password("pässwörd✓")
    assert verify_password(hashed, "pässwörd✓")
    assert not verify_password(hashed, "passwoerd")


@pytest.mark.parametrize("bad_hash", ["", "not base64!", base64.b64encode(b"short").decode(), "AAAA"])
def test_malformed_or_empty_hash_matches_nothing(bad_hash: str) -> None:
    assert not verify_password(bad_hash, "")
    assert not verify_password(bad_hash, "guest")


def test_salt_must_be_four_bytes() -> None:
    with pytest.raises(ValueError):
        hash_password("x", b"123")


# ---- PLAIN, as each client sends it ----

def test_plain_from_pika() -> None:
    mechanism, response = pika.credentials.PlainCredentials("alice", "wonder land").response_for(
        pika.spec.Connection.Start(mechanisms="PLAIN AMQPLAIN")
    )
    assert parse_sasl_response(mechanism, through_pamqp(mechanism, response)) == ("alice", "wonder land")


def test_plain_from_py_amqp() -> None:
    response = amqp.sasl.PLAIN("bob", "p@ss").start(None)
    assert parse_sasl_response("PLAIN", through_pamqp("PLAIN", response)) == ("bob", "p@ss")


def test_plain_from_aiormq_is_a_str() -> None:
    # aiormq builds the response as a str: "\x00user\x00password".
    from aiormq.auth import PlainAuth

    class Url:
        user, password = "carol", "sécret"

    class Connector:
        url = Url()

    response = PlainAuth(Connector()).marshal()
    assert isinstance(response, str)
    assert parse_sasl_response("PLAIN", response) == ("carol", "sécret")
    assert parse_sasl_response("PLAIN", through_pamqp("PLAIN", response.encode())) == ("carol", "sécret")


def test_plain_with_authzid_logs_in_as_authcid() -> None:
    assert parse_sasl_response("PLAIN", b"admin\x00dave\x00pw") == ("dave", "pw")


def test_plain_password_that_is_not_utf8_still_verifies() -> None:
    password = b"caf\xe9"  # latin-1, invalid UTF-8: pamqp hands over bytes
    response = through_pamqp("PLAIN", b"\x00erin\x00" + password)
    assert isinstance(response, bytes)
    user, parsed = parse_sasl_response("PLAIN", response)
    assert user == "erin"
    salt = b"abcd"
    rabbit_style = base64.b64encode(salt + hashlib.sha256(salt + password).digest()).decode()
    assert verify_password(rabbit_style, parsed)


@pytest.mark.parametrize("response", [b"", b"user", b"\x00user", b"\x00\x00pw", b"\x00u\x00p\x00extra"])
def test_malformed_plain_is_rejected(response: bytes) -> None:
    with pytest.raises(SaslError):
        parse_sasl_response("PLAIN", response)


# ---- AMQPLAIN ----

def test_amqplain_from_py_amqp_as_kombu_sends_it() -> None:
    response = amqp.sasl.AMQPLAIN("frank", "pässword").start(None)
    assert parse_sasl_response("AMQPLAIN", through_pamqp("AMQPLAIN", response)) == ("frank", "pässword")
    assert parse_sasl_response("AMQPLAIN", response) == ("frank", "pässword")


def test_amqplain_with_length_prefix_is_accepted() -> None:
    table = encode.field_table({"LOGIN": "gina", "PASSWORD": "pw"})
    assert parse_sasl_response("AMQPLAIN", table) == ("gina", "pw")


def test_amqplain_missing_password_is_rejected() -> None:
    response = encode.field_table({"LOGIN": "gina"})[4:]
    with pytest.raises(SaslError, match="LOGIN or PASSWORD"):
        parse_sasl_response("AMQPLAIN", response)


def test_amqplain_non_string_password_is_rejected() -> None:
    response = encode.field_table({"LOGIN": "gina", "PASSWORD": 1234})[4:]
    with pytest.raises(SaslError):
        parse_sasl_response("AMQPLAIN", response)


@pytest.mark.parametrize("response", [b"\x05LOG", b"\x05LOGINZ\x00", b"\xff" * 10])
def test_garbage_amqplain_is_rejected(response: bytes) -> None:
    with pytest.raises(SaslError):
        parse_sasl_response("AMQPLAIN", response)


def test_unknown_mechanism_is_rejected() -> None:
    with pytest.raises(SaslError, match="EXTERNAL"):
        parse_sasl_response("EXTERNAL", b"")


# ---- the hash-password command ----

def test_hash_password_command_reads_argv(capsys: pytest.CaptureFixture[str]) -> None:
    assert auth.main(["hash-password", "s3cret"]) == 0
    assert verify_password(capsys.readouterr().out.strip(), "s3cret")


def test_hash_password_command_reads_stdin_keeping_spaces(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(" two words \n"))
    assert auth.main(["hash-password"]) == 0
    assert verify_password(capsys.readouterr().out.strip(), " two words ")


def test_hash_password_command_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert auth.main([]) == 2
    assert "usage" in capsys.readouterr().err


def test_python_dash_m_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "amqp_server.config.auth", "hash-password"],
        input="guest\n", capture_output=True, text=True, check=True, timeout=30,
    )
    assert verify_password(result.stdout.strip(), "guest")
