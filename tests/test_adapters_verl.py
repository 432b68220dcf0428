"""The veRL adapter: compute_score (per sample and batch) against the rewards called directly, the
environment-configured entry point loaded the way veRL loads a custom reward file, labels, and the
fallback for unscorable samples."""

from __future__ import annotations

import importlib.util
import logging
import math

import numpy as np
import pytest
from PIL import Image

import capreward.adapters.verl as verl
from capreward.adapters import LabelError, make_compute_score, parse_label
from capreward.rewards import CLIPScoreReward, EMScoreReward

from conftest import random_video, write_mp4

CAPTIONS = ["a man is cooking food in a kitchen", "a dog runs across the grass", "two people dance"]
REFS = [["a person cooks dinner", "a chef prepares a meal"], ["a dog playing outside"], ["people dance"]]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    videos = [str(write_mp4(root / f"v{i}.mp4", random_video(20 + i, frames=12))) for i in range(2)]
    images = []
    for i in range(2):
        path = root / f"i{i}.png"
        Image.fromarray(random_video(40 + i, frames=1)[0]).save(path)
        images.append(str(path))
    return {"root": root, "videos": videos, "images": images}


@pytest.fixture(scope="module")
def clip_reward(tiny_clip_path):
    return CLIPScoreReward(model=str(tiny_clip_path))


@pytest.fixture(scope="module")
def em_reward(tiny_clip_path):
    return EMScoreReward(model=str(tiny_clip_path), idf=[r for rs in REFS for r in rs])


def test_per_sample_compute_score_equals_the_reward_called_directly(em_reward, media):
    compute_score = make_compute_score(em_reward)
    videos = [media["videos"][0], media["videos"][1], media["videos"][0]]
    direct = em_reward(None, CAPTIONS, video=videos, references=REFS)
    via_verl = [
        compute_score("vatex", c, refs, {"video": v}) for c, refs, v in zip(CAPTIONS, REFS, videos)
    ]
    assert via_verl == pytest.approx(direct, abs=1e-6)
    assert len(set(round(v, 6) for v in via_verl)) == 3  # real, differing scores


def test_batch_entry_point_matches_per_sample_and_accepts_numpy_ground_truth(clip_reward, media):
    compute_score = make_compute_score(clip_reward)
    images = [media["images"][0], media["images"][1], media["images"][1]]
    # parquet-backed veRL datasets hand lists over as numpy object arrays
    truths = [np.array(r, dtype=object) for r in REFS]
    infos = [{"image": p, "index": i, "split": "train"} for i, p in enumerate(images)]
    batch = compute_score.batch(["coco"] * 3, CAPTIONS, truths, infos)
    single = [compute_score("coco", c, t, e) for c, t, e in zip(CAPTIONS, truths, infos)]
    direct = clip_reward(None, CAPTIONS, image=images, references=REFS)
    assert batch == pytest.approx(single, abs=1e-6)
    assert batch == pytest.approx(direct, abs=1e-6)


def test_references_only_and_json_ground_truth(em_reward):
    compute_score = make_compute_score(em_reward)
    got = compute_score("refs", CAPTIONS[0], '["a person cooks dinner", "a chef prepares a meal"]', None)
    direct = em_reward(None, [CAPTIONS[0]], references=[REFS[0]])[0]
    assert got == pytest.approx(direct, abs=1e-6)


def test_unscorable_samples_get_the_fallback_and_the_reason_is_logged(clip_reward, media, caplog):
    compute_score = make_compute_score(clip_reward, fallback=-1.0)
    infos = [
        {"image": media["images"][0]},
        {"image": str(media["root"] / "missing.png")},
        {"image": media["images"][0], "video": media["videos"][0]},  # both: malformed
        "not a dict",
        {"image": media["images"][1]},
    ]
    completions = [CAPTIONS[0], CAPTIONS[1], CAPTIONS[2], CAPTIONS[0], "   "]
    with caplog.at_level(logging.WARNING, logger="capreward"):
        out = compute_score.batch(["d"] * 5, completions, [None] * 5, infos)
    good = clip_reward(None, [CAPTIONS[0]], image=[media["images"][0]])[0]
    assert out[0] == pytest.approx(good, abs=1e-6)
    assert out[1:] == [-1.0, -1.0, -1.0, -1.0]
    log = caplog.text
    assert "missing.png" in log
    assert "sample 2 extra_info gives both an image and a video" in log
    assert "sample 3: extra_info must be a dict" in log
    assert "empty" in log


