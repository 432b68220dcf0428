"""capreward.testing.trained_clip: the tiny CLIP trained on colour words. It retrieves the right colour
(>= 90%) through the production loading path and scorers, its training is deterministic and cached
on disk, and bad inputs are refused by name."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from capreward.scorers.clipscore import CLIPScore
from capreward.scorers.emscore import EMScore
from capreward.testing.trained_clip import (
    CAPTION_TEMPLATES,
    COLOURS,
    ColourClipRecipe,
    TrainedClipFactory,
    colour_caption,
    colour_image,
    encode_captions,
    train_colour_clip,
    trained_clip_path,
)

NAMES = list(COLOURS)


@pytest.fixture(scope="module")
def clip_path():
    return trained_clip_path()


@pytest.fixture(scope="module")
def held_out():
    """Fresh images (a seed training never used), sizes unlike the training ones, 8 per colour."""
    rng = random.Random(12345)
    labels = [c for c in NAMES for _ in range(8)]
    return [colour_image(c, rng, size=(rng.randint(20, 90), rng.randint(20, 90))) for c in labels], labels


@pytest.mark.parametrize("template", ["a {colour} image", "{colour}", "the picture is {colour}.", "a photo of {colour}"])
def test_clip_s_retrieves_the_colour(clip_path, held_out, template):
    """For each image, CLIP-S (production scorer, "A photo depicts" prefix) is highest for the caption
    naming its colour, for >= 90% of the images."""
    images, labels = held_out
    scorer = CLIPScore(model=str(clip_path))
    captions = [template.format(colour=c) for c in NAMES]
    scores = torch.stack(
        [scorer.score([caption] * len(images), images=images).clip_s for caption in captions], dim=1
    )  # [images, colours]
    picked = [NAMES[i] for i in scores.argmax(dim=1).tolist()]
    accuracy = np.mean([p == t for p, t in zip(picked, labels)])
    assert accuracy >= 0.9, accuracy
    # the right caption scores high in absolute terms too (CLIP-S clips cosines at 0)
    right = scores[torch.arange(len(images)), torch.tensor([NAMES.index(t) for t in labels])]
    assert right.median() > 1.5


def test_emscore_token_matching_knows_the_colour_word(clip_path, held_out):
    """EMScore reads per-token embeddings: the colour word's best-frame similarity is higher for the
    right colour than for a swapped one (>= 90% of images), and so is the full EMScore."""
    images, labels = held_out
    scorer = EMScore(model=str(clip_path))
    foils = [NAMES[(NAMES.index(t) + 1) % len(NAMES)] for t in labels]
    right = scorer.score([f"a {t} image" for t in labels], images=images)
    wrong = scorer.score([f"a {f} image" for f in foils], images=images)

    def colour_similarity(result, words):
        out = []
        for alignment, word in zip(result.alignment, words):
            idx = [i for i, tok in enumerate(alignment.tokens) if tok.strip().lower().startswith(word)]
            assert idx, (alignment.tokens, word)
            out.append(float(alignment.similarity[idx[0]]))
        return np.array(out)

    token_right, token_wrong = colour_similarity(right, labels), colour_similarity(wrong, foils)
    assert np.mean(token_right > token_wrong) >= 0.9
    assert np.mean(right.video.full_f.numpy() > wrong.video.full_f.numpy()) >= 0.9


def test_cached_on_disk_and_training_is_deterministic(tmp_path):
    recipe = ColourClipRecipe(name="small", steps=3, batch_size=12, pool_size=24)
    path = trained_clip_path(recipe, cache_dir=tmp_path)
    assert path.parent == tmp_path / "trained_clip" and path.name == f"small-{recipe.key()}.pt"
    assert path.with_suffix(".json").is_file()
    mtime = path.stat().st_mtime_ns
    assert trained_clip_path(recipe, cache_dir=tmp_path) == path and path.stat().st_mtime_ns == mtime

    # same recipe, same weights, bit for bit; the cached file holds exactly those weights
    (a, losses_a), (b, losses_b) = train_colour_clip(recipe), train_colour_clip(recipe)
    assert losses_a == losses_b and len(losses_a) == 3
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    saved = torch.load(path, weights_only=True)
    assert torch.equal(saved["token_embedding.weight"].float(), a.token_embedding.weight)
    # and it loads through the OpenAI-format path the scorers use
    model, _, _ = TrainedClipFactory(recipe, str(tmp_path))()
    assert torch.equal(model.visual.conv1.weight, a.visual.conv1.weight)

    # any recipe change is a different cache entry
    assert ColourClipRecipe(name="small", steps=4, batch_size=12, pool_size=24).key() != recipe.key()


def test_images_and_captions():
    rng = random.Random(0)
    img = colour_image("red", rng, size=(30, 20))
    assert img.size == (30, 20) and img.mode == "RGB"
    mean = np.asarray(img, dtype=np.float64).reshape(-1, 3).mean(0)
    assert np.abs(mean - np.array(COLOURS["red"])).max() < 30  # jitter <= 25 plus noise
    assert np.array_equal(np.asarray(colour_image("red", random.Random(1))), np.asarray(colour_image("red", random.Random(1))))
    with pytest.raises(ValueError, match="unknown colour 'teal'"):
        colour_image("teal")
    assert {colour_caption("blue", random.Random(s)) for s in range(50)} == {t.format(colour="blue") for t in CAPTION_TEMPLATES}


def test_encode_captions_marks_the_colour_word():
    import open_clip

    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=77)
    ids, lengths, where = encode_captions(tokenizer, ["a red image.", "the picture is purple"])
    assert lengths.tolist() == [6, 6]  # SOT a red image . EOT / SOT the picture is purple EOT
    # the same ids as open_clip's own tokenizer (which the scorers use)
    reference = tokenizer(["a red image.", "the picture is purple"])
    assert torch.equal(ids, reference[:, : ids.shape[1]]) and reference[:, ids.shape[1] :].eq(0).all()
    assert tokenizer.decode([int(ids[0, where[0]])]).strip() == "red"
    assert tokenizer.decode([int(ids[1, where[1]])]).strip() == "purple"
    with pytest.raises(ValueError, match="'a dog' names none of"):
        encode_captions(tokenizer, ["a red image", "a dog"])
