"""What a result row was scored on, so that a resume can tell a row whose inputs changed since.

Every result row records its caption, references and visual path, and ``visual_hash``: the BLAKE2b-128
digest of the visual file's bytes when it was scored (None when the file could not be read; a row with
several images records the list of their paths and the list of their digests). On resume,
each row already in the results is compared with the manifest's row of the same id; a row whose
caption, references, visual path or visual content changed is not silently kept
(:class:`ChangedInputs` names the rows and what changed). Rows written before ``visual_hash`` existed
are checked on their caption, references and path only.

Example::

    digests = VisualDigests()
    digests("clip.mp4")    # '3f2a...' (the file is read once per identity: size, times, inode)
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ..input_files import open_regular_stream
from ..media.keys import file_identity
from ..text import capped
from .errors import JobError

#: The result-row field holding the visual's content hash.
HASH_FIELD = "visual_hash"
#: Changed rows named in a refusal (the count of the others is given).
SHOWN = 5


class ChangedInputs(JobError):
    """Rows of a results file scored on other inputs than the manifest's rows of the same ids."""


class VisualDigests:
    """BLAKE2b-128 of a file's bytes, cached per file identity (device, inode, size, times) for the
    process; None when the file cannot be read or is not a regular file (a FIFO or a device is never
    opened for reading: :func:`~capreward.input_files.open_regular`; the row's loader refuses it)."""

    def __init__(self) -> None:
        self._cache: dict[str, str] = {}

    def __call__(self, path: str) -> str | None:
        try:
            with open_regular_stream(path, "the visual") as f:
                key = f"{path}|{file_identity(os.fstat(f.fileno()))}"
                if key not in self._cache:
                    digest = hashlib.blake2b(digest_size=16)
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                    self._cache[key] = digest.hexdigest()
                return self._cache[key]
        except (OSError, ValueError):
            return None


#: One cache per process (a job's scorer and its resume check share it).
visual_digest = VisualDigests()


def stored_inputs(row: dict) -> tuple[Any, Any, Any, Any, Any]:
    """(caption, references, image, video, visual_hash) of a result row as written (missing: None;
    ``visual_hash`` missing altogether: the string ``"unrecorded"``)."""
    return (row.get("caption"), row.get("references"), row.get("image"), row.get("video"),
            row.get(HASH_FIELD, "unrecorded"))


def changes(stored: tuple, row: Any, references_used: bool = True) -> list[str]:
    """What differs between a result row's :func:`stored_inputs` and manifest row ``row``
    (a :class:`~capreward.jobs.manifest.ManifestRow`): ``caption``, ``references`` (only when the job
    uses them, ``references_used``), ``visual path``, ``visual content``."""
    caption, references, image, video, digest = stored
    out = []
    if caption != row.caption:
        out.append("caption")
    if references_used and references != row.references:
        out.append("references")
    path = image if row.kind == "image" else video
    if path != getattr(row, "visual", row.path) or (image is not None and video is not None):
        out.append("visual path")
    elif digest != "unrecorded" and digest != visual_digests(row):
        out.append("visual content")
    return out


def visual_digests(row: Any) -> str | None | list[str | None]:
    """The ``visual_hash`` of manifest row ``row``: its file's digest, or the list of its images' digests
    for a row with several images."""
    paths = getattr(row, "paths", None)
    return [visual_digest(p) for p in paths] if paths else visual_digest(row.path)


def check_unchanged(rows: list, stored: dict[str, tuple], out: str, references_used: bool = True) -> None:
    """Raise :class:`ChangedInputs` when a manifest row already in results file ``out`` (``stored``: id
    -> :func:`stored_inputs`) has other inputs now, naming the rows and what changed (references only
    when the job uses them)."""
    changed = [(r.id, what) for r in rows if r.id in stored and (what := changes(stored[r.id], r, references_used))]
    if not changed:
        return
    shown = "; ".join(f"{capped(rid)}: {', '.join(what)}" for rid, what in changed[:SHOWN])
    more = f"; and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
    raise ChangedInputs(
        f"{len(changed)} row(s) of {out} were scored on other inputs than the manifest has now ({shown}{more}); "
        "their scores would not match them. Remove those rows from the results file to rescore them, "
        "or score into a new --out"
    )
