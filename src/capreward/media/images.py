"""Loading and validating images.

Accepted forms: a path (str or ``os.PathLike``), a :class:`~capreward.media.files.ConfinedFile` (a
file opened only inside its root), a ``PIL.Image.Image``, a uint8 array of shape (H, W, 3), or a
tensor of shape (3, H, W) or (H, W, 3), holding integers 0..255 (uint8, int64 …) or floats in [0, 1]
(torchmetrics' conventions). Everything is turned into an
RGB ``PIL.Image`` so that every form goes through the same (CLIP or VLM) preprocessing and gives
identical scores.

Hostile files: the size is read from the header and checked against
:mod:`capreward.media.limits` before decoding, and every decoder failure becomes a
:class:`MediaError` naming the item. Pixel formats: every mode PIL opens becomes the RGB a viewer
shows (16-bit and float greyscale scaled to 8 bits, see :func:`viewable`); alpha is dropped, as the
released CLIP transforms and VLM processors drop it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, BinaryIO
from collections.abc import Iterator

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .orientation import upright_image
from .errors import MediaError, MediaRefused
from .files import ConfinedFile, FileRefused
from .limits import MediaLimits, get_media_limits

ImageLike = Any  # str | os.PathLike | ConfinedFile | PIL.Image.Image | np.ndarray | torch.Tensor

#: The one refusal of float pixels that are NaN or infinite, whatever the form (file, PIL image, tensor,
#: array): such an image has no colour to score (an all-NaN float TIFF is not a black image).
NAN_IMAGE = "image contains NaN or infinite values"


def describe(item: Any, index: int | None = None) -> str:
    """A short human-readable name for an input item, used in error messages."""
    prefix = f"item {index}" if index is not None else "input"
    if isinstance(item, (str, os.PathLike)):
        return f"{prefix} ({os.fspath(item)!r})"
    if isinstance(item, ConfinedFile):
        return f"{prefix} ({item.path!r})"
    if isinstance(item, (np.ndarray, torch.Tensor)):
        return f"{prefix} ({type(item).__name__} of shape {tuple(item.shape)})"
    if isinstance(item, Image.Image) and (filename := getattr(item, "filename", None)):
        return f"{prefix} ({type(item).__name__} {filename!r})"
    return f"{prefix} ({type(item).__name__})"


def array_to_pil(array: np.ndarray, name: str) -> Image.Image:
    """Validate a uint8 (H, W, 3) array and wrap it as an RGB image."""
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        raise MediaError(name, NAN_IMAGE)
    if array.dtype != np.uint8:
        raise MediaError(name, f"image arrays must be uint8 (H, W, 3), got dtype {array.dtype}")
    if array.ndim != 3 or array.shape[2] != 3:
        raise MediaError(name, f"image arrays must have shape (H, W, 3), got {tuple(array.shape)}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise MediaError(name, "image is empty (zero height or width)")
    return Image.fromarray(np.ascontiguousarray(array), mode="RGB")


def _tensor_layout(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """The (H, W, 3) view of a 3-channel image tensor: (3, H, W) channel-first (torch's convention, also
    taken when the shape is (3, H, 3)) or (H, W, 3) channel-last; MediaError naming the item otherwise."""
    if tensor.ndim != 3 or 3 not in (tensor.shape[0], tensor.shape[2]):
        raise MediaError(
            name, f"image tensors must be one 3-d image, (3, H, W) or (H, W, 3), got shape {tuple(tensor.shape)}"
        )
    hwc = tensor.permute(1, 2, 0) if tensor.shape[0] == 3 else tensor
    if hwc.shape[0] == 0 or hwc.shape[1] == 0:
        raise MediaError(name, "image is empty (zero height or width)")
    return hwc


def tensor_to_pil(tensor: torch.Tensor, name: str) -> Image.Image:
    """An RGB image from one image tensor, with torchmetrics' conventions: (3, H, W) or (H, W, 3);
    integer dtypes (uint8, int64 …) hold 0..255, floating dtypes [0, 1] (rounded to 8 bits, as
    ``torchvision``'s ``to_pil_image`` does after scaling by 255). Values outside the range, NaN, bool and
    complex tensors are a MediaError naming the item."""
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise MediaError(name, f"image tensors must hold integers 0..255 or floats in [0, 1], got dtype {tensor.dtype}")
    hwc = _tensor_layout(tensor.detach(), name).cpu()
    if tensor.is_floating_point():
        t = hwc.float()
        if not bool(torch.isfinite(t).all()):
            raise MediaError(name, NAN_IMAGE)
        if t.min() < 0 or t.max() > 1:
            raise MediaError(
                name, f"float image values must lie in [0, 1], got [{t.min():.3g}, {t.max():.3g}] "
                "(integer tensors hold 0..255)"
            )
        array = (t * 255).round().to(torch.uint8).numpy()
    else:
        if hwc.dtype != torch.uint8:
            lo, hi = int(hwc.min()), int(hwc.max())
            if lo < 0 or hi > 255:
                raise MediaError(name, f"integer image values must lie in 0..255, got {lo}..{hi} (dtype {tensor.dtype})")
            hwc = hwc.to(torch.uint8)
        array = hwc.numpy()
    return Image.fromarray(np.ascontiguousarray(array), mode="RGB")


#: Modes whose ``convert("RGB")`` gives what a viewer shows (alpha dropped, as the released CLIP
#: transforms and VLM processors drop it: the colour under a transparent pixel is kept).
RGB_CONVERTIBLE_MODES = frozenset({"1", "L", "P", "PA", "LA", "RGB", "RGBA", "RGBX", "RGBa", "CMYK", "YCbCr", "HSV", "LAB"})
#: Integer modes holding 16-bit samples (PNG/TIFF 16-bit greyscale); ``convert("RGB")`` saturates them.
SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


def viewable(image: Image.Image, name: str) -> Image.Image:
    """``image`` in a mode whose ``convert("RGB")`` is what a viewer shows, converting only the modes
    PIL gets wrong.

    - modes in :data:`RGB_CONVERTIBLE_MODES` come back unchanged, so the caller can convert when the
      released code does (CLIP's transforms resize and crop first, then convert);
    - 16-bit greyscale (``I;16*``, and ``I``, PIL's 32-bit form of 16-bit PNGs) becomes 8-bit ``L`` by
      ``round(v / 257)`` (65535 -> 255; ``I`` values outside 0..65535 are clipped), where PIL would clip
      every value above 255 to white;
    - float ``F`` is read as intensity in [0, 1] (the floating-point image convention) and becomes ``L``
      by ``round(255 v)``, clipped, where PIL would read it on a 0..255 scale; NaN or infinite values
      are refused (:data:`NAN_IMAGE`), as for tensors and arrays;
    - ``La`` (premultiplied) becomes ``LA``; any other mode is converted to RGB by PIL.

    Raises :class:`MediaError` naming the item when PIL cannot convert the mode.
    """
    mode = image.mode
    if mode in RGB_CONVERTIBLE_MODES:
        return image
    try:
        if mode in SIXTEEN_BIT_MODES:
            values = np.asarray(image).astype(np.int64, copy=False)
            eight = (np.clip(values, 0, 65535) + 128) // 257
            return Image.fromarray(eight.astype(np.uint8), mode="L")
        if mode == "F":
            values = np.asarray(image, dtype=np.float32)
            if not np.isfinite(values).all():
                raise MediaError(name, NAN_IMAGE)
            return Image.fromarray(np.clip(np.rint(values * 255.0), 0, 255).astype(np.uint8), mode="L")
        if mode == "La":
            return image.convert("LA")
        return image.convert("RGB")
    except MediaError:
        raise
    except Exception as exc:  # PIL raises ValueError/OSError for modes it cannot convert
        raise MediaError(name, f"cannot convert image mode {mode!r} to RGB: {exc}") from exc


def to_rgb(image: Image.Image, name: str) -> Image.Image:
    """The RGB image a viewer shows for ``image`` (see :func:`viewable`)."""
    image = viewable(image, name)
    if image.mode == "RGB":
        return image
    try:
        return image.convert("RGB")
    except Exception as exc:
        raise MediaError(name, f"cannot convert image mode {image.mode!r} to RGB: {exc}") from exc


def _reduction_for(width: int, height: int, max_pixels: int) -> int:
    """The smallest factor s in (2, 4, 8) with ceil(W/s) * ceil(H/s) <= max_pixels; 0 if none."""
    for s in (2, 4, 8):
        if -(-width // s) * -(-height // s) <= max_pixels:
            return s
    return 0


def check_size(image: Image.Image, name: str, limits: MediaLimits | None = None) -> Image.Image:
    """Refuse an empty or over-large image from its header size, before any pixel is decoded.

    A JPEG or JPEG 2000 file over ``max_pixels`` is set up to decode at a reduced scale (1/2, 1/4 or
    1/8) that fits, when one does; the image is returned (still lazy), else :class:`MediaError` is
    raised naming the item.
    """
    limits = limits or get_media_limits()
    width, height = image.size
    if width <= 0 or height <= 0:
        raise MediaError(name, "image is empty (zero height or width)")
    if width * height <= limits.max_pixels:
        return image
    too_big = (
        f"image is {width}x{height} = {width * height:,} pixels, over the limit of {limits.max_pixels:,} "
        "(max_pixels; see capreward.media.limits)"
    )
    lazy = bool(getattr(image, "tile", None))  # an ImageFile not decoded yet
    s = _reduction_for(width, height, limits.max_pixels) if lazy else 0
    decoded = (width, height)
    if s and image.format == "JPEG":
        image.draft(image.mode, (width // s, height // s))
        decoded = image.size
    elif s and image.format == "JPEG2000":
        # the plugin decodes at 1 / 2**reduce and resizes at load; its attribute shadows Image.reduce()
        image.reduce = s.bit_length() - 1  # type: ignore[method-assign,assignment]
        decoded = ((width + s // 2) // s, (height + s // 2) // s)
    if decoded[0] * decoded[1] > limits.max_pixels:
        raise MediaError(name, too_big)
    return image


def confined_descriptor(file: ConfinedFile, name: str) -> int:
    """A read-only descriptor of ``file`` opened inside its root (the caller closes it); MediaError naming
    the item ``name`` with the one text of :data:`~capreward.media.files.REFUSED` when it is refused."""
    try:
        return file.open_fd()
    except FileRefused as exc:
        raise MediaRefused(name, str(exc)) from None


@contextlib.contextmanager
def opened_source(path: str | os.PathLike | ConfinedFile, name: str) -> Iterator[Path | BinaryIO]:
    """What PIL opens for a file item: a path, or for a :class:`ConfinedFile` a file object on its
    confined descriptor (closed after the block). MediaError when the file is missing, not a file or
    refused (the one text of :data:`~capreward.media.files.REFUSED`)."""
    if isinstance(path, ConfinedFile):
        fd = confined_descriptor(path, name)
        try:
            f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with f:
            yield f
        return
    p = Path(path)
    if not p.exists():
        raise MediaError(name, "file does not exist")
    if not p.is_file():
        raise MediaError(name, "path is not a file")
    yield p


def open_image_file(
    path: str | os.PathLike | ConfinedFile, name: str, keep_mode: bool = False, limits: MediaLimits | None = None
) -> Image.Image:
    """Read an image file, with a clear error when it is missing, unreadable, empty or too large.

    Returns RGB, or with ``keep_mode`` the decoded image in a mode whose ``convert("RGB")`` is right
    (see :func:`viewable`). Every failure of the decoder (PIL raises OSError, ValueError, SyntaxError,
    EOFError, DecompressionBombError and more on hostile files) becomes :class:`MediaError`.
    """
    with opened_source(path, name) as source:
        return _decode_file(source, name, keep_mode, limits)


def _decode_file(source: Path | BinaryIO, name: str, keep_mode: bool, limits: MediaLimits | None) -> Image.Image:
    try:
        with Image.open(source) as im:
            check_size(im, name, limits)
            im.load()
            image = viewable(upright_image(im), name)  # EXIF orientation applied, as a viewer shows it
            return image if keep_mode else to_rgb(image, name)
    except MediaError:
        raise
    except Image.DecompressionBombError as exc:
        raise MediaError(name, f"image is too large to decode safely: {exc}") from exc
    except UnidentifiedImageError as exc:
        # PIL names a file object by its repr, which holds the descriptor's number: leave it out
        detail = f" ({exc})" if isinstance(source, Path) else ""
        raise MediaError(name, f"cannot read image: not an image file PIL can identify{detail}") from exc
    except Exception as exc:  # any other decoder failure on a malformed file
        text = str(exc) if isinstance(source, Path) else str(exc).replace(repr(source), "the file")
        raise MediaError(name, f"cannot read image: {type(exc).__name__}: {text}") from exc


def pil_image(image: Image.Image, name: str, keep_mode: bool = False, limits: MediaLimits | None = None) -> Image.Image:
    """Validate an in-memory PIL image (size checked before a lazily opened file is decoded)."""
    check_size(image, name, limits)
    try:
        image.load()
    except Exception as exc:
        raise MediaError(name, f"cannot read image: {type(exc).__name__}: {exc}") from exc
    image = viewable(upright_image(image), name)
    return image if keep_mode else to_rgb(image, name)


def load_image(
    item: ImageLike, index: int | None = None, *, keep_mode: bool = False, limits: MediaLimits | None = None
) -> Image.Image:
    """Load one image.

    Args:
        item: a path, ``PIL.Image``, uint8 (H, W, 3) array or float (3, H, W) tensor in [0, 1].
        index: its position in the caller's list, for the error message.
        keep_mode: return files and PIL images in a mode whose ``convert("RGB")`` is what a viewer shows
            (RGBA, palette, CMYK... unchanged; 16-bit and float as 8-bit ``L``), for pipelines that
            convert after resizing as the released CLIP transforms do.
        limits: bounds the pixels decoded (default: the process-wide
            :func:`~capreward.media.limits.get_media_limits`).

    Returns:
        The image as an RGB ``PIL.Image`` (or in its viewable mode with ``keep_mode``).

    Raises:
        MediaError: the item is unusable (missing, undecodable, over a limit), naming it.
    """
    name = describe(item, index)
    if isinstance(item, (str, os.PathLike, ConfinedFile)):
        return open_image_file(item, name, keep_mode, limits)
    if isinstance(item, Image.Image):
        return pil_image(item, name, keep_mode, limits)
    if isinstance(item, np.ndarray):
        return array_to_pil(item, name)
    if isinstance(item, torch.Tensor):
        return tensor_to_pil(item, name)
    if item is None:
        raise MediaError(name, "image is missing (None)")
    raise MediaError(name, f"unsupported image type {type(item).__name__}")
