"""Resolve a CLIP model specification into ``(model, preprocess, tokenizer)``.

Accepted specifications (``model=`` of every CLIP-based scorer):

- ``"ViT-B-32/openai"``: an open_clip architecture name and pretrained tag (downloaded or taken from
  the local cache by open_clip). ``"ViT-B-32//abs/path/epoch_10.pt"`` or ``"ViT-B-32/ckpt.pt"``: the
  architecture with a local open_clip checkpoint.
- ``"hf-hub:org/repo"`` and ``"local-dir:/path"``: passed to open_clip as they are.
- a path to an OpenAI-format ``.pt`` file (a plain state dict such as PAC-S's ``clip_ViT-B-32.pth``, or
  a TorchScript archive such as OpenAI's ``ViT-B-32.pt``): the architecture is inferred from the
  weights. The file is read as a state dict first (no TorchScript); an archive falls back to
  ``torch.jit.load``, which torch deprecates, with a :class:`TorchScriptCheckpointWarning` saying how to
  convert it once.
  Long-CLIP checkpoints in their released layout (``longclip-B.pt``: 248 positions, with
  ``positional_embedding_res`` and, in some files, ``mask1``/``mask2``) load the same way
  (:func:`merge_long_clip_positions`), with a 248-token context.
- a transformers model (``"transformers:NAME"``, a transformers directory, a ``(model, processor)``
  pair): see :mod:`capreward.backbones.hf_clip` (:class:`~capreward.backbones.CLIPBackbone` builds it).
- a path to a directory: treated as ``local-dir:``.
- a zero-argument callable returning ``(model, preprocess, tokenizer)``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any
from collections.abc import Callable

import torch

from ..errors import CaprewardError

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")

OFFLINE_HINT = (
    "If the weights cannot be downloaded on this machine, point model= at a local file instead: an "
    "OpenAI-format state dict (e.g. model='/models/ViT-B-32.pt'), an open_clip checkpoint with its "
    "architecture (model='ViT-B-32//models/open_clip_epoch_32.pt'), a local open_clip directory "
    "(model='local-dir:/models/clip'), or a factory returning (model, preprocess, tokenizer)."
)
#: What a local CLIP may be, for a path that is none of them (the hub was not asked).
LOCAL_HINT = (
    "a local CLIP is an OpenAI-format state dict (model='/models/ViT-B-32.pt'), an open_clip checkpoint with its "
    "architecture (model='ViT-B-32//models/open_clip_epoch_32.pt'), an open_clip folder holding "
    "open_clip_config.json (model='local-dir:/models/clip') or a transformers CLIP folder holding config.json"
)


class ModelLoadError(CaprewardError, RuntimeError):
    """A CLIP model could not be loaded; the message says how to point at a local file.

    Args:
        message: the whole message, hint included.
        spec: the model specification that failed (None for a factory).
        summary: what went wrong in one line, without the hint (the command line prints it with a hint
            in flag terms); default: the message up to its hint.

    Examples:
        >>> from capreward.backbones import ModelLoadError, load_clip
        >>> try:
        ...     load_clip(lambda: "not a model")
        ... except ModelLoadError as exc:
        ...     print(exc.summary, isinstance(exc, RuntimeError))
        a model factory must return (model, preprocess, tokenizer) True
    """

    def __init__(self, message: str, spec: str | None = None, summary: str | None = None):
        super().__init__(message)
        self.spec = spec
        self.summary = summary or message.split(". If the weights")[0]


def precision_for(device: str | torch.device, precision: str | None) -> str:
    """open_clip precision string: fp32 on CPU unless asked otherwise, fp32 by default elsewhere too."""
    if precision is None:
        return "fp32"
    allowed = {"fp32", "fp16", "bf16", "pure_fp16", "pure_bf16"}
    if precision not in allowed:
        raise ValueError(f"precision must be one of {sorted(allowed)}, got {precision!r}")
    if torch.device(device).type == "cpu" and precision in {"fp16", "pure_fp16"}:
        raise ValueError("fp16 is not supported on CPU; use fp32 or bf16")
    return precision


def _unwrap_state_dict(obj: Any) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ModelLoadError(f"expected a state dict, got {type(obj).__name__}")
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return obj


#: Long-CLIP keeps CLIP's first 20 positions (``mask1``) and uses its stretched ones after them (``mask2``).
LONG_CLIP_KEPT_POSITIONS = 20


def merge_long_clip_positions(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Long-CLIP state dict (beichenzbc/Long-CLIP, ``model_longclip.py``) in OpenAI's layout.

    Long-CLIP's ``encode_text`` adds ``positional_embedding * mask1 + positional_embedding_res * mask2``
    to the token embeddings, ``mask1`` being 1 on the first :data:`LONG_CLIP_KEPT_POSITIONS` positions and
    ``mask2`` its complement (taken from the file when it holds them). That sum is one positional
    embedding, so the model is an OpenAI CLIP with it (exactly: each position takes one of the two).
    A state dict without ``positional_embedding_res`` is returned unchanged."""
    if "positional_embedding_res" not in state:
        return state
    state = dict(state)
    pe, res = state["positional_embedding"], state.pop("positional_embedding_res")
    mask1, mask2 = state.pop("mask1", None), state.pop("mask2", None)
    if mask1 is None:
        mask1 = torch.zeros(pe.shape[0], 1)
        mask1[:LONG_CLIP_KEPT_POSITIONS] = 1
    if mask2 is None:
        mask2 = 1 - mask1
    if pe.shape != res.shape or mask1.shape[0] != pe.shape[0] or mask2.shape[0] != pe.shape[0]:
        raise ModelLoadError(f"Long-CLIP positions do not match: positional_embedding {tuple(pe.shape)}, "
                             f"positional_embedding_res {tuple(res.shape)}, mask1 {tuple(mask1.shape)}, mask2 {tuple(mask2.shape)}")
    state["positional_embedding"] = (pe.float() * mask1.float() + res.float() * mask2.float()).to(pe.dtype)
    return state


