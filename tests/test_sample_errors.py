"""The per-sample error model: a :class:`SampleError` (index, kind, item, message) that is also the text
every consumer writes, the one per-sample rule (:func:`sample_failure`), and the same failing sample
giving the same kind and message through the reward, the torchmetrics metric, the job and the server."""

from __future__ import annotations

import copy
import json
import logging
import math
import pickle

import pytest
from PIL import Image

from capreward.errors import (KINDS, NO_SCORE, SampleError, common_kind, failures, sample_failure, summarize,
                              written)
from capreward.media import MediaError, MediaRefused


# ------------------------------------------------------------------------------------- the object
def test_a_sample_error_is_its_written_text_and_carries_its_fields():
    e = SampleError(3, "media", "completions[3]", "image 'a.png': cannot decode image")
    assert e == "completions[3]: image 'a.png': cannot decode image" == written(e.item, e.message)
    assert isinstance(e, str) and type(e.text) is str and e.text == e
    assert (e.index, e.kind, e.item, e.message) == (3, "media", "completions[3]", "image 'a.png': cannot decode image")
    assert repr(e) == repr(e.text) and repr([e, None]) == repr([e.text, None])  # lists of reasons print as before
    assert json.dumps({"errors": {"clip_s": e}}) == json.dumps({"errors": {"clip_s": e.text}})
    assert hash(e) == hash(e.text) and e in {e.text}
    assert "cannot decode" in e and e.startswith("completions[3]")  # str behaviour is the text's
    with pytest.raises(AttributeError):
        e.kind = "input"  # frozen
    assert SampleError(0, "input", "", "empty caption") == "empty caption"  # no item: the message alone
    assert SampleError(1, "input", "completions[1]", "is empty", " ") == "completions[1] is empty"


@pytest.mark.parametrize("copier", [lambda e: pickle.loads(pickle.dumps(e)), copy.deepcopy, copy.copy])
def test_a_sample_error_survives_pickling_and_copies_with_its_kind(copier):
    e = SampleError(2, "judge_unreadable", "completions[2]", "no score: no integer after 'The final score is'")
    back = copier(e)
    assert type(back) is SampleError and back == e and back.fields() == e.fields()


def test_unknown_kinds_are_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        SampleError(0, "oops", "", "x")
    assert set(KINDS) >= {"input", "no_visual", "media", "refused", "limit", "judge_unavailable", "judge_unreadable",
                          "non_finite", "scorer"}


def test_renaming_and_nesting_keep_the_kind():
    e = SampleError(12, "input", "completions[12]", "is empty", " ")
    local = e.renamed(1, "query[1]")
    assert local == "query[1] is empty" and local.kind == "input" and local.index == 1
    part = SampleError(4, "media", "completions[4]", "image item 0 ('b.png'): cannot decode image")
    whole = part.within(2, "image 1 of 2")
    assert whole == f"image 1 of 2: {part}" and whole.kind == "media" and whole.index == 2
    named = SampleError.naming(0, "input", "references[0]", "references[0][1] is empty")
    assert named == "references[0][1] is empty" and named.item == "references[0]"
    assert named.renamed(5, "labels[5] references") == "labels[5] references[1] is empty"
    assert SampleError.naming(0, "input", "completions[0]", "something else") == "something else"


def test_of_wraps_plain_text_with_the_kind_its_producer_states_and_keeps_an_objects_kind():
    assert SampleError.of(None, 0) is None
    plain = SampleError.of("judge answer 'x' has no score", 3, "completions[3]", kind="judge_unreadable")
    assert plain == "completions[3]: judge answer 'x' has no score" and plain.kind == "judge_unreadable"
    typed = SampleError(None, "judge_unavailable", "", "judge request failed: 503")
    # an object's kind wins over the caller's default: the text is never read to find one
    assert SampleError.of(typed, 3, "completions[3]", kind="judge_unreadable").kind == "judge_unavailable"
    assert SampleError.of(typed, 7).index == 7 and SampleError.of(typed, 7) == typed


