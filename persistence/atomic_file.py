"""Crash-safe whole-file replacement."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that after a crash the file holds
    either the old or the new content, never a mix.

    The data goes to a temporary file in the same directory (so the rename
    stays on one file system), is flushed and fsynced, renamed over ``path``,
    and then the directory is fsynced so the rename itself is durable.
    The parent directory must exist. New files are created with mode 0600.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    fsync_directory(path.parent)


def fsync_if_present(path: "str | os.PathLike[str]") -> None:
    """fsync the file or directory at ``path``; one removed meanwhile needs nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(directory: Path) -> None:
    """Make the names in ``directory`` (files created, renamed or removed) durable."""
    if os.name != "posix":  # Windows cannot open a directory to fsync it.
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
