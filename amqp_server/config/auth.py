"""SASL response parsing and RabbitMQ-compatible password hashing.

Password hashes use RabbitMQ's ``rabbit_password_hashing_sha256`` format:
``base64(salt + sha256(salt + utf8(password)))`` with a 4-byte random salt.
A hash exported from RabbitMQ (``rabbitmqctl export_definitions``) therefore
verifies here, and a hash made here can be imported into RabbitMQ.

Run ``python -m amqp_server.config.auth hash-password [PASSWORD]`` to print a hash
for a configuration file; without PASSWORD it is read from standard input.
"""

from __future__ import annotations

import base64
import binascii
import getpass
import hashlib
import hmac
import os
import struct
import sys
from typing import Sequence

from pamqp import decode as pamqp_decode
from pamqp.common import FieldTable

SUPPORTED_MECHANISMS: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
# Mechanisms whose secret is the user's password (so connection.update-secret can renew it).
PASSWORD_MECHANISMS: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
HASHING_ALGORITHM = "rabbit_password_hashing_sha256"

_SALT_LENGTH = 4
_DIGEST_LENGTH = hashlib.sha256().digest_size


class SaslError(ValueError):
    """A SASL response that cannot be parsed for its mechanism."""


def hash_password(password: str, salt: bytes | None = None) -> str:
    """Hash ``password`` the way RabbitMQ's rabbit_password_hashing_sha256 does."""
    if salt is None:
        salt = os.urandom(_SALT_LENGTH)
    if len(salt) != _SALT_LENGTH:
        raise ValueError(f"salt must be {_SALT_LENGTH} bytes, got {len(salt)}")
    digest = hashlib.sha256(salt + _password_bytes(password)).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def verify_password(password_hash: str, password: str) -> bool:
    """True when ``password`` matches ``password_hash``; compared in constant time.

    An empty or malformed hash matches no password (as in RabbitMQ, a user
    without a password hash cannot log in with a password).
    """
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) != _SALT_LENGTH + _DIGEST_LENGTH:
        return False
    salt, expected = raw[:_SALT_LENGTH], raw[_SALT_LENGTH:]
    actual = hashlib.sha256(salt + _password_bytes(password)).digest()
    return hmac.compare_digest(actual, expected)


def is_valid_password_hash(password_hash: str) -> bool:
    """True when ``password_hash`` has the shape of a sha256 RabbitMQ hash (or is empty)."""
    if password_hash == "":
        return True
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(raw) == _SALT_LENGTH + _DIGEST_LENGTH


def parse_sasl_response(mechanism: str, response: bytes | str) -> tuple[str, str]:
    """Return ``(username, password)`` from a connection.start-ok response.

    PLAIN (RFC 4616) is ``[authzid] NUL user NUL password``; the authzid is
    ignored, as RabbitMQ does. AMQPLAIN is an AMQP field table without its
    4-byte length prefix (what py-amqp/kombu send) holding long-string
    ``LOGIN`` and ``PASSWORD``; a table that does carry the prefix is accepted
    too. Raises SaslError when the response is malformed.

    pamqp hands over a long string as ``str`` when it is valid UTF-8 and as
    ``bytes`` otherwise, so a ``str`` is turned back into the wire bytes with
    UTF-8. Names and passwords that are not UTF-8 are kept byte-exact via
    the surrogateescape error handler, so such a password still verifies.
    """
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
    mechanism = mechanism.upper() if isinstance(mechanism, str) else mechanism
    if mechanism == "PLAIN":
        return _parse_plain(raw)
    if mechanism == "AMQPLAIN":
        return _parse_amqplain(raw)
    raise SaslError(f"unsupported authentication mechanism {mechanism!r}")


def _parse_plain(raw: bytes) -> tuple[str, str]:
    parts = raw.split(b"\x00")
    if len(parts) != 3:
        raise SaslError("PLAIN response must be '[authzid]\\0user\\0password'")
    _authzid, user, password = parts
    if not user:
        raise SaslError("PLAIN response has an empty user name")
    return _text(user), _text(password)


def _parse_amqplain(raw: bytes) -> tuple[str, str]:
    table = _decode_amqplain_table(raw)
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if not isinstance(login, (str, bytes)) or not isinstance(password, (str, bytes)):
        raise SaslError("AMQPLAIN response is missing the LOGIN or PASSWORD field")
    return _as_text(login), _as_text(password)


def _decode_amqplain_table(raw: bytes) -> FieldTable:
    # A table without a length prefix starts with a key-length octet followed
    # by the key, so its first four bytes never equal the remaining length.
    if len(raw) >= 4 and struct.unpack(">I", raw[:4])[0] == len(raw) - 4:
        framed = raw
    else:
        framed = struct.pack(">I", len(raw)) + raw
    try:
        consumed, table = pamqp_decode.field_table(framed)
    except Exception as err:  # any decoding failure of client input is a SASL error, never a crash
        raise SaslError(f"AMQPLAIN response is not a valid field table: {err}") from err
    if consumed != len(framed):
        raise SaslError("AMQPLAIN response has trailing bytes after the field table")
    return table


def secret_text(secret: bytes | str) -> str:
    """A long-string secret (connection.update-secret) as the password text it stands for; bytes
    that are not UTF-8 are kept byte-exact, as for a login (see parse_sasl_response)."""
    return _as_text(secret)


def _password_bytes(password: str) -> bytes:
    return password.encode("utf-8", "surrogateescape")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _as_text(value: str | bytes) -> str:
    return value if isinstance(value, str) else _text(value)


def _read_password(argv: Sequence[str]) -> str:
    if argv:
        return argv[0]
    if sys.stdin.isatty():
        return getpass.getpass("Password: ")
    line = sys.stdin.readline()
    # Only the line ending is dropped: spaces may be part of the password.
    return line.removesuffix("\n").removesuffix("\r")


def main(argv: Sequence[str] | None = None) -> int:
    """``hash-password [PASSWORD]``: print a rabbit_password_hashing_sha256 hash."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "hash-password" or len(args) > 2:
        print("usage: python -m amqp_server.config.auth hash-password [PASSWORD]", file=sys.stderr)
        print("  without PASSWORD the password is read from standard input", file=sys.stderr)
        return 2
    print(hash_password(_read_password(args[1:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