class TorchScriptCheckpointWarning(FutureWarning):
    """A CLIP checkpoint was read as a TorchScript archive (``torch.jit.load``, which torch deprecates):
    the warning says how to convert the file once into a state dict that loads without TorchScript."""


def _is_torchscript_archive(path: str) -> bool:
    """Whether ``path`` is a TorchScript archive: a zip file with a ``constants.pkl`` record (torch's
    own test), which a plain ``torch.save`` file never has."""
    import zipfile

    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            return any(name.rsplit("/", 1)[-1] == "constants.pkl" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def read_openai_state_dict(path: str | os.PathLike) -> dict:
    """The weights of an OpenAI-format CLIP file: a plain state dict is read with ``torch.load`` and
    ``weights_only=True`` (no code runs, no TorchScript); only a TorchScript archive (OpenAI's released
    ``ViT-B-32.pt`` files are traced archives) is read with ``torch.jit.load``, whose deprecation stays
    visible, with a :class:`TorchScriptCheckpointWarning` saying how to convert the file once.

    Args:
        path: the ``.pt``/``.pth`` file.

    Returns:
        Its state dict (possibly still wrapped, see :func:`_unwrap_state_dict`).

    Raises:
        ModelLoadError: the file is neither.
    """
    path = os.fspath(path)
    if not _is_torchscript_archive(path):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - not a checkpoint at all
            raise ModelLoadError(f"cannot read CLIP checkpoint {path!r}: {exc}", spec=path) from exc
    try:
        state = torch.jit.load(path, map_location="cpu").state_dict()
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot read CLIP checkpoint {path!r} (a TorchScript archive): {exc}", spec=path) from exc
    warnings.warn(
        f"{path} is a TorchScript archive, read with torch.jit.load, which torch deprecates; convert it once "
        f"to a state dict that loads without TorchScript: torch.save(torch.jit.load({path!r}).state_dict(), "
        "'clip_state_dict.pt')", TorchScriptCheckpointWarning, stacklevel=3)
    return state


def load_openai_format(path: str | os.PathLike, device: str | torch.device, precision: str):
    """Load an OpenAI-format CLIP file (state dict, or TorchScript archive: :func:`read_openai_state_dict`);
    architecture inferred from weights."""
    import open_clip
    from open_clip.model import build_model_from_openai_state_dict, convert_weights_to_lp, get_cast_dtype

    path = os.fspath(path)
    state = merge_long_clip_positions(_unwrap_state_dict(read_openai_state_dict(path)))
    if "text_projection" not in state or "token_embedding.weight" not in state:
        raise ModelLoadError(
            f"{path!r} is not an OpenAI-format CLIP state dict (no text_projection/token_embedding); "
            "for an open_clip checkpoint pass model='ARCH//path/to/checkpoint.pt'", spec=path
        )
    # not weights: OpenAI's archive constants, and the causal mask open_clip keeps as a buffer (a traced open_clip
    # model's archive holds it)
    state = {k: v for k, v in state.items() if k not in ("input_resolution", "context_length", "vocab_size", "attn_mask")}
    model = build_model_from_openai_state_dict(dict(state), cast_dtype=get_cast_dtype(precision))
    model = model.to(device)
    model.float()
    if precision in ("bf16", "pure_bf16"):
        convert_weights_to_lp(model, dtype=torch.bfloat16)
    elif precision in ("fp16", "pure_fp16"):
        convert_weights_to_lp(model, dtype=torch.float16)
    model.visual.image_mean = open_clip.OPENAI_DATASET_MEAN
    model.visual.image_std = open_clip.OPENAI_DATASET_STD
    preprocess = open_clip.image_transform(model.visual.image_size, is_train=False)
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=model.context_length)
    return model.eval(), preprocess, tokenizer


