"""The claim and QA-utility rewards outside the process that built them: a real ``capreward serve``
subprocess on 127.0.0.1, veRL's own reward loop (``RewardLoopWorker`` with the naive manager and with
capreward's batch manager, veRL's Hydra config) and the ``capreward score`` CLI, each giving the numbers of
the scorers called directly on the tiny trained judges. Questions reach ``qa_utility`` in a label's
``questions`` (the server, veRL's ``extra_info``) or a manifest column (``capreward score``)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest
from PIL import Image

from capreward.adapters.labels import LabelError, parse_label
from capreward.judges import LocalChatJudge
from capreward.scorers.claims import ClaimScorer
from capreward.scorers.qa_utility import QAUtility
from capreward.testing.tiny_claim_judge import claim_image, tiny_claim_judge, tiny_claim_judge_dir
from capreward.testing.tiny_qa_judge import colour_questions, qa_backend, tiny_qa_judge_dir
from fixtures_llava import one_torch_thread  # noqa: F401
from serve_process import Server

pytestmark = pytest.mark.integration

CAPTIONS = ["the background is red. there is a green patch.", "the background is red. a blue ball.",
            "the background is blue. a photo."]
REFS = ["the background is red and there is a green patch."]
RED_QS = colour_questions("red")


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense-media")
    claim_image("red", "green", random.Random("dense-entry")).save(root / "im.png")
    return root


@pytest.fixture(scope="module")
def image(media):
    return Image.open(media / "im.png").convert("RGB")


@pytest.fixture(scope="module")
def claims_expected(image):
    scorer = ClaimScorer(LocalChatJudge(tiny_claim_judge()))
    with_refs = scorer.score(CAPTIONS, images=[image] * 3, references=[REFS] * 3)
    without = scorer.score(CAPTIONS, images=[image] * 3)
    return with_refs, without


@pytest.fixture(scope="module")
def qa_expected():
    return QAUtility(qa_backend()).score(CAPTIONS, questions=[RED_QS] * 3)


def test_expected_numbers_tell_the_captions_apart(claims_expected, qa_expected):
    """The fixtures' own numbers differ where the captions do (else the comparisons below prove little)."""
    with_refs, without = claims_expected
    # the precision side (the tiny judge's verification); its coverage question is not trained (see
    # testing/tiny_claim_judge.py), so the recall side is compared below, not ordered
    assert with_refs.precision[0] > with_refs.precision[1] > with_refs.precision[2]
    assert without.score[0] > without.score[1] > without.score[2]
    assert len({float(v) for v in with_refs.score}) == 3
    assert qa_expected.score[0] > qa_expected.score[2] and qa_expected.score[1] > qa_expected.score[2]


def test_labels_carry_questions_and_refuse_malformed_ones():
    label = parse_label({"image": "a.png", "questions": json.dumps([{"question": "q?", "options": ["x", "y"],
                                                                    "answer": "B"}])}, "labels[0]", "/tmp")
    assert label.questions == [{"question": "q?", "options": ["x", "y"], "answer": 1}]
    for bad, said in (([], "empty"), ("[{", "JSON"), ([{"question": "q", "options": ["x"], "answer": 0}], "2..10 options"),
                      ([{"question": "q", "options": ["x", "y"], "answer": 5}] * 65, "at most 64"),
                      ({"question": "q"}, "list")):
        with pytest.raises(LabelError, match=said) as info:
            parse_label({"image": "a.png", "questions": bad}, "labels[3]", "/tmp")
        assert "labels[3]" in str(info.value)


# ----------------------------------------------------------------------------------- capreward serve
def _post(server, captions, labels):
    prompt = "USER: describe ASSISTANT:"
    status, body = server.post({"query": [prompt + c for c in captions], "prompts": [prompt] * len(captions),
                                "labels": labels})
    assert status == 200, body
    return body


@pytest.mark.slow  # capreward's own server and CLI: once in the suite, not at both matrix ends
def test_serve_subprocess_answers_the_claim_scorer_numbers(media, claims_expected):
    with_refs, without = claims_expected
    server = Server(["--reward", "claims", "--judge-model", str(tiny_claim_judge_dir()), "--media-root", str(media),
                     "--no-progress"])
    try:
        body = _post(server, CAPTIONS + CAPTIONS[:1], [{"image": "im.png", "references": REFS}] * 3
                     + [{"image": "im.png"}])
        missing = _post(server, CAPTIONS[:1], [{"image": "nothere.png", "references": REFS}])
    finally:
        assert server.stop() == 0
    assert body["rewards"] == pytest.approx(with_refs.score.tolist() + [without.score[0]], abs=1e-6)
    logs = body["extra_logs"]
    assert logs["precision"] == pytest.approx(with_refs.precision.tolist() + [without.precision[0]], abs=1e-6)
    assert logs["recall"][:3] == pytest.approx(with_refs.recall.tolist(), abs=1e-6) and math.isnan(logs["recall"][3])
    assert logs["unscored"] == [0.0] * 4
    assert missing["rewards"] == [0.0] and missing["extra_logs"]["unscored"] == [1.0]  # the bottom of [0, 1]


@pytest.mark.slow  # capreward's own server and CLI: once in the suite, not at both matrix ends
def test_serve_subprocess_answers_the_qa_utility_numbers(media, qa_expected):
    server = Server(["--reward", "qa_utility", "--qa-model", str(tiny_qa_judge_dir()), "--media-root", str(media),
                     "--no-progress"])
    try:
        body = _post(server, CAPTIONS, [{"image": "im.png", "questions": RED_QS}] * 2
                     + [{"image": "im.png", "questions": json.dumps(RED_QS)}])
        bad = server.post({"query": ["x"], "labels": [{"image": "im.png", "questions": [{"question": "q"}]}]})
    finally:
        assert server.stop() == 0
    assert body["rewards"] == pytest.approx(qa_expected.score.tolist(), abs=1e-6)
    assert body["extra_logs"]["n_questions"] == [1.0, 1.0, 1.0]
    assert bad[0] == 400 and "labels[0]" in bad[1]["error"]


