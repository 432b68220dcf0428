"""Loading a local VLM judge (a transformers LLaVA and its processor) by name or directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

DEFAULT_LLAVA = "llava-hf/llava-1.5-13b-hf"

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


class JudgeLoadError(OSError):
    """The judge model or its processor could not be loaded; the message says how to point at a local copy."""


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A torch floating dtype from a name ("float32", "fp16", "bfloat16", ...) or a dtype.

    None picks float16 on CUDA and float32 elsewhere.
    """
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point type, got {dtype}")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(set(_DTYPES))}")
    return _DTYPES[key]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A torch device; None picks CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or os.sep + os.sep in name or name.count("/") > 1


def load_llava(
    name_or_path: str | os.PathLike,
    *,
    dtype: torch.dtype,
    device: torch.device,
    local_files_only: bool | None = None,
    attn_implementation: str | None = None,
) -> tuple[Any, Any]:
    """Load ``LlavaForConditionalGeneration`` and ``AutoProcessor`` from a hub name or a local directory.

    Returns ``(model, processor)`` with the model in eval mode on ``device`` in ``dtype`` and its weights
    frozen. Raises :class:`JudgeLoadError` with instructions when the files cannot be found or fetched.
    """
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if _looks_like_path(name) and not path.is_dir():
        raise JudgeLoadError(
            f"judge model directory {str(path)!r} does not exist; pass the directory that holds the model's "
            "config.json, weights and processor files (as written by save_pretrained or `hf download`)"
        )
    source = str(path) if path.is_dir() else name
    kwargs: dict[str, Any] = {}
    if local_files_only is not None:
        kwargs["local_files_only"] = local_files_only
    try:
        processor = AutoProcessor.from_pretrained(source, **kwargs)
        model_kwargs = dict(kwargs, dtype=dtype)
        if attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        model = LlavaForConditionalGeneration.from_pretrained(source, **model_kwargs)
    except (OSError, ValueError) as exc:
        where = "the directory" if path.is_dir() else "the Hugging Face hub or the local cache"
        raise JudgeLoadError(
            f"could not load the LLaVA judge {name!r} from {where}: {exc}\n"
            "Without network access, download the model on a machine that has it, e.g. "
            f"`hf download {name} --local-dir /models/{Path(name).name}`, copy that directory here and pass "
            f"its path: FLEUR(model='/models/{Path(name).name}'). A populated Hugging Face cache also works "
            "(set HF_HOME and HF_HUB_OFFLINE=1)."
        ) from exc
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model, processor
