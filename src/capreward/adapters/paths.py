"""Which files a label may name: the confinement of client-named paths to a media root.

A reward server reads the image or video a remote client names, so every such path is resolved
(``..``, symlinks and all) and must land on a regular file inside the configured root. The check is
repeated where it matters, at open time: a confined path is handed on as a
:class:`~capreward.media.files.ConfinedFile`, which the loaders open without following any symlink and
verify to be inside the root (a directory swapped for a symlink after the check is refused then). Every refusal
reads the same (:data:`REFUSED`) whatever the reason (outside the root, absent, a directory, a device,
a symlink pointing out, a NUL byte), so that a client learns nothing about the server's filesystem.

:class:`MediaPaths` is the policy: ``MediaPaths(root)`` confines; ``MediaPaths(None)`` refuses every
path; ``MediaPaths(root, allow_any_path=True)`` is the trusted-caller mode (a veRL run over the
operator's own dataset): relative paths are joined to ``root`` when one is given, ``~`` is expanded
and nothing is checked (the scorer reports a missing file per sample).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import CaprewardError
from ..media.files import REFUSED, ConfinedFile
NO_ROOT = "this server reads no files (it was started without a media root)"
NOT_LOCAL = "URLs and inline data are not accepted; name a file under the server's media root"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://|^data:", re.IGNORECASE)


class PathRefused(CaprewardError, ValueError):
    """A path the policy does not serve; the message is one of the fixed texts above."""


class MediaPaths:
    """Where label paths may point.

    Args:
        root: directory that relative paths are resolved against and that confines them (resolved
            once, symlinks included; it must exist unless ``allow_any_path``).
        allow_any_path: serve any path the label names (no confinement, no checks).

    Raises:
        ValueError: a confined ``root`` that is not a directory.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from capreward.adapters import MediaPaths
        >>> root = Path(tempfile.mkdtemp())
        >>> _ = (root / "a.png").write_bytes(b"...")
        >>> paths = MediaPaths(root)
        >>> type(paths.resolve("a.png")).__name__
        'ConfinedFile'
        >>> paths.resolve("../etc/passwd")
        Traceback (most recent call last):
        ...
        capreward.adapters.paths.PathRefused: not a file under the server's media root
    """

    def __init__(self, root: str | os.PathLike | None = None, allow_any_path: bool = False):
        self.allow_any_path = bool(allow_any_path)
        if root is None:
            self.root: Path | None = None
        elif self.allow_any_path:
            self.root = Path(os.fspath(root)).expanduser()
        else:
            real = Path(os.path.realpath(Path(os.fspath(root)).expanduser()))
            if not real.is_dir():
                raise ValueError(f"media root {os.fspath(root)!r} is not a directory")
            self.root = real

    @property
    def confined(self) -> bool:
        return not self.allow_any_path

    def resolve(self, value: str) -> str | ConfinedFile:
        """What the loaders open for a label's ``value``.

        Args:
            value: the path a label names (relative to the root, or absolute).

        Returns:
            Confined: a :class:`~capreward.media.files.ConfinedFile` of the real path (symlinks resolved)
            of a regular file inside the root, opened only inside the root. Trusted mode: the path
            ``value`` with ``~`` expanded, joined to the root when relative.

        Raises:
            PathRefused: confined, a path that is not a regular file inside the root (:data:`REFUSED`,
                whatever the reason), no root (:data:`NO_ROOT`) or a URL (:data:`NOT_LOCAL`).
        """
        if _URL.match(value):
            raise PathRefused(NOT_LOCAL)
        if self.allow_any_path:
            path = Path(value).expanduser()
            if self.root is not None and not path.is_absolute():
                path = self.root / path
            return os.fspath(path)
        if self.root is None:
            raise PathRefused(NO_ROOT)
        try:
            # no expanduser: "~/x" is a relative name under the root, never the server's home
            real = Path(os.path.realpath(self.root / value))
            inside = real != self.root and real.is_relative_to(self.root)
            if not inside or not real.is_file():
                raise PathRefused(REFUSED)
        except (OSError, ValueError) as exc:  # NUL bytes, over-long names, loops: the same refusal
            if isinstance(exc, PathRefused):
                raise
            raise PathRefused(REFUSED) from None
        return ConfinedFile(self.root, real.relative_to(self.root))

    def redact(self, text: str) -> str:
        """``text`` with the confined root's absolute location replaced by ``<media-root>`` (reasons
        sent to clients name files relative to the root, not where the root lives)."""
        if self.root is None or not self.confined:
            return text
        return text.replace(os.fspath(self.root), "<media-root>")


__all__ = ["MediaPaths", "NOT_LOCAL", "NO_ROOT", "PathRefused", "REFUSED"]
