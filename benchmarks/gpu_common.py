"""What every benchmark of this folder shares for a GPU run: device synchronisation, measured peaks, the
JSON file a benchmark writes (``--json-out``), and the precision mapping of a CPU dry run.

A benchmark calls :func:`write_json` once at its end with the figures it printed; ``gpu_all.py`` reads the
file and appends it to its results. Peaks are measured on the machine, not taken from a datasheet.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def synchronize(device: torch.device | str = "cpu") -> None:
    """Wait for queued GPU work, so that wall-clock timings cover it (nothing to do on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def cpu_precision(device: str, precision: str) -> str:
    """The precision a run uses on ``device``: fp16 is mapped to bf16 on the CPU (a CPU dry run of a
    GPU command), anything else is kept."""
    return "bf16" if torch.device(device).type == "cpu" and precision == "fp16" else precision


def matmul_peak(device: str, dtype: torch.dtype, seconds: float = 1.0, n: int | None = None) -> float:
    """Best FLOP/s of ``torch.matmul`` on square ``dtype`` matrices (8192 on a GPU, 512 on the CPU): a few
    warm-up products, then timed products without a synchronisation between them (one at each end). fp32
    runs with whatever TF32 setting is current: the caller decides (see :func:`tf32_settings`)."""
    dev = torch.device(device)
    n = n or (8192 if dev.type == "cuda" else 512)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    out = torch.empty(n, n, device=dev, dtype=dtype)
    for _ in range(3 if dev.type == "cuda" else 1):
        torch.matmul(a, b, out=out)
    synchronize(dev)
    best, spent = 0.0, 0.0
    batch = 1
    while spent < seconds:
        start = time.perf_counter()
        for _ in range(batch):
            torch.matmul(a, b, out=out)
        synchronize(dev)
        took = time.perf_counter() - start
        spent += took
        best = max(best, 2 * n**3 * batch / took)
        if took < 0.05:
            batch *= 2
    return best


def copy_bandwidth(device: str, mib: int | None = None) -> dict[str, float]:
    """Bytes/s of device copies (read + written counted, as a copy moves both), host to device from pinned
    and from pageable memory. On the CPU: a memory copy (read + written) only."""
    dev = torch.device(device)
    mib = mib or (1024 if dev.type == "cuda" else 64)
    n = mib * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)

    def rate(fn, moved: int, rounds: int = 5) -> float:
        fn()
        synchronize(dev)
        best = math.inf
        for _ in range(rounds):
            start = time.perf_counter()
            fn()
            synchronize(dev)
            best = min(best, time.perf_counter() - start)
        return moved / best

    out = {"device_copy_bytes_per_s": rate(lambda: dst.copy_(src), 2 * n * 4)}
    if dev.type == "cuda":
        host = torch.empty(n // 4, dtype=torch.float32)
        pinned = host.pin_memory()
        small = torch.empty(n // 4, dtype=torch.float32, device=dev)
        out["h2d_pinned_bytes_per_s"] = rate(lambda: small.copy_(pinned, non_blocking=True), n)
        out["h2d_pageable_bytes_per_s"] = rate(lambda: small.copy_(host), n)
    return out


def tf32_settings() -> dict:
    """The process's TF32 switches as torch reports them (torch >= 2.9's ``fp32_precision`` and the legacy
    ``allow_tf32`` flags; a flag torch refuses to read, after a mix of the two APIs, is given as the error)."""
    out = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    cudnn_conv = getattr(torch.backends.cudnn, "conv", None)
    for name, obj, attr in (("cuda_matmul_fp32_precision", torch.backends.cuda.matmul, "fp32_precision"),
                            ("cudnn_conv_fp32_precision", cudnn_conv, "fp32_precision"),
                            ("cuda_matmul_allow_tf32", torch.backends.cuda.matmul, "allow_tf32"),
                            ("cudnn_allow_tf32", torch.backends.cudnn, "allow_tf32")):
        try:
            value = getattr(obj, attr)
            out[name] = value if isinstance(value, (bool, str)) else str(value)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            out[name] = f"unreadable: {str(exc)[:120]}"
    return out


def write_json(path: str | os.PathLike | None, result: dict) -> None:
    """Write ``result`` as one JSON object to ``path`` (nothing when ``path`` is None); non-finite floats
    are written as null, so that the file is strict JSON."""
    if path is None:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(_finite(result), indent=1) + "\n")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
