"""Checking a torch device before a model is moved to it.

``torch`` reports a device that is not there deep inside the first ``.to(device)`` ("Torch not compiled
with CUDA enabled", "Found no NVIDIA driver", "invalid device ordinal"). :func:`checked_device` says it
at once, in one line naming the devices there are and what to pick instead; the CLI prints that line
and exits 2, the Python API raises :class:`DeviceUnavailableError` (a ``ValueError``).
"""

from __future__ import annotations

import torch


class DeviceUnavailableError(ValueError):
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


__all__ = ["DeviceUnavailableError", "checked_device"]
