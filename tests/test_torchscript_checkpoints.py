"""OpenAI-format CLIP files load without TorchScript where they can: a state dict is read with
``torch.load(weights_only=True)`` and ``torch.jit.load`` is never called for it; a TorchScript archive
(OpenAI's released ``ViT-B-32.pt`` files are traced archives) falls back to ``torch.jit.load`` with its
deprecation visible and a warning saying how to convert the file once. Cost: a tiny CLIP traced once
(about 2 s)."""

from __future__ import annotations

import warnings

import pytest
import torch

from capreward.backbones import CLIPBackbone, ModelLoadError, load_clip
from capreward.backbones.clip_loading import TorchScriptCheckpointWarning, read_openai_state_dict
from capreward.testing import openai_state_dict, tiny_clip_factory


def test_a_state_dict_is_read_without_torchscript(tiny_clip_path, monkeypatch):
    def no_jit(*args, **kwargs):
        raise AssertionError("torch.jit.load was called for a plain state dict")

    monkeypatch.setattr(torch.jit, "load", no_jit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation, no fallback warning
        model, _, _ = load_clip(str(tiny_clip_path))
    expected = openai_state_dict(tiny_clip_factory(0)()[0])
    assert torch.equal(model.state_dict()["text_projection"], expected["text_projection"])


@pytest.fixture(scope="module")
def traced_archive(tmp_path_factory):
    """The tiny CLIP as a traced TorchScript archive, as OpenAI released theirs."""
    model = tiny_clip_factory(0)()[0].eval()
    size = model.visual.image_size
    size = size if isinstance(size, int) else size[0]
    image, text = torch.rand(1, 3, size, size), torch.randint(1, 100, (1, model.context_length))
    path = tmp_path_factory.mktemp("jit") / "ViT-tiny.pt"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracing's own notices
        torch.jit.save(torch.jit.trace(model, (image, text), check_trace=False), str(path))
    return path


def test_a_torchscript_archive_falls_back_with_the_deprecation_visible(traced_archive, tiny_clip_path):
    with pytest.warns(TorchScriptCheckpointWarning, match=r"TorchScript archive.*torch.save\(torch.jit.load"):
        backbone = CLIPBackbone(str(traced_archive))
    plain = CLIPBackbone(str(tiny_clip_path))
    batch = plain.tokenize(["a red image", "a dog runs"])
    pixels = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(backbone.encode_text(batch.ids, batch.lengths).tokens,
                          plain.encode_text(batch.ids, batch.lengths).tokens, atol=1e-6)
    assert torch.allclose(backbone.encode_pixels(pixels), plain.encode_pixels(pixels), atol=1e-6)


def test_the_conversion_the_warning_gives_loads_without_torchscript(traced_archive, tmp_path):
    with pytest.warns(TorchScriptCheckpointWarning):
        state = read_openai_state_dict(traced_archive)
    converted = tmp_path / "clip_state_dict.pt"
    torch.save(torch.jit.load(str(traced_archive)).state_dict(), converted)  # what the warning says to run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = read_openai_state_dict(converted)
    assert state.keys() == again.keys() and all(torch.equal(state[k], again[k]) for k in state)


def test_a_file_that_is_neither_names_the_plain_reading_error(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ModelLoadError, match="cannot read CLIP checkpoint"):
        read_openai_state_dict(junk)