def test_dict_mode_has_score_unscored_and_the_chosen_subscores(em_reward, media):
    keys = ["video/fine_p", "reference/full_f"]
    compute_score = make_compute_score(em_reward, return_dict=True, fallback=0.0, subscores=keys)
    # an unscorable sample first: the keys must not depend on what was scored before
    bad = compute_score("vatex", CAPTIONS[0], REFS[0], {"video": str(media["root"] / "gone.mp4")})
    good = compute_score("vatex", CAPTIONS[0], REFS[0], {"video": media["videos"][0]})
    refs_only = compute_score("vatex", CAPTIONS[0], REFS[0], None)
    assert set(good) == set(bad) == set(refs_only) == {"score", "unscored", *keys}
    assert good["unscored"] == 0.0 and bad["unscored"] == 1.0 and bad["score"] == 0.0
    assert math.isnan(refs_only["video/fine_p"])  # no video part: NaN, as the server answers (round 3: the fallback)
    assert all(math.isnan(bad[k]) for k in keys)
    direct = em_reward(None, [CAPTIONS[0]], video=[media["videos"][0]], references=[REFS[0]])
    assert good["score"] == pytest.approx(direct[0], abs=1e-6)
    out = em_reward.compute(None, [CAPTIONS[0]], video=[media["videos"][0]], references=[REFS[0]])
    assert good["video/fine_p"] == pytest.approx(out.metrics["video/fine_p"][0], abs=1e-6)
    assert math.isfinite(bad["score"]) and math.isfinite(bad["unscored"])  # the reward itself is never NaN
    with pytest.raises(ValueError, match="clash"):
        make_compute_score(em_reward, return_dict=True, subscores=["score"])


def test_relative_paths_resolve_against_the_media_root(clip_reward, media):
    compute_score = make_compute_score(clip_reward, media_root=str(media["root"]))
    rel = compute_score("coco", CAPTIONS[1], None, {"image": "i1.png"})
    direct = clip_reward(None, [CAPTIONS[1]], image=[media["images"][1]])[0]
    assert rel == pytest.approx(direct, abs=1e-6)


def test_env_configured_file_loaded_like_verl(tiny_clip_path, media, monkeypatch, clip_reward):
    """veRL imports custom_reward_function.path with spec_from_file_location as a standalone module."""
    monkeypatch.setenv("CAPREWARD_REWARD", "clip_s")
    monkeypatch.setenv("CAPREWARD_CLIP_MODEL", str(tiny_clip_path))
    monkeypatch.setenv("CAPREWARD_FALLBACK", "-0.5")
    monkeypatch.setenv("CAPREWARD_MEDIA_ROOT", str(media["root"]))
    spec = importlib.util.spec_from_file_location("custom_module", verl.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, "compute_score")
    got = fn(data_source="coco", solution_str=CAPTIONS[0], ground_truth=REFS[0], extra_info={"image": "i0.png"})
    direct = clip_reward(None, [CAPTIONS[0]], image=[media["images"][0]], references=[REFS[0]])[0]
    assert got == pytest.approx(direct, abs=1e-6)
    assert fn("coco", CAPTIONS[0], REFS[0], {"image": "nope.png"}) == -0.5
    batch = module.compute_score_batch(
        data_sources=["coco"] * 2, solution_strs=CAPTIONS[:2], ground_truths=REFS[:2],
        extra_infos=[{"image": "i0.png"}, {"image": "i1.png"}],
    )
    assert batch[0] == pytest.approx(got, abs=1e-6)


def test_bad_configuration_fails_clearly(clip_reward):
    with pytest.raises(ValueError, match="fallback"):
        make_compute_score(clip_reward, fallback=float("nan"))
    with pytest.raises(ValueError, match="unknown reward 'clipp'"):
        verl.build_reward("clipp")


@pytest.mark.parametrize(
    "label, message",
    [
        ('{"video": ', r"labels\[2\] is not valid JSON"),
        ({"vidoe": "a.mp4"}, r"unknown keys \['vidoe'\]"),
        ({"image": 3}, "'image' must be a non-empty path"),
        ({"references": ["ok", 5]}, r"references\[1\] must be a str"),
        ({}, "names no image, video, references or questions"),
        ([1, 2], "must be an object"),
        ({"image": "a.png", "images": ["b.png"]}, "gives both 'image' and 'images'"),  # round 3: b.png was ignored
    ],
)
def test_label_errors_name_the_item(label, message):
    with pytest.raises(LabelError, match=message):
        parse_label(label, "labels[2]")


