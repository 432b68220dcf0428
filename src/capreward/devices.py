"""Checking a torch device before a model is moved to it.

``torch`` reports a device that is not there deep inside the first ``.to(device)`` ("Torch not compiled
with CUDA enabled", "Found no NVIDIA driver", "invalid device ordinal"). :func:`checked_device` says it
at once, in one line naming the devices there are and what to pick instead; the CLI prints that line
and exits 2, the Python API raises :class:`DeviceUnavailableError` (a ``ValueError``).
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import TypeVar
from collections.abc import Callable, Iterator

import torch

from .errors import CaprewardError


class DeviceUnavailableError(CaprewardError, ValueError):
    """The device asked for does not exist on this machine; the message says which to pick."""


def checked_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``, after checking that this machine has it (CUDA: a visible GPU
    with that index; MPS: an available Metal device; anything else is taken as given).

    Raises :class:`DeviceUnavailableError` with one line naming the devices there are and the choice to
    make (``device="cpu"``; on the command line ``--device cpu`` or ``--device auto``), and ValueError for
    a string that is no device at all.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device (cpu, cuda, cuda:1, mps …): {exc}") from None
    pick = "pick device='cpu' (command line: --device cpu, or --device auto for a GPU when there is one)"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is built without CUDA" if torch.version.cuda is None
                   else f"this torch (CUDA {torch.version.cuda}) sees no GPU: no driver, or CUDA_VISIBLE_DEVICES hides them")
            raise DeviceUnavailableError(f"device {str(device)!r} is not available: {why}; {pick}")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            visible = ", ".join(f"cuda:{i}" for i in range(count))
            raise DeviceUnavailableError(
                f"device {str(device)!r} is not available: {count} GPU{'s' if count != 1 else ''} visible ({visible}); "
                f"pick one of them or device='cpu'"
            )
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceUnavailableError(f"device {str(device)!r} is not available: no Metal (MPS) device here; {pick}")
    return dev


def host_to_device(tensor: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``: on CUDA through pinned memory without blocking the host (the
    copy is queued on the current stream, so later work on that stream sees it; torch's pinned-memory
    allocator keeps the buffer until the copy is done), elsewhere a plain ``.to``."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        pinned = tensor if tensor.is_pinned() else tensor.pin_memory()
        return pinned.to(device, non_blocking=True)
    return tensor.to(device)


# --------------------------------------------------------------------------- what fp32 means on CUDA
# capreward's "fp32" is IEEE fp32 everywhere. On Ampere and later GPUs torch runs cuDNN convolutions (the CLIP
# patch embedding) in TF32 by default and, where a program asks for it, matmuls too: ~1e-3 relative error,
# which would miss the 1e-5 parity with the CPU and the fp64 reference. So every encoder call of capreward on
# CUDA runs inside :func:`strict_fp32`, which sets TF32 off for matmul and cuDNN and restores the caller's
# settings afterwards (a training loop that enables TF32 for itself keeps it outside capreward's calls).
# fp16/bf16 models are unaffected (TF32 concerns fp32 operations only).
_FP32_LOCK = threading.Lock()
_FP32_DEPTH = 0
_FP32_SAVED: list = []
F = TypeVar("F", bound=Callable)


def _tf32_switches() -> list[tuple[object, str]]:
    """(object, attribute) of each TF32 switch: torch >= 2.9's ``fp32_precision`` ("ieee"/"tf32"/"none"),
    else the legacy ``allow_tf32`` flags. One API only: torch refuses to read flags set through a mix."""
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    if conv is not None:
        return [(torch.backends.cuda.matmul, "fp32_precision"), (torch.backends.cudnn.conv, "fp32_precision")]
    return [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")]


def _strict_value(attr: str):
    return "ieee" if attr == "fp32_precision" else False


@contextmanager
def strict_fp32(device: str | torch.device) -> Iterator[None]:
    """Within the block, fp32 matmuls and cuDNN convolutions on CUDA are IEEE fp32 (TF32 off); the
    previous settings are restored when the outermost block of any thread exits. Nothing happens for
    another device.

    Example::

        >>> import torch
        >>> from capreward.devices import strict_fp32
        >>> with strict_fp32("cpu"):  # on the CPU: nothing to switch
        ...     _ = torch.ones(2, 2) @ torch.ones(2, 2)
    """
    global _FP32_DEPTH
    if torch.device(device).type != "cuda":
        yield
        return
    with _FP32_LOCK:
        if _FP32_DEPTH == 0:
            switches = _tf32_switches()
            _FP32_SAVED[:] = [(obj, attr, getattr(obj, attr)) for obj, attr in switches]
            for obj, attr in switches:
                setattr(obj, attr, _strict_value(attr))
        _FP32_DEPTH += 1
    try:
        yield
    finally:
        with _FP32_LOCK:
            _FP32_DEPTH -= 1
            if _FP32_DEPTH == 0:
                for obj, attr, value in _FP32_SAVED:
                    setattr(obj, attr, value)
                _FP32_SAVED.clear()


def strict_fp32_method(method: F) -> F:
    """Runs a method of an object with a ``device`` attribute inside :func:`strict_fp32` of that device."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with strict_fp32(self.device):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = ["DeviceUnavailableError", "checked_device", "host_to_device", "strict_fp32", "strict_fp32_method"]
