"""FLEUR from top-logprobs (RemoteFLEUR): the reading math by hand, and through a real chat server that
serves the trained tiny judge, against the local FLEUR scorer."""

from __future__ import annotations

import math
import random

import pytest
import torch

from capreward.judges.protocol import ChatResponse, TokenLogprob
from capreward.judges.remote import OpenAIJudge
from capreward.metrics.fleur import ONE, ONE_DECIMAL, TWO_DECIMALS
from capreward.scorers.fleur_remote import RemoteFLEUR, read_answer, read_step, rule_weights
from capreward.testing.chat_server import ChatServer

from fixtures_llava import colour_images, fleur, one_torch_thread, tiny_judge, tiny_judge_path  # noqa: F401

LN = math.log


def tok(text: str, top: dict[str, float] | None = None) -> TokenLogprob:
    return TokenLogprob(text, 0.0, top or {})


# ---------------------------------------------------------------------------------- pure math
def test_rule_weights_are_the_fleur_functionals():
    assert rule_weights(ONE_DECIMAL)[0].tolist() == pytest.approx([0.1 * d for d in range(10)])
    assert rule_weights(ONE_DECIMAL)[1].tolist() == [0.0] * 10
    assert rule_weights(TWO_DECIMALS)[1].tolist() == pytest.approx([0.01 * d for d in range(10)])
    assert rule_weights(ONE)[0].tolist() == pytest.approx([0.9, 1.0] + [0.0] * 8)


def test_read_answer_finds_the_digit_steps():
    reading = read_answer([tok(" "), tok("0"), tok("."), tok("8"), tok("5")])
    assert (reading.rule, reading.steps, reading.digits, reading.value) == (TWO_DECIMALS, (3, 4), (8, 5), 0.85)
    reading = read_answer([tok("1"), tok("."), tok("0")])
    assert (reading.rule, reading.steps, reading.digits) == (ONE, (0,), (1,))
    reading = read_answer([tok("0"), tok("."), tok(" 7")])  # whitespace before a digit is allowed
    assert (reading.rule, reading.steps) == (ONE_DECIMAL, (2,))
    merged = read_answer([tok("0"), tok("."), tok("85")])  # tiktoken-style: two digits in one token
    assert not merged.ok and "one token per digit" in merged.error
    assert "outside [0, 1]" in read_answer([tok("1"), tok("."), tok("5")]).error
    assert "no tokens" in read_answer([]).error


def test_read_step_is_exact_when_every_weighted_digit_is_listed():
    probs = [0.01, 0.02, 0.03, 0.04, 0.1, 0.2, 0.3, 0.15, 0.1, 0.04]  # sums to 0.99
    top = {str(d): LN(p) for d, p in enumerate(probs)} | {"x": LN(0.005)}
    step = read_step(tok("6", top), rule_weights(ONE_DECIMAL)[0])
    assert step.exact and step.bound == 0.0 and step.listed == 10
    assert step.probs.tolist() == pytest.approx(probs)  # full-vocabulary, not renormalised
    # "1.0": only p(0) and p(1) are weighted, so other digits may be missing
    step = read_step(tok("1", {"1": LN(0.7), "0": LN(0.2), "x": LN(0.05)}), rule_weights(ONE)[0])
    assert step.exact and step.probs[0] == pytest.approx(0.2) and math.isnan(step.probs[5])


def test_read_step_renormalises_and_bounds_when_digits_are_missing():
    # listed: p0=.1, p5=.6, p6=.2 and a non-digit .05 (total .95): digits 1-4, 7-9 are missing
    top = {"5": LN(0.6), "6": LN(0.2), "0": LN(0.1), "x": LN(0.05)}
    step = read_step(tok(" 5", {" " + k if k != "x" else k: v for k, v in top.items()}), rule_weights(ONE_DECIMAL)[0])
    assert not step.exact and step.listed == 3
    assert step.probs[5].item() == pytest.approx(0.6 / 0.9) and step.probs[6].item() == pytest.approx(0.2 / 0.9)
    # renormalising adds Z (1/P - 1) = 0.42 * (1/0.9 - 1); the missing digits remove at most
    # 0.9 * min(1 - 0.95, 7 * 0.05) = 0.045: the bound is the larger of the two
    assert step.bound == pytest.approx(0.42 * (1 / 0.9 - 1))
    with pytest.raises(ValueError, match="no digit"):
        read_step(tok("5", {"x": LN(0.5)}), rule_weights(ONE_DECIMAL)[0])


