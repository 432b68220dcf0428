"""Image preparation for VLM judges: LLaVA's square padding."""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image


def mean_background(image_mean: Sequence[float]) -> tuple[int, ...]:
    """LLaVA's padding colour: ``tuple(int(x * 255) for x in image_mean)`` (truncated, not rounded).

    For CLIP's mean (0.48145466, 0.4578275, 0.40821073) this is (122, 116, 104).
    """
    return tuple(int(x * 255) for x in image_mean)


def pad_to_square(image: Image.Image, background: Sequence[int]) -> Image.Image:
    """Centre ``image`` on a square canvas of its longer side filled with ``background`` (LLaVA's
    ``expand2square``). Returns a new RGB image; a square image is returned unchanged."""
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    canvas = Image.new(image.mode, (side, side), tuple(background))
    canvas.paste(image, ((side - width) // 2, (side - height) // 2))
    return canvas
