"""The whole caption past the text context (capreward.backbones.windows): windows that fit and keep
every character, the combination computed independently from the trained colour CLIP's own towers,
and a hallucinated tail past the context that lowers CLIP-S, EMScore and the hallucination penalty
with default settings (it was free before: both captions scored the same)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from capreward.backbones import CLIPBackbone
from capreward.backbones.clip import embed_captions
from capreward.backbones.windows import combine_windows, split_windows
from capreward.rewards import CLIPScoreReward, EMScoreReward, HallucinationPenalty
from capreward.scorers.clipscore import CLIPS_PREFIX, CLIPScore
from capreward.scorers.emscore import EMScore
from capreward.testing.trained_clip import TrainedClipFactory, colour_image, text_token_embeddings, trained_clip_path

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)

HEAD = " ".join(["a red image."] * 19)  # 81 tokens behind CLIP-S's prefix: past the 77-token context alone
GOOD = HEAD + " the picture is red."
BAD = HEAD + " a blue image with a dog, a cat, a car and a green tree."


@pytest.fixture(scope="module")
def backbone():
    return CLIPBackbone(str(trained_clip_path()))


@pytest.fixture(scope="module")
def red():
    return colour_image("red", random.Random(0), size=(48, 48))


# ---------------------------------------------------------------------------------- the windows
words = st.sampled_from(["a", "red", "dog", "runs", "fast", "on", "the", "green", "grass", "verylongwordwithoutbreaks"])
punct = st.sampled_from(["", "", "", ",", ".", ";", "!"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(words, punct), min_size=1, max_size=60), st.integers(3, 12))
def test_windows_fit_keep_every_character_and_one_window_is_the_caption(pieces, budget):
    caption = " ".join(w + p for w, p in pieces)
    fits = lambda text: len(text) <= budget * 4  # noqa: E731 (a character budget stands for tokens)
    windows = split_windows(caption, fits)
    assert all(fits(w) and w == w.strip() and w for w in windows)
    assert "".join(windows).replace(" ", "") == caption.replace(" ", "")
    assert (windows == [caption]) == fits(caption)


def test_windows_follow_sentences_then_clauses_then_words():
    fits = lambda text: len(text.split()) <= 4  # noqa: E731
    assert split_windows("a red car. a dog runs, a cat sleeps on a mat.", fits) == [
        "a red car.", "a dog runs,", "a cat sleeps on", "a mat."
    ]
    assert split_windows("one. two. three four.", fits) == ["one. two. three four."]
    assert split_windows("x" * 10, lambda t: len(t) <= 4) == ["xxxx", "xxxx", "xx"]
    with pytest.raises(ValueError, match="cannot hold even one character"):
        split_windows("abc", lambda t: False)


def test_combine_windows_by_hand():
    a, b = F.normalize(torch.tensor([1.0, 0.0]), dim=0), F.normalize(torch.tensor([0.0, 1.0]), dim=0)
    tokens, pooled = combine_windows([torch.ones(2, 2), torch.zeros(3, 2)], [a, b], [3, 1])
    assert tokens.shape == (5, 2)
    assert torch.allclose(pooled, torch.tensor([3.0, 1.0]) / 10**0.5)
    one = torch.randn(4, 2)
    assert combine_windows([one], [a], [4])[1] is a  # one window: untouched, bit for bit


# ----------------------------------------------------------------- short captions: released numbers
def test_captions_that_fit_keep_their_numbers_bit_for_bit(backbone, red):
    caps = ["a red image", "the picture is blue.", HEAD[:200]]
    for scorer_cls in (CLIPScore, EMScore):
        windows = scorer_cls(backbone=backbone)
        released = scorer_cls(backbone=backbone, long_captions="truncate")
        kw = {"images": [red] * 3}
        a, b = windows.score(caps, **kw), released.score(caps, **kw)
        assert torch.equal(a.score, b.score) and b.truncated == [False] * 3 and a.windows == [1, 1, 1]
    with pytest.raises(ValueError, match="long_captions must be one of"):
        CLIPScore(backbone=backbone, long_captions="drop")


# ------------------------------------------------- long captions, computed independently of the backbone
def _independent_windows(tok, text: str, prefix: str, context: int) -> list[str]:
    """Greedy packing of whole sentences, counted with the BPE tokenizer itself."""
    sentences = [s.strip() + "." for s in text.split(".") if s.strip()]
    out, current = [], ""
    for s in sentences:
        joined = (current + " " + s).strip()
        if len(tok.encode(prefix + joined)) + 2 <= context:
            current = joined
        else:
            out.append(current)
            current = s
    return out + [current]


def test_long_caption_clip_s_and_emscore_from_the_models_own_towers(backbone, red):
    model, preprocess, tok = TrainedClipFactory()()
    caption = " ".join(f"a {c} image." for c in ["red", "red", "blue", "red"] * 7)
    windows = _independent_windows(tok, caption, CLIPS_PREFIX, 77)
    plain_windows = _independent_windows(tok, caption, "", 77)
    assert len(windows) >= 2 and len(plain_windows) >= 2

    def embed(prefix, w):
        ids = torch.tensor([[tok.sot_token_id, *tok.encode(prefix + w), tok.eot_token_id]])
        return text_token_embeddings(model, ids)[0]

    with torch.no_grad():
        image = F.normalize(model.encode_image(preprocess(red)[None]), dim=-1)[0]
        pooled = [embed(CLIPS_PREFIX, w)[-1] for w in windows]
        tokens = [embed("", w) for w in plain_windows]
    weights = [len(tok.encode(w)) for w in windows]
    f_x = F.normalize(sum(n * e for n, e in zip(weights, pooled)), dim=-1)
    expected_clip_s = 2.5 * max(float(f_x @ image), 0.0)
    got = CLIPScore(backbone=backbone).score([caption], images=[red])
    assert got.windows == [len(windows)] and got.truncated == [False]
    assert got.clip_s.item() == pytest.approx(expected_clip_s, abs=1e-5)
    # EMScore: the union of the windows' token embeddings against the one frame, pooled as above
    pooled_plain = [t[-1] for t in tokens]
    f_plain = F.normalize(sum(len(tok.encode(w)) * e for w, e in zip(plain_windows, pooled_plain)), dim=-1)
    union = torch.cat(tokens)
    sims = union @ image
    p, r = sims.mean().item(), sims.max().item()
    coarse = float(f_plain @ image)
    fine_f = 2 * p * r / (p + r)
    em = EMScore(backbone=backbone).score([caption], images=[red])
    assert em.video.coarse.item() == pytest.approx(coarse, abs=1e-5)
    assert em.video.fine_p.item() == pytest.approx(p, abs=1e-5)
    assert em.video.fine_r.item() == pytest.approx(r, abs=1e-5)
    assert em.score.item() == pytest.approx((fine_f + coarse) / 2, abs=1e-5)
    assert len(em.alignment[0].tokens) == union.shape[0]


def test_embed_captions_dedups_windows_and_keeps_order(backbone):
    out = embed_captions(backbone, [GOOD, "a red image", GOOD], prefix=CLIPS_PREFIX)
    assert out.windows[0] == out.windows[2] >= 2 and out.windows[1] == 1
    assert torch.equal(out.pooled[0], out.pooled[2])
    assert out.ids[0].tolist().count(backbone.sot_id) == out.windows[0]


# ------------------------------------------------------------------- the hallucinated tail is not free
@pytest.mark.parametrize("reward_cls", [CLIPScoreReward, EMScoreReward, HallucinationPenalty])
def test_a_hallucinated_tail_past_the_context_lowers_the_reward(backbone, red, reward_cls):
    assert len(backbone.full_ids(CLIPS_PREFIX + HEAD)) > backbone.context_length
    default = reward_cls(backbone=backbone).compute(None, [GOOD, BAD], image=[red, red])
    good, bad = default.values
    assert bad < good, (reward_cls.__name__, good, bad)
    assert default.metrics["truncated"] == [0.0, 0.0]
    # the released behaviour, chosen explicitly: the tail is cut, both score the same, truncation counted
    cut = reward_cls(backbone=backbone, long_captions="truncate").compute(None, [GOOD, BAD], image=[red, red])
    assert cut.values[0] == cut.values[1]
    assert cut.metrics["truncated"] == [1.0, 1.0]


def test_a_long_reference_is_read_whole(backbone):
    em = EMScore(backbone=backbone)
    a = em.score(["a red image"], references=[[GOOD]])
    b = em.score(["a red image"], references=[[BAD]])
    assert a.score.item() != b.score.item()
    cut = EMScore(backbone=backbone, long_captions="truncate")
    assert cut.score(["a red image"], references=[[GOOD]]).score.item() == cut.score(["a red image"], references=[[BAD]]).score.item()
