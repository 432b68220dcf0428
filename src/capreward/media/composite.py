"""G-VEval's three-frame composite: a video shown to an image judge as one labelled image.

Three frames at ``int(linspace(0, T-1, 4))[:-1]`` (the first three of four evenly spaced frames), each
resized to 512x462 with a white 50-pixel band labelled "Frame k" (k = 1, 2, 3) beneath it, side by
side in one 1536x512 RGB image. The layout follows the released code (ztangaj/gveval,
``evaluation/gveval/utils.py``): bilinear resize without antialiasing (OpenCV's ``INTER_LINEAR``), the
band stacked below the frame, the label's baseline-left corner at (10, 35) inside the band.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

from .errors import MediaError
from .images import describe
from .videos import load_video

COMPOSITE_FRAMES = 3
FRAME_WIDTH = 512
FRAME_HEIGHT = 462
BAND_HEIGHT = 50
LABEL_ORIGIN = (10, 35)  # baseline-left of the label, relative to the band
# OpenCV's HERSHEY_SIMPLEX at scale 1.2 (the release) draws capitals about 26 px tall; a 36-px TrueType
# font has about the same cap height.
LABEL_SIZE = 36


def composite_indices(num_frames: int) -> np.ndarray:
    """Frame indices used for a video of ``num_frames`` frames: ``int(linspace(0, T-1, 4))[:-1]``
    (3 values in [0, T-1]; repeats for very short videos)."""
    if num_frames <= 0:
        raise ValueError("a video needs at least one frame")
    return np.linspace(0, num_frames - 1, COMPOSITE_FRAMES + 1).astype(np.int64)[:-1]


def _label_font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=LABEL_SIZE)
    except (TypeError, OSError, ImportError):  # Pillow without FreeType: the small bitmap font
        return ImageFont.load_default()


def resize_bilinear(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """uint8 (H, W, 3) -> uint8 (height, width, 3) by bilinear interpolation with half-pixel centres and
    no antialiasing, the sampling of OpenCV's ``cv2.resize(..., INTER_LINEAR)``."""
    x = torch.from_numpy(np.array(frame, dtype=np.uint8)).permute(2, 0, 1)[None].float()  # a copy: inputs may be read-only
    y = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=False)
    return y[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def composite_frames(frames: Sequence[Any]) -> Image.Image:
    """Lay out three frames (PIL images or uint8 (H, W, 3) arrays) as G-VEval does.

    Returns a 1536x512 RGB image: panel k (0-based) spans x in [512k, 512k + 512); its top 462 rows
    are the frame (bilinear resize to 512x462), its bottom 50 rows are white with "Frame k+1" in black,
    left-aligned at x = 10 with its baseline 35 rows into the band.
    """
    if len(frames) != COMPOSITE_FRAMES:
        raise ValueError(f"a composite needs {COMPOSITE_FRAMES} frames, got {len(frames)}")
    canvas = Image.new("RGB", (FRAME_WIDTH * COMPOSITE_FRAMES, FRAME_HEIGHT + BAND_HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    font = _label_font()
    for k, frame in enumerate(frames):
        array = np.asarray(frame.convert("RGB")) if isinstance(frame, Image.Image) else np.asarray(frame)
        canvas.paste(Image.fromarray(resize_bilinear(array, FRAME_WIDTH, FRAME_HEIGHT)), (k * FRAME_WIDTH, 0))
        origin = (k * FRAME_WIDTH + LABEL_ORIGIN[0], FRAME_HEIGHT + LABEL_ORIGIN[1])
        label = f"Frame {k + 1}"
        try:
            draw.text(origin, label, fill=(0, 0, 0), font=font, anchor="ls")
        except ValueError:  # the bitmap fallback font has no anchors: place its top-left by hand
            top = draw.textbbox((0, 0), label, font=font)[3]
            draw.text((origin[0], origin[1] - top), label, fill=(0, 0, 0), font=font)
    return canvas


def video_composite(item: Any, index: int | None = None) -> Image.Image:
    """Decode ``item`` (a path, a (T, H, W, 3) uint8 array/tensor or a list of frames, see
    :func:`capreward.media.load_video`) and return its 1536x512 three-frame composite.

    Raises :class:`MediaError` naming the item when the video cannot be used.
    """
    frames = load_video(item, frames=COMPOSITE_FRAMES + 1, index=index)[:-1]
    if frames.shape[0] != COMPOSITE_FRAMES:  # pragma: no cover - load_video always returns 4 here
        raise MediaError(describe(item, index), f"expected {COMPOSITE_FRAMES} frames, got {frames.shape[0]}")
    return composite_frames(list(frames))
