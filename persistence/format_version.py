"""The on-disk format version of queue directories, and the error for versions we cannot read.

Every segment file header and every meta file carries a format version.
A reader accepts exactly the versions in ``SUPPORTED_FORMAT_VERSIONS`` and
raises ``UnsupportedFormatVersion`` for any other, before interpreting
anything else in the file, so that a file written by a newer broker is
never half-understood. The contract is docs/queue-files.md.

The stored definitions carry a version of their own ("amqp_server_format" in
definitions.json and the header of each definitions log: 2, format 1 still read;
persistence/definitions_codec.py and definitions_log.py, docs/durability.md).
"""

from __future__ import annotations

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = frozenset({1})


class UnsupportedFormatVersion(Exception):
    """A queue file was written in a format version this code does not read."""

    def __init__(self, path: str, version: object) -> None:
        self.path = path
        self.version = version
        supported = ", ".join(str(v) for v in sorted(SUPPORTED_FORMAT_VERSIONS))
        super().__init__(
            f"{path}: queue file format version {version!r} is not supported "
            f"(this amqp-server reads version {supported}); it was probably written by a newer amqp-server"
        )


def check_format_version(path: str, version: object) -> None:
    """Raise ``UnsupportedFormatVersion`` unless ``version`` is one we read."""
    if version not in SUPPORTED_FORMAT_VERSIONS or isinstance(version, bool):
        raise UnsupportedFormatVersion(path, version)
