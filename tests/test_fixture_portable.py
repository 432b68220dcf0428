"""Trained fixtures are written in a layout every supported transformers version reads
(:mod:`capreward.testing.portable`), so the version matrix's oldest end reads the judges the suite trained
under the newest. Integration tests: the matrix runs this file at the oldest end, where the second test
loads a judge that the suite (under the newest transformers) trained into the shared cache."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from capreward.testing.portable import make_portable, save_portable
from capreward.testing.tiny_llava import TinyLlavaSpec, build_tiny_llava, tiny_judge_dir

pytestmark = pytest.mark.integration

TEXT = "a red ball on the photo of a green wall"


def load_checked(directory):
    """The LLaVA in ``directory`` with the loader's report: no weight missing (started at random), none left over."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model, info = LlavaForConditionalGeneration.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model, AutoProcessor.from_pretrained(directory)


def test_a_saved_tiny_llava_loads_every_weight_and_tokenizes_the_same(tmp_path):
    model, processor = build_tiny_llava(TinyLlavaSpec(text_layers=1, vision_layers=1, seed=3))
    save_portable(model, processor, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] != "TokenizersBackend" and not isinstance(config.get("extra_special_tokens"), list)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        vision = [k for k in handle.keys() if "vision_tower." in k]
    assert vision and all("vision_tower.vision_model." in k for k in vision)
    assert make_portable(tmp_path) == []  # already portable: nothing rewritten

    loaded, loaded_processor = load_checked(tmp_path)
    original = model.state_dict()
    assert set(loaded.state_dict()) == set(original)
    assert all(torch.equal(v, original[k]) for k, v in loaded.state_dict().items())
    assert loaded_processor.tokenizer(TEXT)["input_ids"] == processor.tokenizer(TEXT)["input_ids"]


def test_the_layout_of_transformers_5_becomes_the_older_one(tmp_path):
    """What transformers 5 writes (whichever version runs this test): the three differences rewritten."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "TokenizersBackend", "extra_special_tokens": ["image_token"], "image_token": "<image>"}))
    assert make_portable(tmp_path) == ["tokenizer class", "extra special tokens"]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["extra_special_tokens"] == {"image_token": "<image>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"extra_special_tokens": ["<odd>"]}))
    with pytest.raises(ValueError, match="not all named tokens"):
        make_portable(tmp_path)


def test_the_suites_fleur_judge_loads_here_with_every_weight():
    """The cached FLEUR judge (at the matrix's oldest end: trained by the suite under the newest
    transformers) loads with every weight of its file, none started at random."""
    directory = tiny_judge_dir()
    model, processor = load_checked(directory)
    state = model.state_dict()
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        stored = {k: handle.get_tensor(k) for k in handle.keys()}
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for tensor in state.values():
        by_shape.setdefault(tuple(tensor.shape), []).append(tensor)
    assert len(stored) == len(state)
    for key, tensor in stored.items():  # key names differ between versions; every stored tensor is one loaded
        assert any(torch.equal(tensor, t) for t in by_shape.get(tuple(tensor.shape), [])), key
    assert processor.tokenizer.decode(processor.tokenizer(TEXT)["input_ids"], skip_special_tokens=True) == TEXT