def test_unanswered_samples_keep_their_slot_with_a_reason():
    scorer = RemoteFLEUR(OpenAIJudge("http://127.0.0.1:9/v1", "m", api_key_env=None), tolerance=None)
    responses = [
        ChatResponse(text="", error="request 0 failed after 6 attempts: HTTP 500"),
        None,
        ChatResponse(text="0.5", tokens=(tok("0"), tok("."), tok("5")), finish_reason="length"),
        ChatResponse(text="0.5", tokens=(tok("0"), tok("."), tok("5", {"5": LN(0.5), "4": LN(0.25)})), finish_reason="stop"),
    ]
    result = scorer.read(responses)
    assert torch.isnan(result.score[:3]).all()
    assert "judge request failed: request 0" in result.error[0] and result.error[1] == "empty caption"
    assert "did not end" in result.error[2]
    # 0.5 read from p5 = .5, p4 = .25 renormalised: 0.1 * (5 * 2/3 + 4 * 1/3)
    assert result.score[3].item() == pytest.approx(0.1 * (5 * 2 / 3 + 4 / 3), abs=1e-6)
    assert result.rule == [None, None, None, ONE_DECIMAL] and result.exact == [False] * 4
    # by default a score over part of the digits is refused: NaN and the bound in the reason
    strict = RemoteFLEUR(OpenAIJudge("http://127.0.0.1:9/v1", "m", api_key_env=None)).read(responses)
    assert math.isnan(strict.score[3].item()) and "missing from the top-20 alternatives" in strict.error[3]
    assert strict.bound[3].item() == pytest.approx(result.bound[3].item())


def test_failed_requests_give_nan_and_reasons_not_exceptions(colour_images):
    judge = OpenAIJudge("http://127.0.0.1:9/v1", "m", api_key_env=None, max_retries=1, timeout=2)
    result = RemoteFLEUR(judge).score(["a red car", "", "a blue kite"], [colour_images["red"]] * 3)
    assert torch.isnan(result.score).all()
    assert "connection error" in result.error[0] and "connection error" in result.error[2]
    assert result.error[1] == "empty caption" and result.responses[1] is None


