"""``capreward demo``: the colour-foil facts it prints hold when recomputed independently, and a short
GRPO run through the real recipe produces the table and a closing line computed from its numbers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from capreward.cli import demo
from capreward.scorers.clipscore import CLIPScore
from capreward.scorers.emscore import EMScore

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)
from conftest import VIDEO_DIR, sample_clips


@pytest.fixture(scope="module")
def clip():
    from capreward.testing.trained_clip import TrainedClipFactory, trained_clip_path

    trained_clip_path()
    return TrainedClipFactory()


@pytest.mark.slow
def test_foil_facts_hold_and_match_direct_scoring(clip):
    clips, names = demo.read_clips(demo.default_video_dir(), frames=6)
    if not clips:
        pytest.skip("sample clips not available")
    s = demo.score_foils(clip, clips, names)
    n = len(clips) * 4
    # the facts the demo prints: the true caption beats its colour foil on both metrics, the swapped
    # colour word is flagged in every foil and the true one in no true caption
    assert s.facts() == {"n": n, "emscore_right": n, "clip_s_right": n, "foil_word_flagged": n, "true_word_flagged": 0}
    assert demo.foils_summary(s).startswith(f"true caption above its foil: EMScore {n}/{n}, CLIP-S {n}/{n}")
    # the numbers are the scorers' own, recomputed one clip at a time
    from capreward.testing.colour_task import tint

    em, cs = EMScore(model=clip, frames=None), CLIPScore(model=clip, frames=None)
    for i in (0, n - 1):
        video = tint(clips[i // 4], s.colours[i])
        for k, caption in enumerate((s.truth[i], s.foils[i])):
            assert em.score([caption], videos=[video]).score[0].item() == pytest.approx(s.emscore[k][i], abs=1e-5)
            assert cs.score([caption], videos=[video]).clip_s[0].item() == pytest.approx(s.clip_s[k][i], abs=1e-5)
    table = demo.format_foils(s)
    assert table.count("\n") == 2 * n + 1 and "composite" not in table


def test_grpo_part_measures_start_grpo_and_control_on_held_out_images(clip, tmp_path):
    from capreward.testing.colour_task import FAMILIES, ColourEval

    r = demo.run_grpo(clip, steps=2, out=str(tmp_path), sft_steps=2, eval_images=8)
    assert len(r.reward) == len(r.right) == len(r.words) == 2
    assert set(r.components) >= {"emscore", "clip_s", "hallucination", "guard/truncation", "guard/repetition"}
    assert "total" not in r.components  # no column repeats the reward
    for e in (r.before, r.after, r.control):
        assert isinstance(e, ColourEval) and len(e.greedy) == 8 and [len(s) for s in e.sampled] == [demo.EVAL_SAMPLES] * 8
        assert e.colours == ["red", "green", "blue", "yellow"] * 2
    # the levels are the reward's own values: the right caption beats the best image-blind caption, which
    # is one caption scored on every held-out image
    from capreward.testing.colour_task import colour_rows

    reward = demo.build_reward(clip, colour_rows(demo.CALIBRATION_ROWS, 3000))

    rows = colour_rows(8, 5000)
    images = [x["image"] for x in rows]
    blind = reward(None, [r.levels["blind_caption"]] * 8, image=images)
    assert r.levels["blind"] == pytest.approx(np.mean(blind), abs=1e-6)
    right = reward(None, [f"a {x['colour']} image" for x in rows], image=images)
    assert r.levels["right"] == pytest.approx(np.mean(right), abs=1e-6) and r.levels["right"] > r.levels["blind"] + 1.0
    table = demo.format_grpo(r).splitlines()
    assert table[0].split()[:3] == ["steps", "reward", "EMScore"] and len(table) == 4
    assert [line.split()[0] for line in table[2:]] == ["1", "2"]
    assert float(table[2].split()[1]) == pytest.approx(r.reward[0], abs=1e-3)
    # long runs are folded into blocks of consecutive steps, each the mean of its steps
    import dataclasses

    five = dataclasses.replace(r, reward=[0.0, 1.0, 2.0, 3.0, 4.0], right=[0.0] * 5, words=[3.0] * 5,
                               components={k: [0.0] * 5 for k in r.components})
    folded = demo.format_grpo(five, rows=2).splitlines()[2:]
    assert [(line.split()[0], float(line.split()[1])) for line in folded] == [("1-3", 1.0), ("4-5", 3.5)]
    evaluation = demo.format_evaluation(r)
    assert f"{r.before.greedy_right:.0%}" in evaluation.splitlines()[1] and "control" in evaluation
    assert demo.grpo_summary(r).startswith("GRPO: clean held-out greedy right colour ")
    assert not (tmp_path / "adapter_config.json").exists()  # nothing saved by the demo's run
    # the weak labels name the image's family only
    assert all(c in FAMILIES[c] for c in FAMILIES) and {FAMILIES["red"], FAMILIES["blue"]} == {("red", "yellow"), ("green", "blue")}


def _eval(greedy, sampled=None):
    from capreward.testing.colour_task import ColourEval

    colours = ["red", "green", "blue", "yellow"] * (len(greedy) // 4)
    return ColourEval(colours, [f"a {g} image" for g in greedy], [[f"a {s} image"] for s in (sampled or greedy)])


def test_a_caption_counts_as_right_only_when_it_is_a_clean_caption_of_the_task():
    from capreward.testing.colour_task import ColourEval, clean_colour, names_colour, right_colour

    for caption in ("a red image", "a red image.", " A Red image ", "a red image.\n"):
        assert clean_colour(caption) == "red" and right_colour(caption, "red"), caption
    # the junk of the seeds: repeats, junk tokens, another form; and wrong or cut-off answers
    for caption in ("a blue blue blue blue blue", "a red5 red image", "a& green image", "a green", "image", "red",
                    "a red red image", "a red image image", "a red image a", "a red blue image", "a  red image",
                    "a reddish image", "a red image. a red image.", ""):
        assert clean_colour(caption) is None and not right_colour(caption, "red"), caption
    assert clean_colour("a purple image") == "purple" and not right_colour("a purple image", "red")  # clean, wrong
    # the lenient reading names blue in the repeated caption; it is shown, never counted
    assert names_colour("a blue blue blue blue blue", "blue") and not right_colour("a blue blue blue blue blue", "blue")
    # seed 3 of the issue: 8/8 blue images "a blue blue blue blue blue" counted right before, none now
    e = ColourEval(["blue"] * 4 + ["red"] * 4, ["a blue blue blue blue blue"] * 4 + ["a red image"] * 4,
                   [["a blue image", "a blue blue"]] * 4 + [["a red5 red image", "a red image."]] * 4)
    assert (e.greedy_right, e.sampled_right, e.greedy_malformed, e.sampled_malformed) == (0.5, 0.5, 0.5, 0.5)


def test_closing_line_is_computed_from_clean_held_out_greedy_and_sampled_accuracy():
    import dataclasses

    from capreward.testing.colour_task import ColourEval

    start = _eval(["red", "green", "green", "red"])  # 2/4 greedy, 2/4 sampled
    taught = _eval(["red", "green", "blue", "yellow"], ["red", "green", "blue", "red"])  # 4/4 greedy, 3/4 sampled
    control = _eval(["red", "blue", "blue", "red"])  # 2 of 4
    base = demo.GRPOResult(reward=[0.5, 0.6, 1.8, 2.0], components={}, right=[0.5] * 4, words=[3.0] * 4, sft_loss=0.2,
                           seconds=1.0, before=start, after=taught, control=control)
    assert (start.greedy_right, taught.greedy_right, taught.sampled_right, control.greedy_right) == (0.5, 1.0, 0.75, 0.5)
    line = demo.grpo_summary(base)
    assert line.startswith("GRPO: clean held-out greedy right colour rose, 50% -> 100% (sampled 50% -> 75%; chance 25%); "
                           "control arm (as many more supervised steps) 50% (sampled 50%); training reward 0.500 -> 2.000")
    assert "The reward taught the task" in line and demo.taught(start, taught, control)
    # at or below the control arm: not taught, whatever the rise
    assert "taught the task" not in demo.grpo_summary(dataclasses.replace(base, control=taught))
    five_of_eight = _eval(["red", "green", "blue", "red", "red", "green", "green", "red"])
    assert five_of_eight.greedy_right == 5 / 8
    below = demo.grpo_summary(dataclasses.replace(base, before=_eval(["red", "green", "green", "red"] * 2), after=five_of_eight))
    assert "rose, 50% -> 62%" in below and "greedy below 75 %" in below and "taught the task" not in below
    # greedy all right but the sampled captions did not rise by 10 points: not taught
    greedy_only = _eval(["red", "green", "blue", "yellow"], ["red", "blue", "green", "red"])
    line = demo.grpo_summary(dataclasses.replace(base, after=greedy_only))
    assert "taught the task" not in line and "sampled up by less than 10%" in line
    # the seed 3: greedy captions that name the colour in junk are not right
    junk = ColourEval(["red", "green", "blue", "yellow"], ["a red image", "a green image", "a blue blue blue blue blue",
                                                           "a yellow image"], [["a red5 red image"], ["a& green image"],
                                                                               ["a blue blue"], ["a yellow image"]])
    assert (junk.greedy_right, junk.sampled_right) == (0.75, 0.25)
    line = demo.grpo_summary(dataclasses.replace(base, after=junk))
    assert "50% -> 75% (sampled 50% -> 25%" in line and "taught the task" not in line
    # the training reward rising alone is called what it is
    flat = demo.grpo_summary(dataclasses.replace(base, after=start))
    assert "stayed level, 50% -> 50%" in flat and "did not teach the task" in flat
    # the per-colour view reads the greedy captions
    assert start.per_colour() == {"red": ("a red image", 1.0), "green": ("a green image", 1.0),
                                  "blue": ("a green image", 0.0), "yellow": ("a red image", 0.0)}
    assert isinstance(start, ColourEval)


def test_trend_is_judged_on_printed_values():
    assert demo.trend(0.2, 0.2004, ".0%") == "stayed level"
    assert demo.trend(0.2, 0.26, ".0%") == "rose" and demo.trend(0.3, 0.1, ".3f") == "fell"


def test_demo_command_output_is_quiet_and_closes_with_what_it_showed(tmp_path, capfd):
    from capreward.cli.main import main

    # the checkout's sample clips when present, else the synthesised ones
    assert main(["demo", "--steps", "1", "--frames", "4", "--out", str(tmp_path)]) == 0
    out, err = capfd.readouterr()
    assert "What the numbers showed" in out and "GRPO: clean held-out greedy right colour" in out
    assert "reference levels of this reward" in out and "control: more SFT" in out and "weakly supervised" in out
    assert re.search(r"true caption above its foil: EMScore \d+/\d+", out)
    # no third-party warnings, log records, progress bars, raw per-step dicts or model-loading lines
    for noise in ("Warning", "warn(", "{'loss'", "it/s]", "Map:", "loading CLIP"):
        assert noise not in out + err, noise


def test_without_sample_clips_the_foil_table_runs_on_synthesised_clips(clip, monkeypatch, capsys):
    """An installed wheel has no ../shared: the demo synthesises its clips, and the facts still hold."""
    from capreward.cli.main import main

    monkeypatch.setattr(demo, "default_video_dir", lambda: None)
    assert main(["demo", "--steps", "0", "--frames", "4"]) == 0
    out = capsys.readouterr().out
    assert "two clips synthesised in memory" in out and "stripes (synthetic)" in out
    assert ("true caption above its foil: EMScore 8/8, CLIP-S 8/8; swapped colour word flagged in 8/8 foils, "
            "true colour word flagged in 0/8 true captions") in out


def test_clip_source_order_named_folder_then_checkout_then_synthesised(tmp_path, monkeypatch):
    from capreward.testing.colour_task import synthetic_clips

    clips, names, source = demo.demo_clips(str(tmp_path), frames=3)  # a folder the user named: its clips only
    assert (clips, names) == ([], []) and str(tmp_path) in source
    monkeypatch.setattr(demo, "default_video_dir", lambda: tmp_path / "missing")
    clips, names, source = demo.demo_clips(None, frames=3)
    expected, expected_names = synthetic_clips(3)
    assert names == expected_names and "synthesised" in source
    assert all(c.shape == (3, 120, 160, 3) and c.dtype == np.uint8 and (c == e).all() for c, e in zip(clips, expected))
    # grey content that moves: channels equal, frames differ
    assert all((c[..., 0] == c[..., 2]).all() and not (c[0] == c[-1]).all() for c in clips)
    if sample_clips():
        monkeypatch.setattr(demo, "default_video_dir", lambda: VIDEO_DIR)
        _, names, source = demo.demo_clips(None, frames=3)
        assert names == [p.name for p in sample_clips()] and "sample clips" in source


def test_the_checkout_is_found_only_from_a_checkout():
    from conftest import REPO

    assert demo.checkout_root() == REPO and demo.default_video_dir() == REPO.parent / "shared" / "data" / "videos"


def test_tiny_caption_policy_captions_within_the_images_colour_family():
    """capreward.testing.tiny_caption_policy: a tiny LLaVA trained in memory to caption; with weak labels it
    attends to the image (every held-out greedy caption names a colour of the image's family) without
    knowing which of the two it is."""
    from capreward.testing import tiny_caption_policy
    from capreward.testing.colour_task import FAMILIES, TASK_COLOURS, caption_colours, colour_rows

    model, processor = tiny_caption_policy(seed=0)
    e = caption_colours(model, processor, colour_rows(16, 5000), samples=2, seed=0)
    named = [[w for w in g.split() if w in TASK_COLOURS] for g in e.greedy]
    assert all(len(n) == 1 and n[0] in FAMILIES[c] for n, c in zip(named, e.colours)), list(zip(e.greedy, e.colours))
    assert 0.25 <= e.greedy_right <= 0.75
    with pytest.raises(ValueError, match="labels must be one of"):
        tiny_caption_policy(labels="noisy")
