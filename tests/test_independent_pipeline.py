"""An independent re-derivation of EMScore and CLIP-S, checked against the library to 1e-5.

Nothing here imports capreward's model, media or metric code. From an OpenAI-format state dict
(read with ``torch.load``) the test runs CLIP's ViT image tower and causal text transformer in plain
torch (float64, one sample at a time, no padding), does CLIP's preprocessing by hand with PIL
(shorter side resized bicubic to the input size, centre crop, CLIP mean/std), samples frames with
``int(linspace(0, T-1, 10))``, computes the idf table of the released EMScore code, and evaluates
DESIGN.md's formulas with Python loops. The one shared piece is the BPE tokenizer: open_clip's
``SimpleTokenizer`` is CLIP's reference tokenizer (re-implementing BPE would only re-type it).
Frames of the real clip are decoded with decord in the test itself.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capreward import CLIPScore, EMScore
from capreward.testing import build_tiny_clip, openai_state_dict

from conftest import TEST_DEVICE, random_video, sample_clips

# the library runs on CAPREWARD_TEST_DEVICE (the CPU by default); the reference always on the CPU in float64
pytestmark = pytest.mark.device_parity

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CONTEXT = 77
ATOL = 1e-5
FRAMES = 10

CANDIDATES = [
    "a man is cooking food in a kitchen",
    "a dog runs across the grass",
    "two people dance on a stage while a crowd watches",
    "a red car",
    # longer than the 77-token context: cut to 76 tokens + EOS (long_captions="truncate", the released
    # behaviour the reference below implements; the default reads it whole, tests/test_whole_caption.py)
    "a very long caption " + " ".join(f"word{i}" for i in range(60)),
]
REFERENCES = [
    ["a person cooks dinner", "a chef prepares a meal in the kitchen"],
    ["a dog playing outside"],
    ["people dance", "a couple performs a dance", "dancers on stage"],
    ["a car on a road"],
    ["a long caption"],
]
IDF_CORPUS = [r for rs in REFERENCES for r in rs] + ["a man walks a dog in the park", "a kitchen", "a red car"]


# --------------------------------------------------------------------------- the reference CLIP
class ReferenceCLIP:
    """CLIP forward passes written directly from the weights of an OpenAI-format state dict."""

    def __init__(self, path: Path):
        raw = torch.load(path, map_location="cpu", weights_only=True)
        self.w = {k: v.to(torch.float64) for k, v in raw.items() if v.is_floating_point()}
        self.patch = self.w["visual.conv1.weight"].shape[-1]
        grid = round(math.sqrt(self.w["visual.positional_embedding"].shape[0] - 1))
        self.image_size = grid * self.patch
        import open_clip  # the tokenizer is the one shared piece

        self.tokenizer = open_clip.tokenizer.SimpleTokenizer()
        self.sot = self.tokenizer.encoder["<start_of_text>"]
        self.eot = self.tokenizer.encoder["<end_of_text>"]

    # ---- building blocks
    @staticmethod
    def layer_norm(x, weight, bias, eps=1e-5):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * weight + bias

    def block(self, x, prefix, causal):
        """One residual attention block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). x: [L, W]."""
        w = self.w
        length, width = x.shape
        heads = width // 64  # OpenAI CLIP: head width 64
        h = self.layer_norm(x, w[f"{prefix}.ln_1.weight"], w[f"{prefix}.ln_1.bias"])
        qkv = h @ w[f"{prefix}.attn.in_proj_weight"].T + w[f"{prefix}.attn.in_proj_bias"]
        q, k, v = qkv.split(width, dim=-1)
        d = width // heads
        outs = []
        for head in range(heads):
            sl = slice(head * d, (head + 1) * d)
            logits = q[:, sl] @ k[:, sl].T / math.sqrt(d)
            if causal:
                future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
                logits = logits.masked_fill(future, float("-inf"))
            outs.append(torch.softmax(logits, dim=-1) @ v[:, sl])
        attn = torch.cat(outs, dim=-1) @ w[f"{prefix}.attn.out_proj.weight"].T + w[f"{prefix}.attn.out_proj.bias"]
        x = x + attn
        h = self.layer_norm(x, w[f"{prefix}.ln_2.weight"], w[f"{prefix}.ln_2.bias"])
        h = h @ w[f"{prefix}.mlp.c_fc.weight"].T + w[f"{prefix}.mlp.c_fc.bias"]
        h = h * torch.sigmoid(1.702 * h)  # QuickGELU
        h = h @ w[f"{prefix}.mlp.c_proj.weight"].T + w[f"{prefix}.mlp.c_proj.bias"]
        return x + h

    def blocks(self, x, tower, causal):
        n = len({k.split(".")[2 if tower == "transformer" else 3] for k in self.w if k.startswith(f"{tower}.resblocks.")})
        for i in range(n):
            x = self.block(x, f"{tower}.resblocks.{i}", causal)
        return x

    # ---- image side
    def preprocess(self, frame: np.ndarray) -> torch.Tensor:
        """uint8 (H, W, 3) → normalised float64 (3, S, S): shorter side to S (bicubic), centre crop."""
        image = Image.fromarray(frame, mode="RGB")
        width, height = image.size
        s = self.image_size
        if width <= height:
            new_w, new_h = s, int(s * height / width)
        else:
            new_w, new_h = int(s * width / height), s
        if (new_w, new_h) != (width, height):
            image = image.resize((new_w, new_h), Image.BICUBIC)
        top = int(round((new_h - s) / 2.0))
        left = int(round((new_w - s) / 2.0))
        image = image.crop((left, top, left + s, top + s))
        x = torch.from_numpy(np.asarray(image, dtype=np.float64) / 255.0).permute(2, 0, 1)
        mean = torch.tensor(CLIP_MEAN, dtype=torch.float64)[:, None, None]
        std = torch.tensor(CLIP_STD, dtype=torch.float64)[:, None, None]
        return (x - mean) / std

    def encode_frame(self, frame: np.ndarray) -> torch.Tensor:
        """L2-normalised image embedding [D] of one uint8 frame."""
        w, p = self.w, self.patch
        x = self.preprocess(frame)
        g = x.shape[1] // p
        # non-overlapping p×p patches flattened as (channel, row, col), the conv1 weight's layout
        patches = x.reshape(3, g, p, g, p).permute(1, 3, 0, 2, 4).reshape(g * g, 3 * p * p)
        tokens = patches @ w["visual.conv1.weight"].reshape(w["visual.conv1.weight"].shape[0], -1).T
        tokens = torch.cat([w["visual.class_embedding"][None], tokens]) + w["visual.positional_embedding"]
        tokens = self.layer_norm(tokens, w["visual.ln_pre.weight"], w["visual.ln_pre.bias"])
        tokens = self.blocks(tokens, "visual.transformer", causal=False)
        cls = self.layer_norm(tokens[0], w["visual.ln_post.weight"], w["visual.ln_post.bias"])
        out = cls @ w["visual.proj"]
        return out / out.norm()

    # ---- text side
    def token_ids(self, caption: str) -> list[int]:
        ids = [self.sot, *self.tokenizer.encode(caption), self.eot]
        return ids if len(ids) <= CONTEXT else ids[: CONTEXT - 1] + [self.eot]

    def encode_tokens(self, caption: str) -> tuple[list[int], torch.Tensor]:
        """Token ids SOS..EOS and their L2-normalised embeddings [L, D] (ln_final, then projection)."""
        w = self.w
        ids = self.token_ids(caption)
        x = w["token_embedding.weight"][ids] + w["positional_embedding"][: len(ids)]
        x = self.blocks(x, "transformer", causal=True)
        x = self.layer_norm(x, w["ln_final.weight"], w["ln_final.bias"]) @ w["text_projection"]
        return ids, x / x.norm(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- the formulas
def released_idf(clip: ReferenceCLIP, corpus: list[str]) -> tuple[dict[int, float], float]:
    """idf table of the released EMScore code: df over the id set of each padded 77-token row,
    idf = ln((N+1)/(df+1)), EOS overwritten with the mean over the table; unseen ids ln(N+1)."""
    df: dict[int, int] = {}
    for caption in corpus:
        ids = clip.token_ids(caption)
        row = ids + [0] * (CONTEXT - len(ids))
        for t in set(row):
            df[t] = df.get(t, 0) + 1
    n = len(corpus)
    idf = {t: math.log((n + 1) / (c + 1)) for t, c in df.items()}
    idf[clip.eot] = sum(idf.values()) / len(idf)
    return idf, math.log(n + 1)


def weights_of(ids, idf):
    if idf is None:
        return [1.0] * len(ids)
    table, unseen = idf
    return [table.get(t, unseen) for t in ids]


def fine_match(cand, cand_w, target, target_w):
    """P = Σ_i w_i max_j s_ij / Σ_i w_i; R = Σ_j w*_j max_i s_ij / Σ_j w*_j; F = 2PR/(P+R)."""
    sim = [[float(cand[i] @ target[j]) for j in range(len(target))] for i in range(len(cand))]
    p = sum(cand_w[i] * max(sim[i]) for i in range(len(cand))) / sum(cand_w)
    r = sum(target_w[j] * max(sim[i][j] for i in range(len(cand))) for j in range(len(target))) / sum(target_w)
    return p, r, 2 * p * r / (p + r), [max(range(len(target)), key=lambda j: sim[i][j]) for i in range(len(cand))], sim


def with_full(coarse, p, r, f):
    return {"coarse": coarse, "fine_p": p, "fine_r": r, "fine_f": f,
            "full_p": (p + coarse) / 2, "full_r": (r + coarse) / 2, "full_f": (f + coarse) / 2}


def emscore_video(clip, caption, frame_embs, idf):
    ids, tok = clip.encode_tokens(caption)
    p, r, f, best, sim = fine_match(tok, weights_of(ids, idf), frame_embs, [1.0] * len(frame_embs))
    video = sum(frame_embs) / len(frame_embs)
    coarse = float(tok[-1] @ (video / video.norm()))
    return with_full(coarse, p, r, f), best, sim


def emscore_reference(clip, caption, refs, idf):
    ids, tok = clip.encode_tokens(caption)
    per_ref = []
    for ref in refs:
        rids, rtok = clip.encode_tokens(ref)
        p, r, f, _, _ = fine_match(tok, weights_of(ids, idf), rtok, weights_of(rids, idf))
        per_ref.append((float(tok[-1] @ rtok[-1]), p, r, f))
    return with_full(*(max(x[k] for x in per_ref) for k in range(4)))


def emscore_combined(v, r):
    return with_full(*((v[k] + r[k]) / 2 for k in ("coarse", "fine_p", "fine_r", "fine_f")))


def sample_frames(video: np.ndarray) -> list[np.ndarray]:
    return [video[int(i)] for i in np.linspace(0, len(video) - 1, FRAMES)]


# --------------------------------------------------------------------------------- fixtures
TWO_HEAD_CONFIG = {
    "embed_dim": 48,
    "vision": {"image_size": 48, "patch_size": 16, "width": 128, "layers": 2},
    "text": {"context_length": 77, "vocab_size": 49408, "width": 128, "layers": 3},
}


@pytest.fixture(scope="module", params=["tiny", "two-head"])
def checkpoint(request, tiny_clip_path, tmp_path_factory) -> Path:
    """The conftest tiny CLIP (one head) and a wider variant with two heads per layer, both saved as
    OpenAI-format state dicts."""
    if request.param == "tiny":
        return tiny_clip_path
    path = tmp_path_factory.mktemp("clip2") / "two_head_openai.pt"
    torch.save(openai_state_dict(build_tiny_clip(seed=5, config=TWO_HEAD_CONFIG)), path)
    return path


@pytest.fixture(scope="module")
def ref_clip(checkpoint) -> ReferenceCLIP:
    return ReferenceCLIP(checkpoint)


@pytest.fixture(scope="module")
def real_clip_frames(real_clips) -> tuple[Path, list[np.ndarray]]:
    """The VATEX sample clip and its 10 sampled frames, decoded in the test with decord."""
    import decord

    path = next(p for p in real_clips if p.name.startswith("vatex"))
    reader = decord.VideoReader(str(path), ctx=decord.cpu(0))
    indices = [int(i) for i in np.linspace(0, len(reader) - 1, FRAMES)]
    return path, list(reader.get_batch(indices).asnumpy())


@pytest.fixture(scope="module")
def videos(request):
    """Library inputs (two synthetic uint8 arrays of different sizes and length, and the real clip's
    path) with their sampled frames as the test sees them. Where the sample clips are absent (a device
    machine: shared/ does not travel) the two synthetic arrays alone."""
    a = random_video(11, frames=23, height=40, width=56)
    b = random_video(12, frames=7, height=64, width=36)  # portrait, fewer frames than samples
    if not sample_clips():
        return [a, b], [sample_frames(a), sample_frames(b)]
    path, frames = request.getfixturevalue("real_clip_frames")
    return [a, b, str(path)], [sample_frames(a), sample_frames(b), frames]


@pytest.fixture(scope="module")
def frame_embeddings(ref_clip, videos):
    return [torch.stack([ref_clip.encode_frame(f) for f in frames]) for frames in videos[1]]


def assert_parts_match(lib_parts, expected: list[dict[str, float]], what: str):
    for name, want in zip(("coarse", "fine_p", "fine_r", "fine_f", "full_p", "full_r", "full_f"), zip(*[
        [e[k] for k in ("coarse", "fine_p", "fine_r", "fine_f", "full_p", "full_r", "full_f")] for e in expected
    ])):
        got = getattr(lib_parts, name).double().cpu()
        want = torch.tensor(want, dtype=torch.float64)
        assert torch.allclose(got, want, atol=ATOL, rtol=0), f"{what}.{name}: library {got} vs reference {want}"


def spread(values) -> float:
    return max(values) - min(values)


# ------------------------------------------------------------------------------------ tests
def test_reference_preprocessing_matches_clip_shapes(ref_clip, videos):
    for frames in videos[1]:
        x = ref_clip.preprocess(frames[0])
        assert x.shape == (3, ref_clip.image_size, ref_clip.image_size)


@pytest.mark.parametrize("use_idf", [False, True], ids=["no-idf", "idf"])
def test_video_emscore_matches_reference(checkpoint, ref_clip, videos, frame_embeddings, use_idf):
    idf = released_idf(ref_clip, IDF_CORPUS) if use_idf else None
    em = EMScore(model=str(checkpoint), idf=IDF_CORPUS if use_idf else False, frames=FRAMES, device=TEST_DEVICE, long_captions="truncate")
    n_vid = len(videos[0])
    cands = CANDIDATES
    vids = [videos[0][i % n_vid] for i in range(len(cands))]
    res = em.score(cands, videos=vids)

    expected, best_frames, sims = zip(*[
        emscore_video(ref_clip, c, frame_embeddings[i % n_vid], idf) for i, c in enumerate(cands)
    ])
    assert_parts_match(res.video, list(expected), "video")
    assert torch.allclose(res.score.double().cpu(), torch.tensor([e["full_f"] for e in expected], dtype=torch.float64),
                          atol=ATOL, rtol=0)
    assert res.reference is None and res.combined is None
    assert res.truncated == [False, False, False, False, True]
    # the numbers compared are not degenerate: they differ across captions and videos
    assert spread([e["fine_p"] for e in expected]) > 1e-3 and spread([e["coarse"] for e in expected]) > 1e-3

    for i, align in enumerate(res.alignment):
        ids = ref_clip.token_ids(cands[i])
        assert align.token_ids == ids
        assert align.weight == pytest.approx(weights_of(ids, idf), abs=1e-6)
        for pos, frame in enumerate(align.best_frame):
            row = sorted(sims[i][pos], reverse=True)
            if len(row) == 1 or row[0] - row[1] > 1e-4:  # skip near-ties that fp32 may order differently
                assert frame == best_frames[i][pos], (i, pos)


@pytest.mark.parametrize("use_idf", [False, True], ids=["no-idf", "idf"])
def test_reference_emscore_matches_reference(checkpoint, ref_clip, use_idf):
    idf = released_idf(ref_clip, IDF_CORPUS) if use_idf else None
    em = EMScore(model=str(checkpoint), idf=IDF_CORPUS if use_idf else False, device=TEST_DEVICE, long_captions="truncate")
    res = em.score(CANDIDATES, references=REFERENCES)
    expected = [emscore_reference(ref_clip, c, refs, idf) for c, refs in zip(CANDIDATES, REFERENCES)]
    assert_parts_match(res.reference, expected, "reference")
    assert res.video is None and res.combined is None
    assert torch.allclose(res.score.double().cpu(), torch.tensor([e["full_f"] for e in expected], dtype=torch.float64),
                          atol=ATOL, rtol=0)


@pytest.mark.parametrize("use_idf", [False, True], ids=["no-idf", "idf"])
def test_combined_emscore_matches_reference(checkpoint, ref_clip, videos, frame_embeddings, use_idf):
    idf = released_idf(ref_clip, IDF_CORPUS) if use_idf else None
    em = EMScore(model=str(checkpoint), idf=IDF_CORPUS if use_idf else False, device=TEST_DEVICE, long_captions="truncate")
    n_vid = len(videos[0])
    vids = [videos[0][(i + 1) % n_vid] for i in range(len(CANDIDATES))]
    res = em.score(CANDIDATES, videos=vids, references=REFERENCES)
    v_parts = [emscore_video(ref_clip, c, frame_embeddings[(i + 1) % n_vid], idf)[0] for i, c in enumerate(CANDIDATES)]
    r_parts = [emscore_reference(ref_clip, c, refs, idf) for c, refs in zip(CANDIDATES, REFERENCES)]
    combined = [emscore_combined(v, r) for v, r in zip(v_parts, r_parts)]
    assert_parts_match(res.video, v_parts, "video")
    assert_parts_match(res.reference, r_parts, "reference")
    assert_parts_match(res.combined, combined, "combined")
    assert torch.allclose(res.score.double().cpu(), torch.tensor([e["full_f"] for e in combined], dtype=torch.float64),
                          atol=ATOL, rtol=0)


def test_idf_table_matches_released_procedure(checkpoint, ref_clip):
    """Token weights the library reports equal the hand-built idf table, unseen tokens included."""
    table, unseen = released_idf(ref_clip, IDF_CORPUS)
    em = EMScore(model=str(checkpoint), idf=IDF_CORPUS, device=TEST_DEVICE, long_captions="truncate")
    caption = "a zebra cooks a dog"  # 'zebra' is not in the corpus
    res = em.score([caption], videos=[random_video(3, frames=4)])
    ids = ref_clip.token_ids(caption)
    assert any(t not in table for t in ids)
    assert res.alignment[0].weight == pytest.approx([table.get(t, unseen) for t in ids], abs=1e-6)
    # EOS: the mean over every id of the df table (its own pre-fix value 0 included)
    others = [v for t, v in table.items() if t != ref_clip.eot]
    assert table[ref_clip.eot] == pytest.approx(sum(others) / (len(others) + 1))


def clip_s_reference(ref_clip, caption, visual, refs, w=2.5):
    """(CLIP-S, best reference cosine or None, RefCLIP-S or None); references get the prefix too."""
    prefix = "A photo depicts "
    text = ref_clip.encode_tokens(prefix + caption)[1][-1]
    clip_s = w * max(float(text @ visual), 0.0)
    if refs is None:
        return clip_s, None, None
    sim = max(float(text @ ref_clip.encode_tokens(prefix + r)[1][-1]) for r in refs)
    return clip_s, sim, (2 * clip_s * sim / (clip_s + sim) if clip_s + sim != 0 else 0.0)


def test_clip_s_and_ref_clip_s_match_reference(checkpoint, ref_clip, videos):
    images = [frames[3] for frames in videos[1]]  # uint8 (H, W, 3) frames of each video
    n = len(images)
    cs = CLIPScore(model=str(checkpoint), device=TEST_DEVICE, long_captions="truncate")
    imgs = [images[i % n] for i in range(len(CANDIDATES))]
    res = cs.score(CANDIDATES, images=imgs, references=REFERENCES)
    expected = [
        clip_s_reference(ref_clip, c, ref_clip.encode_frame(imgs[i]), REFERENCES[i]) for i, c in enumerate(CANDIDATES)
    ]
    for k, got in enumerate((res.clip_s, res.ref_similarity, res.ref_clip_s)):
        want = torch.tensor([e[k] for e in expected], dtype=torch.float64)
        assert torch.allclose(got.double().cpu(), want, atol=ATOL, rtol=0), (k, got, want)
    # random tiny CLIPs may put every image-caption cosine below 0 (CLIP-S = 0); the reference
    # similarities are unclipped and must vary
    assert spread([e[1] for e in expected]) > 1e-3


def test_clip_s_on_videos_uses_the_mean_frame_embedding(checkpoint, ref_clip, videos, frame_embeddings):
    cs = CLIPScore(model=str(checkpoint), device=TEST_DEVICE, long_captions="truncate")
    n_vid = len(videos[0])
    res = cs.score(CANDIDATES[:3], videos=[videos[0][i % n_vid] for i in range(3)])
    expected = []
    for i, c in enumerate(CANDIDATES[:3]):
        mean = frame_embeddings[i % n_vid].sum(0)
        expected.append(clip_s_reference(ref_clip, c, mean / mean.norm(), None)[0])
    assert res.ref_clip_s is None
    assert torch.allclose(res.clip_s.double().cpu(), torch.tensor(expected, dtype=torch.float64), atol=ATOL, rtol=0)
