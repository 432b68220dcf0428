"""VisCE² on the local chat judge: the trained tiny judge's contexts and integer answers, context caching
(counted backend calls, memory and disk), the expected score, and error rows."""

from __future__ import annotations

import numpy as np
import pytest

from capreward import VisCE2
from capreward.judges.protocol import ChatRequest, ChatResponse, SyncBackendMixin, user_turn
from capreward.judges.vlm_prompts import VISCE2_CONTEXT_PROMPT, visce2_prompt
from capreward.metrics.gveval import expected_score
from capreward.testing.tiny_vlm_judges import VISCE2_ANSWERS, VISCE2_TOO_HIGH, context_answer, probe_image
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def backend(vlm_judge):
    return vlm_judge


class CountingBackend(SyncBackendMixin):
    """A real backend that counts context and rating requests and can fail some of them (as a remote
    backend reports a request that failed after its retries)."""

    def __init__(self, inner, name=None, fail_context=False, fail_caption=None):
        self.inner = inner
        self.name = name or inner.name
        self.fail_context, self.fail_caption = fail_context, fail_caption
        self.context_calls = self.rating_calls = 0

    def generate(self, requests):
        out = []
        for r in requests:
            is_context = r.turns[0].text == VISCE2_CONTEXT_PROMPT
            self.context_calls += is_context
            self.rating_calls += not is_context
            if (is_context and self.fail_context) or (
                not is_context and self.fail_caption and f"Candidate:\n{self.fail_caption}\n" in r.turns[0].text
            ):
                out.append(ChatResponse(text="", error="connection reset after 3 retries"))
            else:
                out.append(None)
        todo = [i for i, o in enumerate(out) if o is None]
        for i, answer in zip(todo, self.inner.generate([requests[i] for i in todo])):
            out[i] = answer
        return out


def test_tiny_judge_answers_in_visce2_formats(backend):
    image = probe_image("visce2", "green")
    context = backend.generate([ChatRequest(turns=(user_turn(VISCE2_CONTEXT_PROMPT, [image]),))])[0]
    assert context.text == context_answer("green")
    rating = backend.generate([ChatRequest(turns=(user_turn(visce2_prompt("a green ball", context.text), [image]),))])
    assert rating[0].text == str(VISCE2_ANSWERS["green"])


def test_visce2_scores_and_formats(backend):
    v = VisCE2(backend)
    captions = ["a green ball", "a blue kite", "a photo of a kite", "many blue balls", "a red car"]
    colours = ["green", "blue", "yellow", "blue", "green"]
    r = v.score(captions, [probe_image("visce2", c) for c in colours])
    assert r.score[0] == VISCE2_ANSWERS["green"] and r.error[0] is None
    assert r.score[1] == 100 and r.error[1] is None
    assert r.score[2] == 0 and "no integer" in r.error[2] and r.raw[2] == "no idea"
    # an integer above 100 is kept as the release keeps it, and flagged (a reward guards its own range)
    assert r.score[3] == int(VISCE2_TOO_HIGH) and "outside 0..100" in r.error[3] and r.raw[3] == VISCE2_TOO_HIGH
    assert r.score[4] == VISCE2_ANSWERS["green"]
    assert r.context == [context_answer(c) for c in colours]
    assert r.expected is None


def test_visual_context_generated_once_per_image_and_cached(backend, tmp_path):
    counting = CountingBackend(backend)
    v = VisCE2(counting, cache_dir=tmp_path)
    green, blue = probe_image("visce2", "green"), probe_image("visce2", "blue")
    captions = ["a green ball", "a blue kite", "the ball is green", "a red box", "blue", "a green car"]
    images = [green, blue, green.copy(), blue, blue, green]  # a copy has the same pixels: same context
    first = v.score(captions, images)
    assert counting.context_calls == 2 and counting.rating_calls == 6
    again = v.score(captions[:2], images[:2])
    assert counting.context_calls == 2 and counting.rating_calls == 8  # memory cache
    assert list(again.score) == list(first.score[:2])
    fresh = CountingBackend(backend)
    from_disk = VisCE2(fresh, cache_dir=tmp_path).score(captions, images)
    assert fresh.context_calls == 0 and from_disk.context == first.context  # disk cache
    other_model = CountingBackend(backend, name="another-model")
    VisCE2(other_model, cache_dir=tmp_path).score(captions[:1], images[:1])
    assert other_model.context_calls == 1  # the key includes the model name


def test_visce2_expected_score_from_the_exact_distribution(backend):
    v = VisCE2(backend, expected=True)
    images = [probe_image("visce2", "green"), probe_image("visce2", "yellow")]
    r = v.score(["a green ball", "a photo of a kite"], images)
    assert abs(r.expected[0] - r.score[0]) < 3 and r.expected_error[0] is None
    # independently: the distribution after the answer's leading space, from the backend itself
    request = ChatRequest(turns=(user_turn(visce2_prompt("a green ball", r.context[0]), [images[0]]),), max_tokens=32)
    response = backend.generate([request])[0]
    prefix = backend.number_prefix(response.token_ids)
    assert r.expected[0] == pytest.approx(expected_score(backend.integer_distributions([request], [prefix])[0]))
    assert np.isnan(r.expected[1]) and "no number" in r.expected_error[1]


