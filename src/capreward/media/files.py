"""Opening a file named under a root so that the open itself stays inside the root.

Checking a name (``realpath`` lands inside the root, the target is a regular file) and opening it later
leaves a window: anyone who can write inside the root can swap a directory on the way for a symlink
that points out of it between the check and the open. A :class:`ConfinedFile` closes the window by
never opening the name again: it holds the root and the checked path relative to it (no symlink in
it), and every open walks that path one component at a time from a descriptor of the root with
``O_NOFOLLOW`` (a component that has become a symlink fails the walk), then checks the opened file
with ``fstat`` (a regular file) and, on Linux, the descriptor's own path
(``/proc/self/fd/N`` lies inside the root). The loaders read the opened descriptor: PIL through a file
object, PyAV (the header probe, and the decoder where it decodes) through a duplicate of the descriptor,
decord through ``/proc/self/fd/N``, which opens the same file whatever happens to its name since. Each open lasts one decode: no descriptor outlives the loader.

A refused open raises :class:`FileRefused` with :data:`REFUSED`, the one text of every refusal (no
matter whether the name is missing, a symlink, a directory...), so that a client learns nothing.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path, PurePosixPath
from collections.abc import Iterator

from ..errors import CaprewardError

REFUSED = "not a file under the server's media root"

#: Where a Linux process sees its own descriptors as paths (absent elsewhere).
FD_DIR = "/proc/self/fd"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# a FIFO swapped in must not block the open; O_NOCTTY: a terminal never becomes ours
_FILE_FLAGS = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
# O_PATH (Linux): directories on the way need search permission only, as for an open by name; with
# O_NOFOLLOW | O_DIRECTORY a symlink fails with ENOTDIR
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | _O_NOFOLLOW | _O_CLOEXEC | _O_DIRECTORY


class FileRefused(CaprewardError, OSError):
    """The file cannot be opened inside its root (its message is :data:`REFUSED`)."""

    def __init__(self) -> None:
        super().__init__(REFUSED)


def fd_path(fd: int) -> str | None:
    """The path through which ``fd``'s file can be opened again (``/proc/self/fd/N``), or None where
    the system has no such paths."""
    return f"{FD_DIR}/{fd}" if os.path.isdir(FD_DIR) else None


def _walk_supported() -> bool:
    return bool(_O_NOFOLLOW and _O_DIRECTORY) and os.open in os.supports_dir_fd


class ConfinedFile:
    """A regular file at ``relative`` under the directory ``root`` (both as checked: ``root`` a real
    absolute path, ``relative`` the file's real path relative to it), opened only inside ``root``.

    Not a path (no ``__fspath__``): code that does not know this type fails loudly instead of opening
    the name. ``path`` is the absolute name, for messages and cache keys only.
    """

    __slots__ = ("root", "relative")

    def __init__(self, root: str | os.PathLike, relative: str | os.PathLike):
        self.root = os.fspath(root)
        rel = PurePosixPath(os.fspath(relative))
        if rel.is_absolute() or not rel.parts or ".." in rel.parts:
            raise ValueError(f"relative must be a path inside the root, got {os.fspath(relative)!r}")
        self.relative = str(rel)

    @property
    def path(self) -> str:
        """The file's absolute name when it was checked (never opened by the loaders)."""
        return os.path.join(self.root, self.relative)

    def __repr__(self) -> str:
        return f"ConfinedFile({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfinedFile) and (self.root, self.relative) == (other.root, other.relative)

    def __hash__(self) -> int:
        return hash((ConfinedFile, self.root, self.relative))

    def __getstate__(self):
        return (self.root, self.relative)

    def __setstate__(self, state) -> None:
        self.root, self.relative = state

    def open_fd(self) -> int:
        """A read-only descriptor of the file, opened without following any symlink and verified to be
        a regular file inside the root; the caller closes it. Raises :class:`FileRefused`."""
        try:
            fd = self._walk() if _walk_supported() else os.open(self.path, _FILE_FLAGS)
        except OSError:  # ELOOP (a swapped-in symlink), ENOENT, ENOTDIR, EACCES...: one refusal
            raise FileRefused() from None
        try:
            self._verify(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def opened(self) -> Iterator[int]:
        """``with f.opened() as fd:`` the descriptor of :meth:`open_fd`, closed after the block."""
        fd = self.open_fd()
        try:
            yield fd
        finally:
            os.close(fd)

    def _walk(self) -> int:
        parent = os.open(self.root, _DIR_FLAGS)
        try:
            *dirs, name = PurePosixPath(self.relative).parts
            for part in dirs:
                child = os.open(part, _DIR_FLAGS, dir_fd=parent)
                os.close(parent)
                parent = child
            return os.open(name, _FILE_FLAGS, dir_fd=parent)
        finally:
            os.close(parent)

    def _verify(self, fd: int) -> None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileRefused()
        through = fd_path(fd)
        if through is None:
            return
        try:
            real = Path(os.readlink(through))
        except OSError:
            raise FileRefused() from None
        root = Path(self.root)
        if real == root or not real.is_relative_to(root):
            raise FileRefused()


__all__ = ["ConfinedFile", "FD_DIR", "FileRefused", "REFUSED", "fd_path"]
