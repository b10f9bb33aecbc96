"""Crash-safe file writes: whole-file replacement, fsyncs of files and directories, and
directories made durably."""

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


def write_replacing(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` by rename (never a half-written file under its name), without
    fsync: the caller has the file and its directory fsynced later (a group commit round)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (more than one os.write only if the OS writes part of it)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])


def make_directories(path: Path, *, durably: bool) -> list[Path]:
    """mkdir -p; ``durably``, fsync the parent of every directory created so the new entries
    survive a crash, else return those parents for the caller to fsync."""
    to_sync: list[Path] = []
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        if durably:
            fsync_directory(directory.parent)
        else:
            to_sync.append(directory.parent)
    return to_sync


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
