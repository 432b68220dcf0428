"""Turning decoded frames upright: the display matrix of a video stream as an axis transpose and flips.

Phones store frames as the sensor reads them and record how to show them: a 3x3 display matrix
(``AV_PKT_DATA_DISPLAYMATRIX``; MP4's ``tkhd`` matrix, Matroska's projection) whose upper-left 2x2
block, in 16.16 fixed point, maps a stored pixel ``(x, y)`` to its displayed position
``(a x + c y, b x + d y)`` (FFmpeg's convention, ``libavutil/display.h``). Players apply it; a
caption describes what the player shows, so the loaders apply it too. The matrix is snapped to the
nearest of the eight right-angle rotations and mirrorings (what every recording device writes; an odd
angle is rounded to the nearest quarter turn).

Images carry the same information as the EXIF ``Orientation`` tag (0x0112, values 1-8);
:func:`upright_image` applies it, so an image is scored as a viewer shows it, like a video.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

_ONE = 1 << 16  # 1.0 in 16.16 fixed point


@dataclass(frozen=True)
class Orientation:
    """How stored frames become displayed ones: ``transpose`` swaps rows and columns first, then
    ``flip_x`` mirrors left-right and ``flip_y`` top-bottom. The identity is ``Orientation()``."""

    transpose: bool = False
    flip_x: bool = False
    flip_y: bool = False

    @property
    def identity(self) -> bool:
        return not (self.transpose or self.flip_x or self.flip_y)

    def displayed_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of a displayed frame stored as ``width`` x ``height``."""
        return (height, width) if self.transpose else (width, height)

    def apply(self, frames: np.ndarray) -> np.ndarray:
        """Frames (T, H, W, C) as displayed: a contiguous array (T, H', W', C)."""
        if self.identity:
            return frames
        if self.transpose:
            frames = frames.transpose(0, 2, 1, 3)
        if self.flip_x:
            frames = frames[:, :, ::-1]
        if self.flip_y:
            frames = frames[:, ::-1]
        return np.ascontiguousarray(frames)


# (a, b, c, d) of each right-angle matrix -> the orientation it encodes. Displayed position
# (x', y') = (a x + c y, b x + d y): with c = d = 0 the stored x becomes the displayed y (a transpose).
_ORIENTATIONS = {
    (1, 0, 0, 1): Orientation(),
    (-1, 0, 0, 1): Orientation(flip_x=True),
    (1, 0, 0, -1): Orientation(flip_y=True),
    (-1, 0, 0, -1): Orientation(flip_x=True, flip_y=True),
    (0, 1, 1, 0): Orientation(transpose=True),
    (0, 1, -1, 0): Orientation(transpose=True, flip_x=True),
    (0, -1, 1, 0): Orientation(transpose=True, flip_y=True),
    (0, -1, -1, 0): Orientation(transpose=True, flip_x=True, flip_y=True),
}


def orientation_from_matrix(matrix: Sequence[int] | None) -> Orientation:
    """The orientation of FFmpeg display matrix ``matrix`` (9 int32, row-major; None or all zero: the
    identity), snapped to the nearest right-angle transform."""
    if matrix is None or len(matrix) != 9:
        return Orientation()
    a, b, c, d = (float(matrix[i]) / _ONE for i in (0, 1, 3, 4))
    if a == b == c == d == 0:
        return Orientation()
    nearest = min(_ORIENTATIONS, key=lambda m: (m[0] - a) ** 2 + (m[1] - b) ** 2 + (m[2] - c) ** 2 + (m[3] - d) ** 2)
    return _ORIENTATIONS[nearest]


#: The EXIF Orientation tag.
EXIF_ORIENTATION = 0x0112


def upright_image(image):
    """``image`` (a loaded ``PIL.Image``) as a viewer shows it: its EXIF Orientation (2-8) applied
    (``PIL.ImageOps.exif_transpose``; the tag removed from the copy returned), else ``image`` itself.
    An unreadable EXIF block leaves the image as stored."""
    from PIL import ImageOps

    try:
        orientation = image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - a malformed EXIF block is no reason to refuse the pixels
        return image
    if orientation not in range(2, 9):
        return image
    return ImageOps.exif_transpose(image)


__all__ = ["EXIF_ORIENTATION", "Orientation", "orientation_from_matrix", "upright_image"]
