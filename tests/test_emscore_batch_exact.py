"""EMScore's sub-scores of a sample are the same alone, in any batch and in any order, including near F's
singularity P + R = 0, where F = 2PR/(P+R) multiplies any rounding of P and R by 2R^2/(P+R)^2.

The similarities and reductions run in float64 (capreward.metrics.emscore.exact_dtype), so a batch's
padded shape no longer rounds P and R; F is formed from the float64 P and R. "The same" is asserted to
two fp32 units in the last place (rtol 2.4e-7, atol 1e-7): the float64 sums may still round differently
by ~1e-16, which a cast to fp32 shows only at a rounding tie."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capreward import EMScore
from capreward.metrics.emscore import greedy_match
from capreward.metrics.harmonic import released_harmonic_mean

from conftest import random_video

RTOL, ATOL = 2.4e-7, 1e-7


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL), f"{what}: {a.tolist()} vs {b.tolist()}"


# ------------------------------------------------------------------ the matching math on built embeddings
def near_singular(eps: float, dim: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two candidate tokens and one target with s_11 = a, s_21 = -3a + 2*eps: P = (s_11 + s_21)/2 = -a + eps,
    R = max(s_11, s_21) = a, so P + R = eps (up to the fp32 rounding of the vectors)."""
    basis = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))[0].T
    t = basis[0]
    a = 0.1 + 0.2 * float(torch.rand(1, generator=generator))
    s2 = -3 * a + 2 * eps

    def with_cos(c: float, k: int) -> torch.Tensor:
        return c * t + (1 - c * c) ** 0.5 * basis[k]

    cand = torch.stack([with_cos(a, 1), with_cos(s2, 2)]).float()
    return cand, t[None].float()


def random_sample(draw, generator: torch.Generator, dim: int) -> tuple:
    kind = draw(st.sampled_from(["ordinary", "near-singular"]))
    if kind == "near-singular":
        eps = draw(st.sampled_from([1e-2, 1e-3, 1e-4, -1e-3]))
        cand, target = near_singular(eps, dim, generator)
        cand_w = torch.ones(2)
        target_w = torch.ones(1)
    else:
        lc, lt = draw(st.integers(1, 9)), draw(st.integers(1, 7))
        cand = torch.nn.functional.normalize(torch.randn(lc, dim, generator=generator), dim=-1)
        target = torch.nn.functional.normalize(torch.randn(lt, dim, generator=generator), dim=-1)
        cand_w = torch.rand(lc, generator=generator) + 0.1
        target_w = torch.rand(lt, generator=generator) + 0.1
    return cand, cand_w, target, target_w


def batch_of(samples: list[tuple], extra_pad: int, generator: torch.Generator):
    """The samples padded to a common width (plus ``extra_pad``) with garbage in the padding."""
    dim = samples[0][0].shape[1]
    wc = max(s[0].shape[0] for s in samples) + extra_pad
    wt = max(s[2].shape[0] for s in samples) + extra_pad
    n = len(samples)
    cand, target = torch.randn(n, wc, dim, generator=generator), torch.randn(n, wt, dim, generator=generator)
    cand_w, target_w = torch.rand(n, wc, generator=generator), torch.rand(n, wt, generator=generator)
    cand_m, target_m = torch.zeros(n, wc, dtype=torch.bool), torch.zeros(n, wt, dtype=torch.bool)
    for i, (c, cw, t, tw) in enumerate(samples):
        cand[i, : len(c)], cand_w[i, : len(c)], cand_m[i, : len(c)] = c, cw, True
        target[i, : len(t)], target_w[i, : len(t)], target_m[i, : len(t)] = t, tw, True
    return cand, cand_m, cand_w, target, target_m, target_w


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_greedy_match_of_a_sample_ignores_its_batch_padding_and_order(data):
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    dim = data.draw(st.sampled_from([8, 48, 512]))
    samples = [random_sample(data.draw, generator, dim) for _ in range(data.draw(st.integers(1, 6)))]
    alone = [greedy_match(*batch_of([s], 0, generator)) for s in samples]
    order = data.draw(st.permutations(range(len(samples))))
    batched = greedy_match(*batch_of([samples[i] for i in order], data.draw(st.integers(0, 40)), generator))
    for j, i in enumerate(order):
        for part in ("p", "r", "f"):
            assert_same(getattr(batched, part)[j : j + 1], getattr(alone[i], part), f"sample {i} {part}")


