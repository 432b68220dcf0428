"""Opening a file a user names for reading: regular files only.

A manifest, a results file given to ``capreward report``, an idf corpus, a visual whose bytes a job
hashes: each is read whole, so a FIFO given in its place blocks the open forever (or until a writer
comes), a character device such as ``/dev/zero`` or ``/dev/urandom`` is read without end, and a
directory or socket is no file at all. :func:`open_regular` opens the name with ``O_NONBLOCK`` (a FIFO
opens at once instead of waiting for a writer) and ``O_NOCTTY``, checks with ``fstat`` that what it
opened is a regular file, and only then restores blocking reads; anything else is refused with one
:class:`NotARegularFile` line naming the path and what it is. Symbolic links are followed (a
manifest's image may be a link into a dataset folder); the file the link leads to must be regular.

(The files a job writes are opened without following links at all: :mod:`capreward.jobs.safe_files`.
Files a remote client names are opened inside a root: :class:`capreward.media.files.ConfinedFile`.)

Example::

    with open_regular_stream("manifest.jsonl", "the manifest") as f:   # else NotARegularFile
        data = f.read()
"""

from __future__ import annotations

import os
import stat
from typing import IO, Any

from .errors import CaprewardError

_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_CLOEXEC", 0))


class NotARegularFile(CaprewardError, OSError):
    """A named input that is a FIFO, a device, a socket or a directory; the message names it."""


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words: ``"a FIFO"``, ``"a character device"``, ``"a directory"``, ...

    Args:
        mode: an ``os.stat_result.st_mode``.

    Returns:
        ``"a regular file"``, ``"a symbolic link"``, ``"a directory"``, ``"a character device"``,
        ``"a block device"``, ``"a FIFO"``, ``"a socket"`` or ``"not a regular file"``.
    """
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _refusal(path: str | os.PathLike, what: str, kind: str) -> NotARegularFile:
    from .text import printable

    return NotARegularFile(f"{what} {printable(os.fspath(path))} is {kind}, not a regular file; "
                           "give a regular file")


def open_regular(path: str | os.PathLike, what: str = "the file") -> int:
    """A read-only descriptor of ``path`` (links followed) when it is a regular file.

    Args:
        path: the file's name.
        what: how a refusal names it (``"the manifest"``, ``"--idf"``).

    Returns:
        The descriptor (blocking reads restored); the caller closes it.

    Raises:
        NotARegularFile: ``path`` is a FIFO, a device, a socket or a directory (nothing read from it).
        OSError: the file cannot be opened (missing, no permission), as ``os.open`` raises it.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:  # a socket (ENXIO), a directory on some systems: named; else as os.open raised it
        try:
            st = os.stat(path)
        except OSError:
            raise exc from None
        if not stat.S_ISREG(st.st_mode):
            raise _refusal(path, what, file_kind(st.st_mode)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refusal(path, what, file_kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular_stream(path: str | os.PathLike, what: str = "the file", mode: str = "rb", **kwargs: Any) -> IO:
    """A Python file object of :func:`open_regular` (``mode`` ``"rb"`` or ``"r"``, ``kwargs`` for text mode).

    Args:
        path: the file's name.
        what: how a refusal names it.
        mode: ``"rb"`` or ``"r"``.
        **kwargs: passed to :func:`os.fdopen` (``encoding=``, ``errors=``...).

    Returns:
        The open file object.

    Raises:
        NotARegularFile: ``path`` is not a regular file.
        OSError: the file cannot be opened.
    """
    if mode not in ("rb", "r"):
        raise ValueError(f"mode must be 'rb' or 'r', got {mode!r}")
    fd = open_regular(path, what)
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(path: str | os.PathLike, what: str = "the file") -> bytes:
    """The bytes of ``path`` when it is a regular file.

    Args:
        path: the file's name.
        what: how a refusal names it.

    Returns:
        The file's content.

    Raises:
        NotARegularFile: ``path`` is not a regular file.
        OSError: the file cannot be opened or read.
    """
    with open_regular_stream(path, what) as f:
        return f.read()


__all__ = ["NotARegularFile", "file_kind", "open_regular", "open_regular_stream", "read_regular_bytes"]