def test_from_exception_reads_the_exception_type_not_its_text():
    media = SampleError.from_exception(MediaError("item 0 ('a.png')", "cannot decode image"), 0)
    assert (media.kind, media.item, media.message) == ("media", "item 0 ('a.png')", "cannot decode image")
    assert media == str(MediaError("item 0 ('a.png')", "cannot decode image"))
    refused = SampleError.from_exception(MediaRefused("item 0 ('x')", "not a file under the server's media root"))
    assert refused.kind == "refused"
    # a ValueError whose text looks like a media error is still an input error
    assert SampleError.from_exception(ValueError("item 0 ('a.png'): cannot decode image")).kind == "input"
    assert SampleError.from_exception(RuntimeError("CUDA out of memory")) == "RuntimeError: CUDA out of memory"
    assert SampleError.from_exception(RuntimeError("x")).kind == "scorer"
    assert SampleError.from_exception(ValueError("x"), kind="scorer").kind == "scorer"


# ---------------------------------------------------------------------------------------- the policy
def test_sample_failure_is_the_one_rule_of_a_failed_sample():
    assert sample_failure(0, 0.25, None) is None and sample_failure(0, 0.0, "ignored: the sample is scored") is None
    none = sample_failure(1, None, None, item="completions[1]")
    assert none == f"completions[1]: {NO_SCORE}" and none.kind == "scorer"
    why = sample_failure(2, None, "empty caption", kind="input")
    assert why == "empty caption" and why.kind == "input" and why.index == 2
    for bad in (math.nan, math.inf, -math.inf):
        e = sample_failure(3, bad, None)
        assert e.kind == "non_finite" and e == f"non-finite value ({bad})"
    assert sample_failure(3, math.inf, "the judge said so") == "non-finite value (inf): the judge said so"
    assert sample_failure(3, math.nan, None, non_finite="the reward returned {value}") == "the reward returned nan"
    assert sample_failure(4, "not a number", None).kind == "non_finite"


def test_failures_and_summary_of_a_batch():
    got = failures([0.5, None, math.nan, 1.0, None], [None, "empty caption", None, None, None], kind="input")
    assert [(e.index, e.kind) for e in got] == [(1, "input"), (2, "non_finite"), (4, "scorer")]
    assert summarize(got) == "[1] empty caption; [2] non-finite value (nan); [4] no score"
    assert summarize(got, limit=1) == "[1] empty caption; ... 2 more"
    assert summarize(got, limit=1, more=False) == "[1] empty caption"
    assert common_kind([SampleError(0, "refused", "", "a"), SampleError(0, "refused", "", "b")]) == "refused"
    assert common_kind([SampleError(0, "refused", "", "a"), "plain"]) == "scorer"
    assert common_kind([SampleError(0, "refused", "", "a"), SampleError(0, "media", "", "b")]) == "scorer"