# ------------------------------------------------------------------------------------------- veRL
verl_words = ("a", "the", "is", "background", "there", "patch", "photo", "ball", "red", "green", "blue")


@pytest.fixture(scope="module")
def policy_tokenizer(tmp_path_factory):
    from capreward.testing import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("dense-policy")
    tok = build_tiny_tokenizer(verl_words)
    assert [tok.decode(tok(c, add_special_tokens=False)["input_ids"]) for c in CAPTIONS] == CAPTIONS
    tok.save_pretrained(path)
    return path


@pytest.fixture
def verl_env(monkeypatch, media):
    import capreward.adapters.verl as capreward_verl

    for key, value in {"CAPREWARD_JUDGE_MODEL": str(tiny_claim_judge_dir()), "CAPREWARD_QA_MODEL": str(tiny_qa_judge_dir()),
                       "CAPREWARD_MEDIA_ROOT": str(media), "CAPREWARD_RETURN_DICT": "1"}.items():
        monkeypatch.setenv(key, value)
    capreward_verl.reset_default_scorer()
    yield monkeypatch
    capreward_verl.reset_default_scorer()


def _verl(policy_tokenizer, overrides, samples):
    pytest.importorskip("verl", reason="verl is installed by scripts/bootstrap.sh --test")
    from test_verl_contract import data_proto, run_worker, verl_config

    config = verl_config(policy_tokenizer, overrides)
    worker, outputs = run_worker(config, data_proto(policy_tokenizer, samples))
    return worker, outputs


@pytest.mark.parametrize("manager", ["naive", "capreward"])
def test_verl_reward_loop_gives_the_claim_scorer_numbers(verl_env, policy_tokenizer, claims_expected, manager):
    from test_verl_contract import BATCH_OVERRIDES, NAIVE_OVERRIDES

    verl_env.setenv("CAPREWARD_REWARD", "claims")
    verl_env.setenv("CAPREWARD_SUBSCORES", "precision,recall")
    with_refs, without = claims_expected
    samples = [(c, REFS, {"image": "im.png"}) for c in CAPTIONS] + [(CAPTIONS[1], None, {"image": "im.png"})]
    worker, out = _verl(policy_tokenizer, NAIVE_OVERRIDES if manager == "naive" else BATCH_OVERRIDES, samples)
    assert type(worker.reward_manager).__name__ == ("NaiveRewardManager" if manager == "naive" else "CaprewardRewardManager")
    assert [o["reward_score"] for o in out] == pytest.approx(with_refs.score.tolist() + [without.score[1]], abs=1e-6)
    assert [o["reward_extra_info"]["precision"] for o in out] == pytest.approx(
        with_refs.precision.tolist() + [without.precision[1]], abs=1e-6)
    assert math.isnan(out[3]["reward_extra_info"]["recall"]) and out[0]["reward_extra_info"]["unscored"] == 0.0


@pytest.mark.parametrize("manager", ["naive", "capreward"])
def test_verl_reward_loop_gives_the_qa_utility_numbers(verl_env, policy_tokenizer, qa_expected, manager):
    from test_verl_contract import BATCH_OVERRIDES, NAIVE_OVERRIDES

    verl_env.setenv("CAPREWARD_REWARD", "qa_utility")
    verl_env.setenv("CAPREWARD_SUBSCORES", "n_questions")
    samples = [(c, None, {"image": "im.png", "questions": RED_QS}) for c in CAPTIONS]
    samples.append((CAPTIONS[0], None, {"image": "im.png", "questions": [{"question": "q", "options": ["x"], "answer": 0}]}))
    _, out = _verl(policy_tokenizer, NAIVE_OVERRIDES if manager == "naive" else BATCH_OVERRIDES, samples)
    assert [o["reward_score"] for o in out[:3]] == pytest.approx(qa_expected.score.tolist(), abs=1e-6)
    assert [o["reward_extra_info"]["n_questions"] for o in out[:3]] == [1.0, 1.0, 1.0]
    assert out[3]["reward_score"] == 0.0 and out[3]["reward_extra_info"]["unscored"] == 1.0  # malformed: the bottom


# ------------------------------------------------------------------------------------ capreward score
@pytest.mark.slow  # capreward's own server and CLI: once in the suite, not at both matrix ends
def test_capreward_score_cli_runs_both_rewards(media, tmp_path, claims_expected, qa_expected):
    with_refs, _ = claims_expected
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"id": str(i), "caption": c, "image": str(media / "im.png"),
                                              "references": REFS, "questions": RED_QS})
                                  for i, c in enumerate(CAPTIONS)) + "\n")
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--metrics", "claims,qa_utility",
           "--judge-model", str(tiny_claim_judge_dir()), "--qa-model", str(tiny_qa_judge_dir()), "--out", str(out),
           "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    got = [rows[str(i)] for i in range(3)]
    assert [r["claims"] for r in got] == pytest.approx(with_refs.score.tolist(), abs=1e-6)
    assert [r["claims/recall"] for r in got] == pytest.approx(with_refs.recall.tolist(), abs=1e-6)
    assert [r["qa_utility"] for r in got] == pytest.approx(qa_expected.score.tolist(), abs=1e-6)
    verdicts = got[1]["claims/claims"]
    assert [(v["text"], CAPTIONS[1][v["start"]:v["end"]]) for v in verdicts] == [
        ("the background is red", "the background is red"), ("a blue ball", "a blue ball")]