# --------------------------------------------------------------------------- through a server
@pytest.fixture(scope="module")
def server(tiny_judge_path, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("fleur-server") / "server.log"
    with ChatServer("local", judge_dir=tiny_judge_path, model="tiny-judge", log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def samples():
    from capreward.testing import FLEUR_PROBES, fleur_task_image

    captions = [caption for colour, caption in FLEUR_PROBES.values()] + ["", "a green kite", "the ball is blue"]
    images = [fleur_task_image(colour, random.Random(k)) for k, (colour, _) in FLEUR_PROBES.items()]
    images += images[:3]
    references = [["a red car", "the car is red"]] * len(captions)
    return captions, images, references


def remote(server, k: int, **options) -> RemoteFLEUR:
    # max_tokens=None: the tiny judge's 512-position context cannot hold a prompt plus the release's 512
    judge = OpenAIJudge(server.base_url, "tiny-judge", api_key_env=None, timeout=60)
    return RemoteFLEUR(judge, top_logprobs=k, max_tokens=options.pop("max_tokens", None), **options)


@pytest.mark.parametrize("with_references", [False, True], ids=["FLEUR", "RefFLEUR"])
def test_equals_local_fleur_when_top20_lists_the_digits(server, fleur, samples, with_references):  # noqa: F811
    captions, images, references = samples
    refs = references if with_references else None
    local = fleur.score(captions, images, refs)
    got = remote(server, 20).score(captions, images, refs)
    assert got.raw == local.raw and got.error == local.error and got.rule == local.rule
    assert {r for r in got.rule} >= {ONE, ONE_DECIMAL, TWO_DECIMALS, None}
    scored = [i for i, r in enumerate(got.rule) if r is not None]
    assert all(got.exact[i] for i in scored) and (got.bound[scored] == 0).all()
    torch.testing.assert_close(got.score, local.score, atol=1e-5, rtol=0, equal_nan=True)
    torch.testing.assert_close(got.raw_score, local.raw_score, equal_nan=True)
    listed = ~torch.isnan(got.digit_probs)
    torch.testing.assert_close(got.digit_probs[listed], local.digit_probs[listed].float(), atol=1e-5, rtol=0)


def test_fewer_alternatives_deviate_within_the_reported_bound(server, fleur, samples):  # noqa: F811
    captions, images, _ = samples
    local = fleur.score(captions, images)
    scored = [i for i, r in enumerate(local.rule) if r is not None]
    deviations = []
    for k in (2, 5):
        strict = remote(server, k).score(captions, images)  # default: exact or NaN with the reason
        for i in scored:
            if strict.exact[i]:
                assert abs(strict.score[i].item() - local.score[i].item()) <= 1e-5
            else:
                assert math.isnan(strict.score[i].item()) and "missing from the top" in strict.error[i]
        got = remote(server, k, tolerance=None).score(captions, images)
        assert got.raw == local.raw and got.rule == local.rule  # the greedy answer does not depend on k
        for i in scored:
            gap = abs(got.score[i].item() - local.score[i].item())
            assert gap <= got.bound[i].item() + 1e-5, (k, i, gap, got.bound[i].item())
            if got.exact[i]:
                assert gap <= 1e-5
            else:
                deviations.append(gap)
    assert deviations and max(deviations) > 1e-3  # the approximation is visible, and bounded


def test_async_scoring_and_explanations_match_local(server, fleur, samples):  # noqa: F811
    import asyncio

    captions, images, _ = samples
    scorer = remote(server, 20)
    scorer.explain_max_tokens = 24
    sync = scorer.score(captions[:4], images[:4])
    concurrent = asyncio.run(scorer.ascore(captions[:4], images[:4]))
    torch.testing.assert_close(concurrent.score, sync.score, equal_nan=True)
    scores = [0.5, 0.25, 1.0, 0.0]
    explained = scorer.explain(captions[:4], images[:4], scores=scores)
    assert [r.text for r in explained] == fleur.explain(captions[:4], images[:4], scores=scores, max_new_tokens=24)


# ----------------------------------------------------------------- what the server receives (release)
def _received_image(body):
    import base64
    import io

    from PIL import Image

    parts = [p for p in body["messages"][0]["content"] if p["type"] == "image_url"]
    assert len(parts) == 1
    data = parts[0]["image_url"]["url"].split(";base64,", 1)[1]
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


def test_images_are_padded_to_a_square_in_the_mean_colour_as_released(server, samples):
    import numpy as np

    captions, images, _ = samples
    original = images[0]
    width, height = original.size
    assert width != height
    server.control(reset=True)
    remote(server, 20).score(captions[:1], images[:1])
    sent = _received_image(server.requests()[-1])
    side = max(width, height)
    assert sent.size == (side, side)
    pixels = np.asarray(sent)
    left, top = (side - width) // 2, (side - height) // 2
    # LLaVA-1.5's expand2square: CLIP's mean, truncated to 0-255 (122, 116, 104), around the centred image
    assert (pixels[:top] == (122, 116, 104)).all() and (pixels[top + height :] == (122, 116, 104)).all()
    assert (pixels[:, :left] == (122, 116, 104)).all() and (pixels[:, left + width :] == (122, 116, 104)).all()
    assert np.array_equal(pixels[top : top + height, left : left + width], np.asarray(original.convert("RGB")))
    server.control(reset=True)
    remote(server, 20, pad_to_square=False).score(captions[:1], images[:1])
    assert _received_image(server.requests()[-1]).size == (width, height)


def test_llava_v1_template_makes_the_server_render_the_released_prompt(server, fleur, samples):  # noqa: F811
    from capreward.judges.prompts import LLAVA_V1_CHAT_TEMPLATE, render_chat_template

    captions, images, references = samples
    server.control(reset=True)
    got = remote(server, 20, llava_v1_template=True).score(captions[:4], images[:4], references[:4])
    bodies = server.requests()
    assert len(bodies) == 4 and all(b["chat_template"] == LLAVA_V1_CHAT_TEMPLATE for b in bodies)
    # rendered as vLLM renders a request's template: the released conversation, BOS first
    by_caption = {b["messages"][0]["content"][-1]["text"]: b for b in bodies}
    for caption, refs, prompt in zip(captions[:4], references[:4], fleur.prompts(captions[:4], references[:4])):
        from capreward.judges.prompts import fleur_prompt

        body = by_caption[fleur_prompt(caption, refs)]
        assert render_chat_template(body["chat_template"], body["messages"]) == "<s>" + prompt
    local = fleur.score(captions[:4], images[:4], references[:4])
    assert got.raw == local.raw
    torch.testing.assert_close(got.score, local.score, atol=1e-5, rtol=0, equal_nan=True)