# ------------------------------------------------------------- one failing sample, every consumer
PROMPT = "<|im_start|>user\ndescribe the picture<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """A media root with a readable image and one that cannot be decoded (a text file named .png)."""
    root = tmp_path_factory.mktemp("media")
    Image.new("RGB", (32, 32), (200, 30, 30)).save(root / "red.png")
    (root / "text.png").write_bytes(b"this is not an image, it is a text file\n" * 20)
    return root


def media_problem(path) -> str:
    """What the media layer says of the file (the message every consumer must carry)."""
    from capreward.media import load_image

    with pytest.raises(MediaError) as info:
        load_image(str(path))
    return info.value.problem


def ask_server(server, captions, images) -> list:
    status, body = server.post({"query": [PROMPT + c for c in captions], "prompts": [PROMPT] * len(captions),
                                "labels": [json.dumps({"image": name}) for name in images]})
    assert status == 200, body
    return body["errors"]


def test_an_unreadable_image_is_the_same_media_error_in_the_reward_metric_job_and_server(tiny_clip_path, pictures):
    from serve_process import Server

    from capreward.torchmetrics import CLIPScoreMetric
    from capreward.jobs.manifest import ManifestRow
    from capreward.jobs.runners import ManifestScorer, ScoreOptions
    from capreward.rewards import CLIPScoreReward

    problem = media_problem(pictures / "text.png")
    good, bad = str(pictures / "red.png"), str(pictures / "text.png")
    captions = ["a red square", "a blue circle"]

    reward = CLIPScoreReward(model=str(tiny_clip_path))
    out = reward.compute(None, captions, image=[good, bad])
    assert out.values[0] is not None and out.values[1] is None
    from_reward = out.reasons[1]
    assert (from_reward.kind, from_reward.index, from_reward.item) == ("media", 1, "completions[1]")

    metric = CLIPScoreMetric(scorer=reward.scorer, visual="image")  # a metric raises on a bad visual, naming it
    with pytest.raises(MediaError) as info:
        metric.update(captions, [good, bad])
    from_metric = SampleError.from_exception(info.value, 1)

    scorer = ManifestScorer(ScoreOptions(metrics=["clip_s"], clip_model=str(tiny_clip_path)), backbone=reward.scorer.backbone)
    rows = [ManifestRow("a", captions[0], "image", good), ManifestRow("b", captions[1], "image", bad)]
    results = scorer.score_rows(rows)
    assert results[0]["errors"] is None
    from_job = results[1]["errors"]["clip_s"]
    assert (from_job.kind, from_job.item) == ("media", "row 'b'") and from_job == f"row 'b': {problem} ({bad})"

    server = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(pictures)])
    try:
        from_server = ask_server(server, captions, ["red.png", "text.png"])
    finally:
        assert server.stop() == 0
    assert from_server[0] is None and from_server[1].startswith("query[1]: ")

    for error in (from_reward, from_metric, from_job):
        assert error.kind == "media" and error.message.count(problem) == 1, error
    # the server opens the file inside its media root (PIL sees a file object, not a name) and hides the root
    core = problem.partition(" (")[0]
    assert from_server[1] == f"query[1]: image input ('<media-root>/text.png'): {core}"
    # the reward and the server name the sample their own way around one text
    assert from_reward.message.endswith(f": {problem}") and from_metric.message == problem


def test_an_unreadable_judge_answer_is_the_same_error_in_the_reward_metric_job_and_server(pictures, monkeypatch, caplog):
    """A real chat server whose answers carry no score (the echo backend): every consumer reports the
    G-VEval scorer's own reason, kind ``judge_unreadable``."""
    from serve_process import Server

    from capreward.torchmetrics import GVEvalMetric
    from capreward.jobs.manifest import ManifestRow
    from capreward.jobs.runners import ManifestScorer, ScoreOptions
    from capreward.judges.remote import DEFAULT_API_MODEL, OpenAIJudge
    from capreward.rewards import GVEvalReward
    from capreward.testing.chat_server import ChatServer

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    good = str(pictures / "red.png")
    caption = "a red square"
    with ChatServer("echo", model=DEFAULT_API_MODEL, log_path=pictures / "chat.log") as chat:
        judge = OpenAIJudge(chat.base_url, max_retries=0, top_logprobs_cap=20)
        reward = GVEvalReward(backend=judge, tree_top_logprobs=20)  # as the server and the job build it
        out = reward.compute(None, [caption], image=[good])
        from_reward = out.reasons[0]
        assert out.values == [None] and from_reward.item == "completions[0]"

        metric = GVEvalMetric(scorer=reward.scorer, visual="image")
        with caplog.at_level(logging.INFO, logger="capreward.torchmetrics.metrics"):
            metric.update([caption], [good])
        logged = [r for r in caplog.records if "judge answers gave no score" in r.getMessage()]
        assert len(logged) == 1 and math.isnan(float(metric.compute()))
        from_metric = logged[0].args[-1]

        options = ScoreOptions(metrics=["gveval"], judge_base_url=chat.base_url, judge_top_logprobs_cap=20)
        (row,) = ManifestScorer(options).score_rows([ManifestRow("a", caption, "image", good)])
        from_job = row["errors"]["gveval"]
        assert row["gveval"] is None

        server = Server(["--reward", "gveval", "--judge-url", chat.base_url, "--judge-model", DEFAULT_API_MODEL,
                         "--media-root", str(pictures)])
        try:
            (from_server,) = ask_server(server, [caption], ["red.png"])
        finally:
            assert server.stop() == 0

    scorer_says = from_job  # the job writes the scorer's reason as it is
    assert scorer_says.kind == "judge_unreadable" and scorer_says.startswith("no score")
    for error in (from_reward, from_metric):
        assert isinstance(error, SampleError) and error.kind == "judge_unreadable"
    assert from_reward == f"completions[0]: {scorer_says}" and from_reward.message == scorer_says
    assert from_metric == scorer_says
    assert from_server == f"query[0]: {scorer_says}"
