"""A job's own files (results, ``<out>.lock``, ``<out>.quarantine``, the CSV, the records beside ``out``)
opened without following links, and only when they are regular files.

A symbolic link planted in advance at one of these names would make a job overwrite or append to a
file it does not own; a character device or FIFO given as ``--out`` would be read without bound or
block forever; a directory is not a results file. Each is refused with one :class:`UnsafeOutput`
line naming the path and what it is. Files are opened with ``O_NOFOLLOW`` (and ``O_NONBLOCK`` until
``fstat`` has shown a regular file), so a link swapped in after the check is refused as well.

Example::

    check_job_file("results.jsonl", "--out")   # absent or a regular file: nothing; else UnsafeOutput
    fd = open_job_file("results.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, "--out")
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..input_files import file_kind
from ..text import printable
from .errors import JobError


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafeOutput(JobError):
    """A job file that is a link, a device, a FIFO, a socket or a directory."""


def _refusal(path: str | Path, what: str, kind: str) -> UnsafeOutput:
    follow = " (capreward never follows links for the files it writes)" if kind == "a symbolic link" else ""
    return UnsafeOutput(
        f"{what} {printable(os.fspath(path))} is {kind}, not a regular file{follow}; "
        "give a regular file or a new path"
    )


def check_job_file(path: str | Path, what: str) -> None:
    """Nothing when ``path`` is absent or a regular file (not a link); else :class:`UnsafeOutput`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise _refusal(path, what, file_kind(st.st_mode))


def open_job_file(path: str | Path, flags: int, what: str, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW)``, refused (:class:`UnsafeOutput`) unless the file opened is a
    regular file. Returns the descriptor (blocking mode restored)."""
    if not _O_NOFOLLOW:  # Windows: no O_NOFOLLOW, so the link is looked for first
        check_job_file(path, what)
    try:
        fd = os.open(path, flags | _O_NOFOLLOW | _O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refusal(path, what, "a symbolic link") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):  # a directory; a FIFO without a reader
            try:
                kind = file_kind(os.lstat(path).st_mode)
            except OSError:
                kind = "not a regular file"
            raise _refusal(path, what, kind) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refusal(path, what, file_kind(st.st_mode))
    if _O_NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def open_job_stream(path: str | Path, mode: str, what: str, **kwargs):
    """A Python file object of a job file (``mode`` one of ``rb``, ``r+b``, ``ab``, ``wb``, ``w``, ``a``,
    with ``kwargs`` for text mode) opened through :func:`open_job_file`."""
    flags = {"r": os.O_RDONLY, "r+": os.O_RDWR, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
             "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}[mode.replace("b", "")]
    fd = open_job_file(path, flags, what)
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise
