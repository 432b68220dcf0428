"""torchmetrics' own CLIPScore tests, adapted to capreward's ``CLIPScoreMetric``.

Source read: ``tests/unittests/multimodal/test_clip_score.py`` of Lightning-AI/torchmetrics (commit
dab0333); the tests below follow its structure, written for capreward. What differs, and why:

- Models: torchmetrics runs three hub CLIPs (a name, LongCLIP, a custom ``(model, processor)``); nothing
  can be downloaded here, so the same roles are played by the colour-trained tiny CLIP given as an
  OpenAI-format ``.pt`` path and as a zero-argument factory (the custom-model route).
- Inputs: torchmetrics' random int64 0..254 images ``torch.randint(255, (2, 2, 3, 64, 64))`` score 0 on
  a tiny CLIP (negative cosines are clamped), which would make equality checks empty; the images here
  are the colour task's noisy colour images as int64 (3, 64, 64) tensors, batched the same way
  (2 batches of 2), so the scores are far from 0 and differ per sample.
- Argument order: capreward's metrics take ``(captions, images)``; torchmetrics' ``(images, captions)``
  is refused with a TypeError that says so (test_detect_modality's counterpart).
- Reference: torchmetrics compares with the HF model's forward; here the reference is open_clip's own
  model built from the same state dict, with open_clip's image transform, ``torchvision``'s
  ``to_pil_image`` and open_clip's tokenizer, and CLIP-S = 2.5 * max(cos, 0) (capreward's scale; the
  torchmetrics score is 100 * max(cos, 0)) over "A photo depicts " + caption.
- Float images are taken in [0, 1] (the scale of ``torchvision``'s ``to_tensor``); torchmetrics' module
  tests use ``torch.randn`` only for its shape helpers, so the shape tests below use ``torch.rand``.
- Not adapted: image-to-image and text-to-text scores (CLIP-S compares a caption with an image) and the
  HF-output dataclass test (a transformers detail capreward does not go through). The long-caption test
  checks capreward's report of truncation (the ``truncated`` column) instead of a warning.
"""

from __future__ import annotations

import pickle
from functools import lru_cache

import numpy as np
import pytest
import torch

from capreward import CLIPScore
from capreward.torchmetrics import CLIPScoreMetric
from capreward.testing.trained_clip import TrainedClipFactory, colour_image, trained_clip_path

COLOURS = ["red", "green", "blue", "yellow"]
CAPTIONS = [["a red image.", "a green picture."], ["a red photo.", "a yellow image."]]  # [batch][sample]
PREFIX = "A photo depicts "
W = 2.5


def _image_tensor(colour: str, seed: int) -> torch.Tensor:
    import random

    array = np.array(colour_image(colour, random.Random(seed), size=(64, 64)))
    return torch.from_numpy(array).permute(2, 0, 1).to(torch.int64)  # int64 0..255, (3, 64, 64)


IMAGES = torch.stack([torch.stack([_image_tensor(COLOURS[2 * b + i], 10 * b + i) for i in range(2)]) for b in range(2)])
assert IMAGES.shape == (2, 2, 3, 64, 64) and IMAGES.dtype == torch.int64


def model_spec(kind: str):
    if kind == "path":
        return str(trained_clip_path())
    return TrainedClipFactory()


@lru_cache(maxsize=1)
def _reference_model():
    import open_clip
    from open_clip.transform import image_transform

    model = open_clip.load_openai_model(str(trained_clip_path()), device="cpu").eval()
    return model, image_transform(model.visual.image_size, is_train=False)


def reference_clip_score(images, captions: list[str]) -> torch.Tensor:
    """Per-sample CLIP-S by open_clip's own model, transform and tokenizer (no capreward code)."""
    import open_clip
    from torchvision.transforms.functional import to_pil_image

    model, preprocess = _reference_model()
    pil = [to_pil_image(img.to(torch.uint8)) if not img.is_floating_point() else to_pil_image(img) for img in images]
    with torch.no_grad():
        iv = model.encode_image(torch.stack([preprocess(p) for p in pil])).double()
        tv = model.encode_text(open_clip.tokenize([PREFIX + c for c in captions], context_length=model.context_length)).double()
    cos = (iv / iv.norm(dim=-1, keepdim=True) * (tv / tv.norm(dim=-1, keepdim=True))).sum(-1)
    return W * cos.clamp(min=0)


@pytest.fixture(scope="module")
def reference_all() -> torch.Tensor:
    return reference_clip_score(list(IMAGES.flatten(0, 1)), [c for batch in CAPTIONS for c in batch])


MODELS = ["path", "factory"]


@pytest.mark.parametrize("model", MODELS)
class TestCLIPScore:
    """TestCLIPScore of torchmetrics, one test per method there (DDP for one model, as a real 2-process run)."""

    def test_clip_score(self, model, reference_all):
        """The class metric: each forward() equals the reference on its batch, compute() on all batches;
        the metric pickles."""
        metric = CLIPScoreMetric(model_spec(model))
        assert reference_all.min() < 0.5 * W and reference_all.max() > 0.8 * W  # scores that differ
        for b in range(2):
            batch_value = metric(CAPTIONS[b], IMAGES[b])
            assert float(batch_value) == pytest.approx(float(reference_all[2 * b : 2 * b + 2].mean()), abs=1e-5)
        assert float(metric.compute()) == pytest.approx(float(reference_all.mean()), abs=1e-5)
        clone = pickle.loads(pickle.dumps(metric))
        assert float(clone.compute()) == pytest.approx(float(reference_all.mean()), abs=1e-5)

    def test_clip_score_functional(self, model, reference_all):
        """The functional form (the scorer) on the int64 tensors equals the reference per sample."""
        scorer = CLIPScore(model_spec(model))
        for b in range(2):
            result = scorer.score(CAPTIONS[b], images=IMAGES[b])
            torch.testing.assert_close(result.clip_s.double(), reference_all[2 * b : 2 * b + 2], atol=1e-5, rtol=0)

    def test_clip_score_differentiability(self, model):
        """``is_differentiable`` is False and the value carries no graph, even from an image that requires grad."""
        metric = CLIPScoreMetric(model_spec(model))
        assert metric.is_differentiable is False
        images = (IMAGES[0].float() / 255).requires_grad_(True)
        value = metric(CAPTIONS[0], images)
        assert not value.requires_grad and value.grad_fn is None

    def test_error_on_not_same_amount_of_input(self, model):
        metric = CLIPScoreMetric(model_spec(model))
        with pytest.raises(ValueError, match="2 entries for 1 captions"):
            metric(["a red image."], torch.randint(255, (2, 3, 64, 64)))
        with pytest.raises(ValueError, match="2 entries for 1 captions"):
            metric("a red image.", torch.randint(255, (2, 3, 64, 64)))  # one str is one caption, as in torchmetrics

    def test_error_on_wrong_image_format(self, model):
        metric = CLIPScoreMetric(model_spec(model))
        with pytest.raises(ValueError, match=r"expected one image of shape \(3, H, W\) or \(H, W, 3\)"):
            metric("a red image.", torch.randint(255, (64, 64)))

    def test_plot_method(self, model):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        metric = CLIPScoreMetric(model_spec(model))
        metric.update(CAPTIONS[0], IMAGES[0])
        fig, ax = metric.plot()
        assert isinstance(fig, plt.Figure)
        assert isinstance(ax, matplotlib.axes.Axes)
        plt.close(fig)

    def test_long_caption_is_read_whole_or_truncated_and_reported(self, model, reference_all):
        """torchmetrics warns and truncates a caption over 77 tokens; capreward reads it whole by default
        (sentence windows, nothing cut) or, with a scorer built with ``long_captions="truncate"``, cuts it
        keeping EOS and counts it in the ``truncated`` column; the other sample's score is unchanged."""
        long = "A 28-year-old chef who recently moved to San Francisco was found dead. " * 100
        scores = []
        for options, cut in (({}, 0.0), ({"long_captions": "truncate"}, 1.0)):
            metric = CLIPScoreMetric(scorer=CLIPScore(model_spec(model), **options), sub_scores=True, per_sample=True)
            metric.update([CAPTIONS[0][0], long], IMAGES[0])
            out = metric.compute()
            assert out["per_sample/truncated"].tolist() == [0.0, cut]
            assert float(out["per_sample/score"][0]) == pytest.approx(float(reference_all[0]), abs=1e-5)
            assert torch.isfinite(out["per_sample/score"]).all()
            scores.append(float(out["per_sample/score"][1]))
        assert scores[0] != scores[1]  # the windows read past the cut


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import json
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        metric = CLIPScoreMetric(model_spec("path"), per_sample=True)
        metric.update(CAPTIONS[rank], IMAGES[rank], ids=[2 * rank, 2 * rank + 1])
        out = metric.compute()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"score": float(out["score"]), "per_sample": out["per_sample/score"].tolist(),
                       "ids": out["per_sample/id"].tolist()}, f)
    finally:
        torch.distributed.destroy_process_group()


def test_clip_score_ddp(tmp_path, reference_all):
    """test_clip_score with ddp=True: two real gloo processes, one batch each; both get the whole result."""
    import json

    import torch.multiprocessing as mp

    from capreward.testing.chat_server import free_port

    trained_clip_path()  # trained (or read) once here, not by both workers at once
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["ids"] == [0, 1, 2, 3]
        assert got["per_sample"] == pytest.approx(reference_all.tolist(), abs=1e-5)
        assert got["score"] == pytest.approx(float(reference_all.mean()), abs=1e-5)