def split_name_and_pretrained(spec: str) -> tuple[str, str | None]:
    """``"ViT-B-32/openai"`` → ``("ViT-B-32", "openai")``; a bare name → ``(name, None)``."""
    if spec.startswith(("hf-hub:", "local-dir:")):
        return spec, None
    name, sep, pretrained = spec.partition("/")
    return name, (pretrained if sep else None)


def check_open_clip_name(name: str, pretrained: str | None) -> None:
    """Raise :class:`ModelLoadError` for an architecture or pretrained tag open_clip does not know (a
    tag may also be a checkpoint path)."""
    import open_clip

    if name.startswith(("hf-hub:", "local-dir:")):
        return
    if name not in open_clip.list_models():
        raise ModelLoadError(f"unknown CLIP architecture {name!r}; open_clip knows e.g. ViT-B-32, ViT-L-14, RN50 "
                             f"(open_clip.list_models() lists all). {OFFLINE_HINT}", spec=name)
    tags = open_clip.list_pretrained_tags_by_model(name)
    if pretrained is not None and pretrained not in tags and not os.path.exists(pretrained):
        spec = f"{name}/{pretrained}"
        raise ModelLoadError(f"{spec!r}: {name} has no pretrained tag or checkpoint file {pretrained!r}; "
                             f"tags: {', '.join(tags) or 'none'}. {OFFLINE_HINT}", spec=spec)


