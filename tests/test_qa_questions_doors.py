"""Issue 43 item 5: QA questions get the same validation from labels, ``extra_info``, dataset columns and
the scorer's API; a label naming several images is scored on all of them.

The dataset column skipped the label bounds (65 questions, options as a string, duplicate or empty
options, a 150,000-character option; JSON text nested 60,000 deep raised ``RecursionError`` out of the
reward), and a label with ``"options": "ab"`` was read as the two options "a" and "b". A two-image
``images`` label was scored on its first image while the API and the jobs aggregate every image.
"""

from __future__ import annotations

import math

import pytest

from capreward.adapters.labels import LabelError, parse_label
from capreward.scorers.qa_questions import MAX_QUESTIONS, InvalidQuestions, Question, questions_of
from capreward.testing.tiny_qa_judge import colour_questions

GOOD = colour_questions("red")
Q = GOOD[0]


def hostile() -> dict[str, tuple[object, str]]:
    """Each case of the round-4 report: (questions, what the refusal says)."""
    return {
        "65 questions": ([Q] * (MAX_QUESTIONS + 1), "65 questions; at most 64"),
        "options as a string": ([{**Q, "options": "ab", "answer": 0}], "options must be a list of strings"),
        "duplicate options": ([{**Q, "options": ["red", "blue", " Red "], "answer": 0}], "options A and C are the same"),
        "empty option": ([{**Q, "options": ["red", "  "], "answer": 0}], "option B is blank"),
        "long option": ([{**Q, "options": ["red", "b" * 150_000], "answer": 0}], "more than 100000 characters"),
        "deep JSON": ("[" * 60_000 + "]" * 60_000, "nested too deeply"),
        "blank question": ([{**Q, "question": " "}], "the question is blank"),
        "empty list": ([], "empty list"),
        "not JSON": ("[{", "not a JSON list"),
    }


@pytest.mark.parametrize("case", list(hostile()))
def test_one_check_refuses_each_hostile_case_naming_it(case):
    value, message = hostile()[case]
    with pytest.raises(InvalidQuestions) as info:
        questions_of(value, "questions[2]")
    assert message in str(info.value) and "questions[2]" in str(info.value)
    with pytest.raises(LabelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_label({"image": "a.png", "questions": value}, "labels[0]")


def test_well_formed_questions_pass_every_door_unchanged():
    import json

    import numpy as np

    expected = [Question.of(q) for q in GOOD]
    assert questions_of(GOOD) == expected
    assert questions_of(json.dumps(GOOD)) == expected
    as_arrays = [{**q, "options": np.array(q["options"], dtype=object)} for q in GOOD]  # a parquet column
    assert questions_of(as_arrays) == expected
    assert parse_label({"image": "a.png", "questions": GOOD}).questions == [
        {"question": q.question, "options": list(q.options), "answer": q.answer} for q in expected]
    assert questions_of(None) is None


@pytest.fixture(scope="module")
def qa_reward():
    from capreward.rewards.qa_utility import QAUtilityReward
    from capreward.testing.tiny_qa_judge import qa_backend

    return QAUtilityReward(backend=qa_backend())


def test_the_dataset_column_gets_the_same_check_inside_the_reward(qa_reward):
    """Each hostile case costs its own sample (None and the reason), never the batch; the good sample
    scores as it does alone."""
    cases = hostile()
    questions = [GOOD] + [value for value, _ in cases.values()]
    captions = ["a red ball."] * len(questions)
    out = qa_reward.compute(None, captions, questions=questions)
    alone = qa_reward.compute(None, captions[:1], questions=[GOOD])
    assert out.values[0] == pytest.approx(alone.values[0], abs=1e-9) and out.values[0] > 0.5
    for k, (case, (_, message)) in enumerate(cases.items(), start=1):
        assert out.values[k] is None, case
        assert message in str(out.reasons[k]) and out.reasons[k].kind == "input", (case, out.reasons[k])
    # the scorer's own API: NaN and the reason for the bad sample
    result = qa_reward.scorer.score(captions[:2], questions=[GOOD, [{**Q, "options": "ab", "answer": 0}]])
    assert not math.isnan(result.score[0]) and math.isnan(result.score[1])
    assert "options must be a list of strings" in str(result.error[1])


def test_verl_extra_info_gets_the_same_check(qa_reward):
    from capreward.adapters.verl import make_compute_score

    verl = make_compute_score(qa_reward, return_dict=True)
    rows = verl.batch(["d"] * 2, ["a red ball."] * 2, [None] * 2,
                      [{"questions": GOOD}, {"questions": [{**Q, "options": "ab", "answer": 0}]}])
    assert rows[0]["unscored"] == 0.0 and rows[1]["unscored"] == 1.0 and rows[1]["score"] == verl.fallback


def test_a_label_naming_several_images_is_scored_on_all_of_them(tmp_path):
    import random

    from capreward.adapters.verl import make_compute_score
    from capreward.rewards import CLIPScoreReward
    from capreward.server.http import RewardService
    from capreward.testing.trained_clip import colour_image, trained_clip_path

    paths = []
    for k, colour in enumerate(["red", "blue"]):
        colour_image(colour, random.Random(k), size=(40, 40)).save(tmp_path / f"i{k}.png")
        paths.append(str(tmp_path / f"i{k}.png"))
    reward = CLIPScoreReward(model=str(trained_clip_path()))
    caption = "a red image."
    both = reward.compute(None, [caption], images=[paths]).values[0]
    first = reward.compute(None, [caption], image=[paths[0]]).values[0]
    assert both != pytest.approx(first, abs=1e-6)  # precondition: the second image changes the value
    label = parse_label({"images": ["i0.png", "i1.png"]}, "labels[0]", str(tmp_path))
    assert label.images is not None and len(label.images) == 2
    service = RewardService(reward, media_root=str(tmp_path))
    answer = service.handle({"query": [caption], "prompts": [""], "labels": [{"images": ["i0.png", "i1.png"]}]})
    assert answer["rewards"] == pytest.approx([both], abs=1e-6)
    one = service.handle({"query": [caption], "prompts": [""], "labels": [{"images": ["i0.png"]}]})
    assert one["rewards"] == pytest.approx([first], abs=1e-6)
    refused = service.handle({"query": [caption], "prompts": [""], "labels": [{"images": ["i0.png", "../x.png"]}]})
    assert refused["extra_logs"]["unscored"] == [1.0]
    verl = make_compute_score(reward)
    assert verl("d", caption, None, {"images": paths}) == pytest.approx(both, abs=1e-6)
    with pytest.raises(LabelError, match="'images' is an empty list"):
        parse_label({"images": []})
