"""The environment of a benchmark run: device, versions, TF32 switches, measured matmul peaks and copy rates.

    python benchmarks/gpu_env.py --device cuda --json-out env.json

Peaks: fp32 with TF32 off (what capreward's fp32 means, see capreward.devices.strict_fp32) and on, fp16,
bf16 (and fp64); copy rates: device-to-device (read + written), host-to-device from pinned and pageable
memory. On the CPU the same at small sizes (fp16 is skipped there: the CPU has no fp16 matmul worth timing).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import DTYPES, copy_bandwidth, matmul_peak, tf32_settings, write_json  # noqa: E402

PACKAGES = ("torch", "transformers", "torchmetrics", "open_clip_torch", "ftfy", "trl", "datasets", "peft",
            "accelerate", "lightning", "numpy", "pillow", "av", "decord", "timm", "pyarrow", "fsspec",
            "huggingface_hub", "pytest", "hypothesis", "capreward",
            # the inference engines and attention kernels a device image may carry (issue #44)
            "vllm", "sglang", "flash_attn", "flash-attn", "flashinfer-python", "xformers")


def versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=float, default=1.0, help="per peak measurement")
    parser.add_argument("--json-out", help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    dev = torch.device(args.device)
    result: dict = {
        "device": str(dev),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_cuda": torch.version.cuda,
        "versions": versions(),
        "tf32_at_start": tf32_settings(),
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        result["gpu"] = {"name": props.name, "memory_gib": props.total_memory / 2**30,
                         "multiprocessors": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
                         "cudnn": torch.backends.cudnn.version()}
    peaks = {}
    from capreward.devices import strict_fp32

    with strict_fp32(args.device):  # capreward's fp32: IEEE, TF32 off
        result["tf32_inside_capreward_calls"] = tf32_settings()
        peaks["fp32"] = matmul_peak(args.device, torch.float32, args.seconds)
    if dev.type == "cuda":  # what TF32 would give fp32 matmuls
        matmul = torch.backends.cuda.matmul
        attr = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
        saved = getattr(matmul, attr)
        setattr(matmul, attr, "tf32" if attr == "fp32_precision" else True)
        try:
            peaks["tf32"] = matmul_peak(args.device, torch.float32, args.seconds)
        finally:
            setattr(matmul, attr, saved)
    for name in ("bf16", "fp16", "fp64") if dev.type == "cuda" else ("bf16",):
        peaks[name] = matmul_peak(args.device, DTYPES[name], args.seconds, n=4096 if name == "fp64" else None)
    result["matmul_peak_tflop_per_s"] = {k: v / 1e12 for k, v in peaks.items()}
    result["copy_gb_per_s"] = {k.removesuffix("_bytes_per_s"): v / 1e9 for k, v in copy_bandwidth(args.device).items()}
    print(f"device {dev}" + (f" ({result['gpu']['name']}, {result['gpu']['memory_gib']:.0f} GiB)" if "gpu" in result else ""))
    print("versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v))
    print("TF32 at start: " + ", ".join(f"{k}={v}" for k, v in result["tf32_at_start"].items()))
    print("matmul peaks (TFLOP/s): " + ", ".join(f"{k} {v:.2f}" for k, v in result["matmul_peak_tflop_per_s"].items()))
    print("copies (GB/s): " + ", ".join(f"{k} {v:.1f}" for k, v in result["copy_gb_per_s"].items()))
    write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
