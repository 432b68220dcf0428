"""Cache keys for visual inputs: the content's identity, narrowed by an explicit id when one is given.

A path is keyed by its file's identity: resolved location, device, inode, size, modification time and
status-change time (``st_ctime_ns``), so a cache hit never needs to decode the file, and a file
rewritten in place with the same size and its old modification time restored (``cp -p``, ``rsync -t``,
``tar``, ``os.utime``) is a miss: the rewrite and the restoring ``utime`` both set the ctime, which no
unprivileged call can set back. (A :class:`~capreward.media.files.ConfinedFile` is keyed the same way,
from ``fstat`` of its confined descriptor, never from the name.) In-memory pixels are keyed by a
BLAKE2 hash of their bytes.

An explicit id (a dataset's ``visual_id``, a label's ``"visual_id"``) never names a cache entry by
itself: reused for other content (in one call, across calls, across clients of the reward server), it
would serve the other content's embedding. It only narrows the content key; an item that has no
content key (an unsupported type, an image too large to hash) is not cached at all.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import torch
from PIL import Image

from .files import ConfinedFile, FileRefused
from .limits import get_media_limits


def hash_bytes(data: Any) -> str:
    """Hex BLAKE2b-128 digest of a bytes-like object."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def media_key(item: Any, explicit_id: str | None = None) -> str | None:
    """A string that identifies ``item``'s pixels, or None if it cannot be keyed cheaply.

    The key is :func:`content_key` of ``item``; an ``explicit_id`` is added to it (``id:<id>|<content
    key>``), never used alone. Returns None when the content has no key (unsupported types, over-large
    images: the caller then loads the item, which raises the appropriate error, and caches nothing).
    """
    return with_id(content_key(item), explicit_id)


def with_id(content: str | None, explicit_id: str | None) -> str | None:
    """``content`` (a :func:`content_key`) narrowed by ``explicit_id``; None when there is no content key."""
    if content is None or explicit_id is None:
        return content
    return f"id:{explicit_id}|{content}"


def file_identity(st: os.stat_result) -> str:
    """Device, inode, size, modification and status-change times (ns) of a ``stat`` result."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def content_key(item: Any) -> str | None:
    """The identity of ``item``'s content: its file's identity for a path or confined file (see the
    module docstring), a hash of the pixels for in-memory images, arrays, tensors and frame lists;
    None for anything else."""
    if isinstance(item, (str, os.PathLike)):
        path = os.path.realpath(os.fspath(item))
        try:
            st = os.stat(path)
        except OSError:
            return None
        return f"path:{path}:{file_identity(st)}"
    if isinstance(item, ConfinedFile):
        try:
            with item.opened() as fd:
                st = os.fstat(fd)
        except FileRefused:
            return None  # loading it raises the refusal
        return f"path:{item.path}:{file_identity(st)}"
    if isinstance(item, torch.Tensor):
        tensor = item.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: key its bits (the dtype is in the key)
            return f"tensor:{tensor.dtype}:{tuple(tensor.shape)}:{hash_bytes(tensor.view(torch.int16).numpy().data)}"
        item = tensor.numpy()
    if isinstance(item, np.ndarray):
        array = np.ascontiguousarray(item)
        return f"array:{array.dtype}:{array.shape}:{hash_bytes(array.data)}"
    if isinstance(item, Image.Image):
        if item.width * item.height > get_media_limits().max_pixels:
            return None  # never decode an over-large image just to key it; loading it raises
        try:  # a lazily opened file decodes here: a broken one gets no key, and loading it raises
            if item.mode != "RGB":  # alpha, palette and 16-bit samples change the score: key the raw data
                palette = item.getpalette() or []
                h = hashlib.blake2b(item.tobytes(), digest_size=16)
                h.update(bytes(str((palette, item.info.get("transparency"))), "utf-8"))
                return f"image:{item.mode}:{item.size}:{h.hexdigest()}"
            array = np.ascontiguousarray(np.asarray(item))
        except Exception:
            return None
        return f"array:{array.dtype}:{array.shape}:{hash_bytes(array.data)}"
    if isinstance(item, (list, tuple)) and item and all(isinstance(f, (Image.Image, np.ndarray)) for f in item):
        try:
            return _frames_key(item)
        except Exception:  # a broken lazily opened frame: no key; loading it raises MediaError
            return None
    return None


def _frames_key(frames: list | tuple) -> str | None:
    """Content key of a list of PIL frames / uint8 arrays (None if a frame is over ``max_pixels``)."""
    h = hashlib.blake2b(digest_size=16)
    for frame in frames:
        if isinstance(frame, Image.Image):
            if frame.width * frame.height > get_media_limits().max_pixels:
                return None
            h.update(f"{frame.mode}:{frame.size}:{frame.getpalette()}".encode())
            h.update(frame.tobytes())
        else:
            a = np.ascontiguousarray(frame)
            h.update(str(a.shape).encode())
            h.update(a.data)
    return f"frames:{len(frames)}:{h.hexdigest()}"
