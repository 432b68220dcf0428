"""CLIP preprocessing on the device: resize, centre crop and normalise decoded frames as tensors.

The released CLIP transforms (OpenAI's ``clip.load``, open_clip's ``image_transform``) run on PIL images:
``Resize(size, bicubic)`` of the shorter side, ``CenterCrop``, conversion to RGB, ``ToTensor`` and
``Normalize``. On a GPU machine that CPU work is what a cold EMScore call waits for (512 frames: 0.95 s of
a 1.46 s call on an H200). :class:`TensorPreprocess` reads those parameters off the transform itself and
does the same steps on a batch of uint8 frames where the model is, with
``torchvision.transforms.v2.functional``: the frames are copied to the device as uint8 and resized in
float with the same filter (bicubic with antialiasing: PIL's kernel) **as PIL does it, in two passes**,
the horizontal one first, each rounded and clipped to 8-bit levels (PIL keeps an 8-bit image between its
passes; one 2-D resize without that step differs by up to 13 levels at 224 px), then centre-cropped,
scaled to [0, 1] and normalised. What is left is PIL's fixed-point arithmetic: a value one 8-bit level
off in 1 of 10,000 to 4 of 1,000 (upscaling small images).

It is an option (``CLIPBackbone(preprocessing="device")``), never the default; the deviation of the
scores from the PIL path is measured like fp16's (docs/design/parity.md,
``benchmarks/bench_emscore.py --preprocessing device``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Sequence

import numpy as np
import torch

#: Transform steps that only convert (mode, tensor type) and that the tensor path does by construction.
CONVERSIONS = frozenset({"MaybeConvertMode", "MaybeToTensor", "ToTensor", "_convert_to_rgb", "convert_to_rgb",
                         "_convert_image_to_rgb", "ToImage", "ToDtype"})


@dataclass(frozen=True)
class TensorPreprocess:
    """Resize (shorter side, or to a size), centre crop and normalise uint8 RGB frames as tensors.

    Args:
        size: torchvision ``Resize``'s size (an int or one-element list: the shorter side; a pair: (h, w)).
        interpolation: the ``InterpolationMode`` name ("bicubic", "bilinear", ...).
        antialias: ``Resize``'s antialias.
        max_size: ``Resize``'s max_size.
        crop: (height, width) of the centre crop (None: no crop).
        mean, std: per-channel normalisation.

    Examples:
        >>> import numpy as np
        >>> from capreward.media.device_pixels import TensorPreprocess
        >>> prep = TensorPreprocess(size=8, interpolation="bicubic", antialias=True, max_size=None, crop=(8, 8),
        ...                         mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
        >>> prep(np.zeros((2, 12, 16, 3), dtype=np.uint8), "cpu").shape
        torch.Size([2, 3, 8, 8])
    """

    size: Any
    interpolation: str
    antialias: bool
    max_size: int | None
    crop: tuple[int, int] | None
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_transform(cls, transform: Any) -> TensorPreprocess:
        """The parameters of a torchvision ``Compose`` of ``Resize``, ``CenterCrop``, conversions and
        ``Normalize`` (CLIP's and open_clip's evaluation transform). Raises ValueError for any other step,
        naming it (the device path does exactly what the transform does, or nothing)."""
        steps = getattr(transform, "transforms", None)
        if steps is None:
            raise ValueError(f"device preprocessing reads a torchvision Compose; got {type(transform).__name__}")
        found: dict[str, Any] = {}
        for step in steps:
            name = getattr(step, "__name__", None) or type(step).__name__
            if name == "Resize" and "resize" not in found and "crop" not in found:
                found["resize"] = step
            elif name == "CenterCrop" and "crop" not in found:
                found["crop"] = step
            elif name == "Normalize" and "normalize" not in found:
                found["normalize"] = step
            elif name not in CONVERSIONS:
                raise ValueError(f"device preprocessing does not reproduce the transform step {name!r}; use the PIL path")
        if "resize" not in found or "normalize" not in found:
            raise ValueError("device preprocessing needs a Resize and a Normalize step in the transform")
        resize = found["resize"]
        crop = found.get("crop")
        crop_size = None
        if crop is not None:
            c = crop.size if isinstance(crop.size, (tuple, list)) else (crop.size, crop.size)
            crop_size = (int(c[0]), int(c[-1]))
        interpolation = getattr(resize.interpolation, "value", resize.interpolation)
        size = list(resize.size) if isinstance(resize.size, (tuple, list)) else int(resize.size)
        norm = found["normalize"]
        return cls(size=size, interpolation=str(interpolation), antialias=bool(getattr(resize, "antialias", True)),
                   max_size=getattr(resize, "max_size", None), crop=crop_size,
                   mean=tuple(float(m) for m in norm.mean), std=tuple(float(s) for s in norm.std))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize, as torchvision's ``Resize`` computes it for a PIL image: the
        shorter side to ``size``, the longer scaled and truncated (``max_size`` caps it); a pair as given.

        Args:
            height: the input's height.
            width: the input's width.

        Returns:
            ``(height, width)``.
        """
        size = self.size
        if isinstance(size, (list, tuple)) and len(size) == 2:
            return int(size[0]), int(size[1])
        side = int(size[0] if isinstance(size, (list, tuple)) else size)
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = side, int(side * long / short)
        if self.max_size is not None and new_long > self.max_size:
            new_short, new_long = int(self.max_size * new_short / new_long), int(self.max_size)
        new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
        return new_h, new_w

    def __call__(self, frames: np.ndarray | torch.Tensor | Sequence[np.ndarray], device: str | torch.device) -> torch.Tensor:
        """Pixels (k, 3, h, w) float32 on ``device`` of uint8 RGB ``frames`` (k, H, W, 3), or a list of
        differently sized (H, W, 3) frames (each resized alone)."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as tvf

        device = torch.device(device)
        if isinstance(frames, (list, tuple)):
            return torch.cat([self(np.asarray(f)[None], device) for f in frames])
        x = torch.as_tensor(frames)
        if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"expected uint8 frames (k, H, W, 3), got {tuple(x.shape)} {x.dtype}")
        if device.type == "cuda" and not x.is_cuda:
            x = x.pin_memory().to(device, non_blocking=True)
        else:
            x = x.to(device)
        x = x.permute(0, 3, 1, 2).float()
        mode = InterpolationMode(self.interpolation)
        height, width = int(x.shape[-2]), int(x.shape[-1])
        new_h, new_w = self.output_size(height, width)
        # PIL: the horizontal pass, an 8-bit image, then the vertical pass, an 8-bit image
        if new_w != width:
            x = tvf.resize(x, [height, new_w], interpolation=mode, antialias=self.antialias).round_().clamp_(0, 255)
        if new_h != height:
            x = tvf.resize(x, [new_h, new_w], interpolation=mode, antialias=self.antialias).round_().clamp_(0, 255)
        if self.crop is not None:
            x = tvf.center_crop(x, list(self.crop))
        x = x / 255.0
        return tvf.normalize(x, list(self.mean), list(self.std))