def test_label_forms():
    lab = parse_label('{"images": ["a.jpg", "b.jpg"], "references": "one ref", "visual_id": 7}', "x", "/data")
    assert lab.image == "/data/a.jpg" and lab.video is None
    assert lab.references == ["one ref"] and lab.visual_id == "7"
    # blank references are kept as given: the reward refuses them per sample (never "no references")
    assert parse_label({"video": "/abs/v.mp4", "references": ["", "  "]}, "x", "/data").references == ["", "  "]
    assert parse_label({"references": []}, "x", "/data").references == []


HOSTILE_GROUND_TRUTHS = {
    "a 200,000-character reference": "a red car " * 20_000,
    "100,000 references": ["a car"] * 100_000,
    "JSON nested 50,000 deep": "[" * 50_000 + "]" * 50_000,
    "JSON with a 5,000-digit integer": "[" + "7" * 5_000 + "]",
    "a dict": {"references": ["a car"]},
    "a number": 3.5,
    "a list of numbers": [1, 2],
    "bytes": b"a car",
    "a set": {"a car"},
}


@pytest.mark.parametrize("name", HOSTILE_GROUND_TRUTHS)
def test_a_hostile_ground_truth_gets_the_fallback_alone(name, clip_reward, media, caplog):
    """Only that sample gets the fallback (with its reason logged); the others score as they do alone."""
    compute_score = make_compute_score(clip_reward, fallback=-1.0)
    images = [media["images"][0], media["images"][1], media["images"][0]]
    truths = [REFS[0], HOSTILE_GROUND_TRUTHS[name], REFS[2]]
    with caplog.at_level(logging.WARNING, logger="capreward"):
        out = compute_score.batch(["d"] * 3, CAPTIONS, truths, [{"image": p} for p in images])
    alone = [compute_score("d", CAPTIONS[i], REFS[i], {"image": images[i]}) for i in (0, 2)]
    assert out[1] == -1.0 and out[0] == pytest.approx(alone[0], abs=1e-6) and out[2] == pytest.approx(alone[1], abs=1e-6)
    assert "sample 1" in caplog.text
    assert compute_score("d", CAPTIONS[1], HOSTILE_GROUND_TRUTHS[name], {"image": images[1]}) == -1.0


@pytest.mark.parametrize("solution", [None, 5, ["a dog runs across the grass"], b"a dog runs across the grass"],
                         ids=["None", "int", "list", "bytes"])
def test_a_solution_that_is_not_a_str_gets_the_fallback(solution, clip_reward, media, caplog):
    """None is never scored as the text "None" (nor a list as its repr)."""
    compute_score = make_compute_score(clip_reward, fallback=-1.0, return_dict=True)
    with caplog.at_level(logging.WARNING, logger="capreward"):
        got = compute_score("d", solution, None, {"image": media["images"][1]})
        batch = compute_score.batch(["d"] * 2, [solution, CAPTIONS[1]], [None] * 2, [{"image": media["images"][1]}] * 2)
    assert got == {"score": -1.0, "unscored": 1.0} and batch[0] == got
    assert batch[1]["unscored"] == 0.0
    assert f"solution_str must be a str, got {type(solution).__name__}" in caplog.text


def test_help_and_docstrings_give_the_frameworks_current_keys():
    """Round 3: the CLI help and this adapter's docstring gave OpenRLHF's and veRL's old keys
    (OpenRLHF >= 0.10 reads --reward.remote_url; veRL 0.9 reads reward.custom_reward_function.* and no
    longer has reward_model.reward_manager=batch)."""
    import io
    from contextlib import redirect_stdout

    import capreward.server.http as server_http
    import capreward.adapters.verl as verl_module
    from capreward.cli.main import build_parser

    buf = io.StringIO()
    with redirect_stdout(buf), pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "--reward.remote_url" in buf.getvalue()
    assert "--reward.remote_url" in server_http.__doc__.splitlines()[0]
    doc = verl_module.__doc__
    assert "reward.custom_reward_function.path=pkg://capreward.adapters.verl" in doc
    assert "\n      custom_reward_function.path" not in doc
    assert "(``reward_model.reward_manager=naive``" not in doc
