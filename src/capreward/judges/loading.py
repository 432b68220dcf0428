"""Loading a local VLM judge (a transformers image-text model and its processor) by name or directory.

The model class follows the checkpoint's ``config.json`` (``model_type``): ``llava`` is loaded as
``LlavaForConditionalGeneration`` (LLaVA-1.5, as released), every other type through
``AutoModelForImageTextToText`` (Qwen2-VL's ``Qwen2VLForConditionalGeneration``, ...); the judge then
runs it as its family (:mod:`capreward.judges.families`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..errors import CaprewardError

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


class JudgeLoadError(CaprewardError, OSError):
    """The judge model or its processor could not be loaded; the message says how to point at a local copy.

    Args:
        message: the whole message, hint included.
        spec: the name or path that failed.
        summary: what went wrong in one line, without the hint (the command line prints it with a hint
            in flag terms); default: the message's first line.

    Examples:
        >>> from capreward.judges import JudgeLoadError
        >>> exc = JudgeLoadError("no model at 'x'", spec="x")
        >>> exc.summary, isinstance(exc, OSError)
        ("no model at 'x'", True)
    """

    def __init__(self, message: str, spec: str | None = None, summary: str | None = None):
        super().__init__(message)
        self.spec = spec
        self.summary = summary or message.splitlines()[0]


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
    """A torch device; None picks CUDA when available, else CPU. (Whether the machine has it is checked
    where a model is put on it: :func:`capreward.devices.checked_device`.)"""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or os.sep + os.sep in name or name.count("/") > 1


def _is_clip_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds CLIP weights: an OpenAI-format state dict (``visual.*`` and
    ``token_embedding.weight``), open_clip's (the same under ``state_dict``) or a TorchScript CLIP archive."""
    import zipfile

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - TorchScript archives and other files: look inside the zip
        try:
            with zipfile.ZipFile(path) as archive:
                return any(n.endswith("code/__torch__/clip/model.py") or "/code/__torch__/model" in n
                           for n in archive.namelist())
        except (OSError, zipfile.BadZipFile):
            return False
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        return False
    keys = [k.removeprefix("module.") for k in state if isinstance(k, str)]
    return any(k.startswith("visual.") for k in keys) and "token_embedding.weight" in keys


def load_llava(
    name_or_path: str | os.PathLike,
    *,
    dtype: torch.dtype,
    device: torch.device,
    local_files_only: bool | None = None,
    attn_implementation: str | None = None,
) -> tuple[Any, Any]:
    """Load the judge model and ``AutoProcessor`` from a hub name or a local directory: a ``llava``
    checkpoint as ``LlavaForConditionalGeneration``, any other ``model_type`` (read from its config.json)
    through ``AutoModelForImageTextToText``.

    Returns ``(model, processor)`` with the model in eval mode on ``device`` in ``dtype`` and its weights
    frozen. ``local_files_only``: True reads the local cache only; False lets transformers download;
    None (default) reads the cache first and downloads only when the hub answers (a missing model fails
    within seconds instead of after transformers' retries). Raises :class:`JudgeLoadError` with
    instructions when the files cannot be found or fetched.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, LlavaForConditionalGeneration

    from ..hub import ModelNotAvailable, load_cached_first
    from ..progress import status

    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_file():
        what = "a CLIP checkpoint" if _is_clip_checkpoint(path) else "a single file"
        raise JudgeLoadError(
            f"judge model {str(path)!r} is {what}, not a judge model directory; "
            + ("CLIP weights go to --clip-model (model= of the CLIP-based scorers); " if what != "a single file" else "")
            + "the judge needs the directory that holds a LLaVA model's config.json, weights and processor files",
            spec=name, summary=f"judge model {str(path)!r} is {what}, not a model directory",
        )
    if _looks_like_path(name) and not path.is_dir():
        raise JudgeLoadError(
            f"judge model directory {str(path)!r} does not exist; pass the directory that holds the model's "
            "config.json, weights and processor files (as written by save_pretrained or `hf download`)",
            spec=name, summary=f"judge model directory {str(path)!r} does not exist",
        )
    source = str(path) if path.is_dir() else name

    from ..hub import remote_code_problem

    if path.is_dir() and (problem := remote_code_problem(path)) is not None:
        raise JudgeLoadError(f"judge model directory {str(path)!r} is refused: {problem}", spec=name,
                             summary=f"judge model directory {str(path)!r} is refused: {problem}")

    def load(local_only: bool):
        # trust_remote_code=False: a model folder's own code is never run, and transformers never asks
        kwargs: dict[str, Any] = {"local_files_only": local_only, "trust_remote_code": False}
        config = AutoConfig.from_pretrained(source, **kwargs)
        processor = AutoProcessor.from_pretrained(source, **kwargs)
        model_kwargs = dict(kwargs, dtype=dtype)
        if attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        model_class = LlavaForConditionalGeneration if config.model_type == "llava" else AutoModelForImageTextToText
        return model_class.from_pretrained(source, **model_kwargs), processor

    hint = (
        "Without network access, download the model on a machine that has it, e.g. "
        f"`hf download {name} --local-dir /models/{Path(name).name}`, copy that directory here and pass "
        f"its path: FLEUR(model='/models/{Path(name).name}'). A populated Hugging Face cache also works "
        "(set HF_HOME and HF_HUB_OFFLINE=1)."
    )
    try:
        with status(f"loading judge {name}"):
            if local_files_only is None and not path.is_dir():
                model, processor = load_cached_first(load, f"judge model {name!r}", failures=(OSError, ValueError))
            else:
                model, processor = load(bool(local_files_only) or path.is_dir())
    except ModelNotAvailable as exc:
        raise JudgeLoadError(f"{exc}\n{hint}", spec=name, summary=str(exc)) from exc
    except (OSError, ValueError) as exc:
        where = "the directory" if path.is_dir() else "the Hugging Face hub or the local cache"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise JudgeLoadError(f"could not load the LLaVA judge {name!r} from {where}: {exc}\n{hint}", spec=name,
                             summary=f"could not load the judge model {name!r} from {where}: {first}") from exc
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model, processor