def load_open_clip(spec: str, device: str | torch.device, precision: str):
    """Load an open_clip model by name (+ pretrained tag or checkpoint path).

    Weights are taken from the local cache when they are there; a download is tried only when the hub
    answers (see :func:`capreward.hub.load_cached_first`), so a missing model fails within seconds.
    """
    import open_clip

    from ..hub import ModelNotAvailable, NotAModel, cache_only, load_cached_first, quiet_root_logging

    name, pretrained = split_name_and_pretrained(spec)
    if pretrained is None and not spec.startswith(("hf-hub:", "local-dir:")):
        raise ModelLoadError(
            f"model={spec!r} names an architecture without weights; use 'NAME/TAG' such as "
            f"'{name}/openai', or 'NAME/random' for randomly initialised weights. {OFFLINE_HINT}", spec=spec,
            summary=f"{spec!r} names an architecture without weights (use NAME/TAG such as {name}/openai)",
        )
    if pretrained == "random":
        pretrained = None
    check_open_clip_name(name, pretrained)

    def create(local_only: bool):
        with quiet_root_logging("open_clip"), cache_only() if local_only else contextlib.nullcontext():
            model, _, preprocess = open_clip.create_model_and_transforms(
                name, pretrained=pretrained, device=device, precision=precision
            )
            return model, preprocess, open_clip.get_tokenizer(name)

    try:
        model, preprocess, tokenizer = load_cached_first(
            create, f"CLIP model {spec!r}", source=spec if spec.startswith("local-dir:") else None)
    except NotAModel as exc:  # a folder on this machine: the hub was not asked
        raise ModelLoadError(f"{exc}; {LOCAL_HINT}", spec=spec, summary=str(exc)) from exc
    except ModelNotAvailable as exc:
        raise ModelLoadError(f"{exc}. {OFFLINE_HINT}", spec=spec, summary=str(exc)) from exc
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"cannot load CLIP model {spec!r}: {exc}. {OFFLINE_HINT}", spec=spec,
                             summary=f"cannot load CLIP model {spec!r}: {first}") from exc
    return model.eval(), preprocess, tokenizer


def load_clip(model: str | os.PathLike | Callable[[], tuple], device: str | torch.device = "cpu",
              precision: str | None = None) -> tuple[Any, Any, Any]:
    """Load a CLIP model from any accepted specification (see the module's documentation).

    Args:
        model: an open_clip name or ``name:pretrained`` tag, an OpenAI-format ``.pt`` path, a local
            checkpoint or folder, or a zero-argument factory returning ``(model, preprocess, tokenizer)``.
        device: where the model goes.
        precision: open_clip precision (``"fp32"``, the default, ``"fp16"``, ``"bf16"``...).

    Returns:
        ``(model, preprocess, tokenizer)``, the model in eval mode.

    Raises:
        ModelLoadError: the model cannot be loaded; the message says how to point at a local file.
    """
    from ..progress import status

    precision = precision_for(device, precision)
    what = "CLIP factory" if callable(model) and not isinstance(model, (str, os.PathLike)) else os.fspath(model)
    with status(f"loading CLIP {what}"):
        return _load_clip(model, device, precision)


def _load_clip(model, device, precision: str):
    if callable(model) and not isinstance(model, (str, os.PathLike)):
        loaded = model()
        if not (isinstance(loaded, tuple) and len(loaded) == 3):
            raise ModelLoadError("a model factory must return (model, preprocess, tokenizer)")
        clip_model, preprocess, tokenizer = loaded
        clip_model = clip_model.to(device).eval()
        if precision in ("bf16", "pure_bf16"):
            clip_model = clip_model.to(torch.bfloat16)
        elif precision in ("fp16", "pure_fp16"):
            clip_model = clip_model.to(torch.float16)
        return clip_model, preprocess, tokenizer
    spec = os.fspath(model)
    path = Path(spec)
    if path.is_file():
        return load_openai_format(path, device, precision)
    if path.is_dir():
        return load_open_clip(f"local-dir:{path}", device, precision)
    bare_file = split_name_and_pretrained(spec)[1] is None and spec.endswith(CHECKPOINT_SUFFIXES)
    if spec.startswith(("/", "./", "../", "~")) or bare_file:
        raise ModelLoadError(f"CLIP checkpoint {spec!r} does not exist. {OFFLINE_HINT}", spec=spec,
                             summary=f"CLIP checkpoint {spec!r} does not exist")
    return load_open_clip(spec, device, precision)