def test_visce2_error_rows_keep_their_place(backend):
    images = [probe_image("visce2", "green"), None, probe_image("visce2", "blue"), probe_image("visce2", "red")]
    captions = ["a green ball", "a green ball", "a blue kite", "a red car"]
    failing = CountingBackend(backend, fail_caption="a blue kite")
    r = VisCE2(failing).score(captions, images)
    assert np.isnan(r.score[1]) and "missing" in r.error[1] and r.context[1] == ""
    assert np.isnan(r.score[2]) and "rating failed" in r.error[2]
    assert r.score[0] == VISCE2_ANSWERS["green"] and r.score[3] == VISCE2_ANSWERS["red"]
    no_context = CountingBackend(backend, fail_context=True)
    r = VisCE2(no_context).score(captions[:1], images[:1])
    assert np.isnan(r.score[0]) and "visual context failed" in r.error[0] and no_context.rating_calls == 0
    # a failed context is not cached: the next call asks again and succeeds
    recovered = VisCE2(backend).score(captions[:1], images[:1])
    assert recovered.score[0] == VISCE2_ANSWERS["green"]


def test_visce2_argument_errors(backend):
    v = VisCE2(backend)
    with pytest.raises(ValueError, match="2 candidates but 1 images"):
        v.score(["a", "b"], [probe_image("visce2", "red")])
    with pytest.raises(TypeError, match="candidate 0"):
        v.score([None], [probe_image("visce2", "red")])


# ------------------------------------------------------------- what a server receives (the release)
@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    from capreward.testing.chat_server import ChatServer

    with ChatServer("echo", model="echo-judge", log_path=tmp_path_factory.mktemp("visce2-echo") / "log") as server:
        yield server


def _echo_judge(server):
    from capreward.judges.remote import OpenAIJudge

    return OpenAIJudge(server.base_url, "echo-judge", api_key_env=None, max_retries=0)


@pytest.mark.parametrize("variant", ["visce_2", "visce"])
def test_visce2_requests_use_the_release_heads_prompt_and_budgets(echo_server, variant):
    echo_server.control(reset=True)
    image = probe_image("visce2", "green")
    r = VisCE2(_echo_judge(echo_server), prompt=variant).score(["a green ball"], [image])
    context_body, rating_body = echo_server.requests()
    assert context_body["messages"][0]["content"][-1]["text"] == VISCE2_CONTEXT_PROMPT
    context = "echo: " + VISCE2_CONTEXT_PROMPT  # what the echo server answered
    assert rating_body["messages"][0]["content"][-1]["text"] == visce2_prompt("a green ball", context, variant)
    for body in (context_body, rating_body):
        assert body["max_tokens"] == 1024 and body["temperature"] == 0.0  # the release's budget, greedy
    # the rating answer echoes the prompt: its first ASCII integer ("0" of "0 to 100" in the head's prompt,
    # "1" of the context's "Object 1" in the earlier one) is the score, as the release reads it
    import re

    first = int(re.findall(r"[0-9]+", r.raw[0])[0])
    assert first == (0 if variant == "visce_2" else 1)
    assert r.context == [context] and r.score[0] == first and r.error[0] is None


def test_visce2_released_preset_samples_at_temperature_0_2(echo_server):
    echo_server.control(reset=True)
    scorer = VisCE2.released(_echo_judge(echo_server))
    scorer.score(["a green ball"], [probe_image("visce2", "green")])
    bodies = echo_server.requests()
    assert [(b["temperature"], b["max_tokens"]) for b in bodies] == [(0.2, 1024), (0.2, 1024)]
    assert scorer.context_key("k") != VisCE2(_echo_judge(echo_server)).context_key("k")  # contexts not shared
    with pytest.raises(ValueError, match="prompt"):
        VisCE2(_echo_judge(echo_server), prompt="visce_3")


def test_visce2_reward_guards_its_range(backend):
    from capreward.rewards import VisCE2Reward

    reward = VisCE2Reward(backend=backend)
    images = [probe_image("visce2", "green"), probe_image("visce2", "red")]
    logged = {}
    values = reward(None, ["a green ball", "many red cars"], image=images, log_extra=logged.__setitem__)
    assert values[0] == pytest.approx(VISCE2_ANSWERS["green"] / 100)
    assert values[1] is None and f"{VISCE2_TOO_HIGH}, outside 0..100" in logged["visce2/error"][1]  # no reward of 1.5


def test_the_context_cache_is_a_bounded_lru(backend):
    """At most ``context_cache_size`` contexts stay in memory, the least recently used leaving first; a
    call with more distinct images than that still gets every context."""
    from capreward.rewards import VisCE2Reward

    images = {c: probe_image("visce2", c) for c in ("green", "blue", "red")}
    counting = CountingBackend(backend)
    v = VisCE2(counting, context_cache_size=2)

    def ask(colour: str) -> None:
        assert v.score([f"a {colour} ball"], [images[colour]]).context == [context_answer(colour)]

    ask("green"), ask("blue")
    assert counting.context_calls == 2 and len(v.cache) == 2
    ask("green")  # a hit, and now the most recently used
    assert counting.context_calls == 2
    ask("red")  # evicts blue, the least recently used
    assert counting.context_calls == 3 and len(v.cache) == 2
    ask("green")
    assert counting.context_calls == 3
    ask("blue")
    assert counting.context_calls == 4 and len(v.cache) == 2
    small = VisCE2(CountingBackend(backend), context_cache_size=1)
    r = small.score(["a green ball", "a blue kite", "a red car"], [images[c] for c in ("green", "blue", "red")])
    assert r.context == [context_answer(c) for c in ("green", "blue", "red")] and len(small.cache) == 1
    assert len(VisCE2(backend, context_cache_size=0).cache) == 0
    assert VisCE2Reward(backend=backend, context_cache_size=3).scorer.cache.max_entries == 3
    with pytest.raises(ValueError, match="context cache size"):
        VisCE2(backend, context_cache_size=-1)
