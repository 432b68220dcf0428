"""Trained fixtures written in a layout every supported transformers version reads.

A trained tiny judge is cached once per key (:mod:`capreward.testing.cache`), and the key does not hold
the transformers version: the version matrix's oldest end (transformers 4.57) reads the judges the suite
trained under the newest (5.x), rather than training its own. transformers 5 writes three things 4.57
cannot read, so :func:`save_portable` writes what 4.57 writes instead, which 5.x reads too:

- ``tokenizer_config.json``: the class ``TokenizersBackend`` (new in 5.0) becomes ``PreTrainedTokenizerFast``,
  the same fast tokenizer under its older name;
- ``extra_special_tokens``: a list (5.x) becomes a mapping (4.57 calls ``.keys()`` on it);
- ``model.safetensors``: 5.x writes a LLaVA's CLIP vision tower without its ``vision_model.`` level
  (``vision_tower.encoder...``); 4.57's tower has that level, and finding no weight under it would start
  the tower from random weights with only a warning. The keys get the level back; 5.x maps it away on load.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

#: Bumped when the layout written here changes (part of the fixture keys that use it).
PORTABLE_LAYOUT = 1

_VISION_KEY = re.compile(r"^((?:model\.)?vision_tower\.)(?!vision_model\.)")


def save_portable(model: Any, processor: Any, directory: str | os.PathLike) -> Path:
    """``save_pretrained`` of ``model`` and ``processor`` (or tokenizer) into ``directory``, then
    :func:`make_portable` on it.

    Args:
        model: a transformers model.
        processor: its processor or tokenizer.
        directory: where to write (created if missing).

    Returns:
        The directory.
    """
    directory = Path(directory)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    make_portable(directory)
    return directory


def make_portable(directory: str | os.PathLike) -> list[str]:
    """Rewrite a ``save_pretrained`` directory in place into the layout transformers 4.57 writes (see the
    module docstring); a directory already in it is left as it is.

    Args:
        directory: the directory.

    Returns:
        What was changed, one phrase each (empty when nothing was).
    """
    directory = Path(directory)
    changed = _portable_tokenizer_config(directory / "tokenizer_config.json")
    config = directory / "config.json"
    weights = directory / "model.safetensors"
    if config.exists() and weights.exists():
        vision = json.loads(config.read_text(encoding="utf-8")).get("vision_config") or {}
        if vision.get("model_type") == "clip_vision_model":
            changed += _portable_vision_keys(weights)
    return changed


def _portable_tokenizer_config(path: Path) -> list[str]:
    if not path.exists():
        return []
    config = json.loads(path.read_text(encoding="utf-8"))
    changed = []
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        changed.append("tokenizer class")
    extra = config.get("extra_special_tokens")
    if isinstance(extra, list):
        named = {name: config[name] for name in extra if isinstance(name, str) and isinstance(config.get(name), str)}
        if len(named) != len(extra):
            raise ValueError(f"{path}: extra_special_tokens {extra!r} are not all named tokens of the config")
        config["extra_special_tokens"] = named
        changed.append("extra special tokens")
    if changed:
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


def _portable_vision_keys(path: Path) -> list[str]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        keys = list(handle.keys())
        if not any(_VISION_KEY.match(k) for k in keys):
            return []
        tensors = {_VISION_KEY.sub(r"\1vision_model.", k): handle.get_tensor(k) for k in keys}
    tmp = path.with_name(path.name + ".portable")
    save_file(tensors, str(tmp), metadata={**metadata, "format": metadata.get("format", "pt")})
    os.replace(tmp, path)
    return ["vision tower keys"]


__all__ = ["PORTABLE_LAYOUT", "make_portable", "save_portable"]