# --------------------------------------------------------------- torchmetrics' module-level tests
def test_detect_modality():
    """torchmetrics detects which argument is the image; capreward's order is fixed, (captions, images),
    and images where the captions go are refused with the order named."""
    metric = CLIPScoreMetric(model_spec("path"))
    with pytest.raises(TypeError, match=r"captions come first .*torchmetrics' CLIPScore takes \(images, captions\)"):
        metric.update(IMAGES[0], CAPTIONS[0])
    with pytest.raises(TypeError, match="captions come first"):
        metric.update(list(IMAGES[0]), CAPTIONS[0])
    with pytest.raises(TypeError, match="must be str"):
        metric.update([123], IMAGES[0][:1])


@pytest.mark.parametrize(
    ("images", "expected_len", "should_raise"),
    [
        (torch.rand(3, 64, 64), 1, False),
        (torch.rand(2, 3, 64, 64), 2, False),
        ([torch.rand(3, 64, 64)], 1, False),
        ([torch.rand(3, 64, 64), torch.rand(3, 64, 64)], 2, False),
        (torch.rand(64, 64), 0, True),
        ([torch.rand(64, 64)], 0, True),
    ],
)
def test_process_image_data(images, expected_len, should_raise):
    """One (3, H, W) tensor is one image, a batched tensor or a list is one image per entry; a 2-d image is refused."""
    metric = CLIPScoreMetric(model_spec("path"), per_sample=True)
    captions = ["a red image."] * max(expected_len, 1)
    if should_raise:
        with pytest.raises(ValueError, match=r"\(3, H, W\) or \(H, W, 3\)"):
            metric.update(captions, images)
        return
    metric.update(captions, images)
    assert metric.compute()["per_sample/score"].numel() == expected_len  # (torchmetrics squeezes one value to 0-d)


@pytest.mark.parametrize(("texts", "expected_len"), [("single text", 1), (["text1", "text2"], 2), ([""], 1), ([], 0)])
def test_process_text_data(texts, expected_len):
    """One str is one caption, a list one per entry; an empty caption counts (scored ``empty_score``); an
    empty list adds nothing."""
    metric = CLIPScoreMetric(model_spec("path"), per_sample=True)
    metric.update(texts, IMAGES.flatten(0, 1)[:expected_len] if expected_len else [])
    assert metric.compute()["per_sample/score"].numel() == expected_len


# ------------------------------------------------------------------- the image forms torchmetrics takes
@pytest.mark.parametrize(
    "convert",
    [
        pytest.param(lambda t: t.to(torch.uint8), id="uint8-chw"),
        pytest.param(lambda t: t, id="int64-chw"),
        pytest.param(lambda t: t.to(torch.int32), id="int32-chw"),
        pytest.param(lambda t: t.permute(1, 2, 0).contiguous(), id="int64-hwc"),
        pytest.param(lambda t: t.float() / 255, id="float32-unit"),
        pytest.param(lambda t: (t.double() / 255), id="float64-unit"),
        pytest.param(lambda t: (t.float() / 255).to(torch.bfloat16), id="bfloat16-unit"),
    ],
)
def test_image_tensor_forms_score_as_the_8bit_image(convert, reference_all):
    """uint8 / int64 / int32 0..255 (channel-first or last) and float [0, 1] tensors score as the same 8-bit
    image (bfloat16 rounds a few levels: within 0.05)."""
    metric = CLIPScoreMetric(model_spec("path"), per_sample=True)
    metric.update(CAPTIONS[0], [convert(img) for img in IMAGES[0]])
    got = metric.compute()["per_sample/score"].double()
    tol = 0.05 if "bfloat16" in str(convert(IMAGES[0][0]).dtype) else 1e-5
    torch.testing.assert_close(got, reference_all[:2], atol=tol, rtol=0)


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (torch.full((3, 8, 8), 256, dtype=torch.int64), r"integer image values must lie in 0\.\.255, got 256\.\.256"),
        (torch.full((3, 8, 8), -1, dtype=torch.int64), r"0\.\.255, got -1\.\.-1"),
        (torch.full((3, 8, 8), 2.0), r"float image values must lie in \[0, 1\]"),
        (torch.ones((3, 8, 8), dtype=torch.bool), "integers 0..255 or floats"),
        (torch.ones((4, 8, 8), dtype=torch.int64), r"\(3, H, W\) or \(H, W, 3\), got shape \(4, 8, 8\)"),
    ],
)
def test_image_tensors_out_of_range_are_refused_naming_the_item(image, match):
    scorer = CLIPScore(model_spec("path"))
    from capreward.media import MediaError

    with pytest.raises(MediaError, match=match) as info:
        scorer.score(["a red image.", "a red image."], images=[IMAGES[0][0], image])
    assert "item 1" in str(info.value)