def test_near_singular_samples_are_near_singular_and_their_f_is_the_float64_formula():
    generator = torch.Generator().manual_seed(0)
    for eps in (1e-2, 1e-3, 1e-4):
        cand, target = near_singular(eps, 48, generator)
        fine = greedy_match(cand[None], torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 2), target[None],
                            torch.ones(1, 1, dtype=torch.bool), torch.ones(1, 1))
        assert abs(fine.p.item() + fine.r.item()) == pytest.approx(eps, rel=1e-2)
        # F from the float64 P and R, computed here by hand from the fp32 vectors
        sims = (cand.double() @ target.double().T)[:, 0]
        p, r = sims.mean(), sims.max()
        assert fine.f.item() == pytest.approx(float(2 * p * r / (p + r)), rel=1e-6)
        # the amplification the float64 path removes: P moved by one fp32 ulp moves F by far more than 1e-7
        moved = released_harmonic_mean(p + 6e-8, r)
        assert abs(float(moved) - fine.f.item()) > 1e-6


# ------------------------------------------------------------------------ the scorer on the tiny CLIP
# Captions whose fine P + R is within 1e-4 of 0 on the tiny CLIP (seed 0) with the videos below and the idf of
# the corpus below (found by scoring 400 random word strings): F is far outside [-1, 1] there (699 for the first).
NEAR_SINGULAR = [
    ("grass dog small blue blue red red grass car", 2), ("night a kitchen small", 2), ("onion car a dog dog a onion", 1),
]
ORDINARY = [
    ("a man is cooking food in a kitchen", 0), ("a red car drives down a wet road at night", 1), ("a cat", 2),
    # long enough that a batch holding it pads the others to 40+ tokens (fp32 sums then round otherwise)
    ("two people are dancing on a stage while a small dog runs across the grass and a man slices an onion "
     "next to a red car parked on a wet road at night in the kitchen", 0),
]
REFERENCES = [
    ["a dog runs across the grass"], ["people dance", "a small cat sits"], ["sits runs two dog onion"],
    ["a chef prepares a meal in a small kitchen while two people talk and a dog sleeps under the table at night"],
]


@pytest.fixture(scope="module")
def scorer():
    from capreward.backbones import CLIPBackbone
    from capreward.testing import tiny_clip_factory

    # batch_size=1: each caption is encoded in its own pass of the text tower (see EMScore's batch_size)
    corpus = [r for refs in REFERENCES for r in refs] + ["a man", "a woman walks a dog in the park"]
    return EMScore(backbone=CLIPBackbone(tiny_clip_factory(seed=0)), idf=corpus, batch_size=1)


@pytest.fixture(scope="module")
def clips():
    return [random_video(seed, frames=8 + seed) for seed in range(3)]


@pytest.fixture(scope="module")
def alone(scorer, clips):
    # quiet while scoring the pool, and the logger's level restored after: other test files read its records
    root = logging.getLogger("capreward")
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        pool = NEAR_SINGULAR + ORDINARY
        return pool, [
            scorer.score([c], videos=[clips[v]], references=[REFERENCES[k % 4]]) for k, (c, v) in enumerate(pool)
        ]
    finally:
        root.setLevel(level)


def test_the_pool_holds_samples_at_the_singularity(alone):
    pool, results = alone
    sums = [abs(r.video.fine_p.item() + r.video.fine_r.item()) for r in results[: len(NEAR_SINGULAR)]]
    assert max(sums) < 1e-4 and min(sums) < 2e-5
    assert max(abs(r.video.fine_f.item()) for r in results) > 100  # F amplified far past [-1, 1]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_sub_score_is_the_same_alone_and_in_any_batch_or_order(scorer, clips, alone, data):
    pool, results = alone
    idx = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=8))
    scorer.backbone.text_cache.clear()  # the text passes run again, in this batch
    batched = scorer.score([pool[i][0] for i in idx], videos=[clips[pool[i][1]] for i in idx],
                           references=[REFERENCES[i % 4] for i in idx])
    for j, i in enumerate(idx):
        for part in ("video", "reference", "combined"):
            for name, t in getattr(results[i], part).as_dict().items():
                assert_same(getattr(batched, part).as_dict()[name][j : j + 1], t, f"{pool[i][0]!r} {part}.{name}")
        assert_same(batched.score[j : j + 1], results[i].score, f"{pool[i][0]!r} score")
