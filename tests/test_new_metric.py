"""Issue #27's "done when": a new metric is one file holding its spec and its scorer
(tests/toy_metric.py), and every entry point reaches it by name with no other file touched:
``capreward score`` (its fields, its own flag, its settings record and the spec's refusals), the
adapters' factory, ``reward_for`` / ``metric_for``, the weighted-terms parsers of ``serve`` and the
recipe, ``capreward explain`` and the HTML report. The numbers are counted by hand from the captions."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from capreward import registry


@pytest.fixture
def toy():
    import toy_metric

    registry.register(toy_metric.SPEC)
    yield toy_metric
    registry.unregister(toy_metric.NAME)


@pytest.fixture
def manifest(tmp_path):
    Image.new("RGB", (16, 16), (200, 10, 10)).save(tmp_path / "red.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    (tmp_path / "clip.mp4").write_bytes(b"\x00" * 64)
    rows = [
        {"id": "refs", "caption": "a red car", "image": "red.png", "references": ["A red car on a road."]},
        {"id": "bare", "caption": "a yellow lorry", "image": "red.png"},
        {"id": "video", "caption": "a red car", "video": "clip.mp4"},
        {"id": "broken", "caption": "a red car", "image": "broken.png"},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_reached_by_name_everywhere_it_is_read(toy):
    from capreward.names import canonical

    assert registry.get("Word-Overlap-Toy") is toy.SPEC
    assert canonical("word-overlap-toy") == "word_overlap"
    assert "word_overlap" in registry.names()


def test_capreward_score_writes_its_fields_and_records_its_flag(toy, manifest, tmp_path, capsys):
    from capreward.cli.main import main
    from capreward.jobs.results_file import read_results

    out = tmp_path / "out.jsonl"
    args = ["score", str(manifest), "--out", str(out), "--metrics", "word-overlap-toy", "--no-progress"]
    assert main([*args, "--word-overlap-min-letters", "4"]) == 0
    rows = {r["id"]: r for r in read_results(out)}
    # "a red car" against "A red car on a road.": a, red, car all found
    assert rows["refs"]["word_overlap"] == 1.0 and rows["refs"]["word_overlap/overlap"] == 1.0
    assert rows["refs"]["word_overlap/words"] == 3 and rows["refs"]["errors"] is None
    # no references: yellow and lorry have at least 4 letters, "a" not
    assert rows["bare"]["word_overlap"] == pytest.approx(2 / 3) and "word_overlap/overlap" not in rows["bare"]
    # the spec says images only: the video row is refused without being scored
    assert "Word overlap scores images only" in rows["video"]["errors"]["word_overlap"]
    assert "word_overlap" not in rows["video"]
    assert rows["broken"]["word_overlap"] is None and "cannot open" in rows["broken"]["errors"]["word_overlap"]
    record = json.loads((tmp_path / "out.jsonl.settings.json").read_text())["settings"]
    assert record["word_overlap_min_letters"] == 4 and record["metrics"] == ["word_overlap"]
    # a resume with another value of its flag is refused, naming the flag
    capsys.readouterr()
    assert main([*args, "--word-overlap-min-letters", "3"]) == 2
    assert "--word-overlap-min-letters was 4, now 3" in capsys.readouterr().err


def test_score_help_lists_it_with_its_flag(toy, capsys):
    from capreward.cli.main import main

    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = capsys.readouterr().out
    assert "- word_overlap (Word overlap): word_overlap, word_overlap/words; with references also " \
           "word_overlap/overlap (images only); options: --word-overlap-min-letters." in " ".join(text.split())
    assert "--word-overlap-min-letters" in text


def test_rewards_and_metrics_by_name(toy, tmp_path):
    from capreward.adapters.factory import build_reward, parse_terms
    from capreward.recipes.grpo_captioner import parse_rewards
    from capreward.rewards.by_name import reward_for
    from capreward.torchmetrics import metric_for

    Image.new("RGB", (16, 16)).save(tmp_path / "x.png")
    image = str(tmp_path / "x.png")
    for reward in (reward_for("word-overlap-toy"), build_reward("word_overlap")):
        assert reward.__name__ == "word_overlap"
        logged = {}
        values = reward(None, ["a red car", "a blue car"], image=[image] * 2,
                        references=[["a red car"], ["a red car"]], log_metric=logged.__setitem__)
        assert values == [1.0, pytest.approx(2 / 3)]
        # the generic reward logs the spec's sub-scores, read off the scorer's result: 3 words each,
        # overlap 1 and 2/3
        assert reward.metric_names()[:2] == ("words", "overlap")
        assert logged["rewards/word_overlap/words"] == 3.0
        assert logged["rewards/word_overlap/overlap"] == pytest.approx((1 + 2 / 3) / 2)
    assert parse_terms("word_overlap=0.5,emscore=1") == [("word_overlap", 0.5), ("emscore", 1.0)]
    assert parse_rewards("word-overlap-toy:2") == [("word_overlap", 2.0)]
    metric = metric_for("word_overlap")
    assert metric.columns == ("score", "empty", "words", "overlap")
    metric.update(["a red car", "a blue car"], [image, image], [["a red car"], ["a red car"]])
    assert float(metric.compute()) == pytest.approx((1 + 2 / 3) / 2)


def test_the_reward_server_serves_it_with_its_option(toy, tmp_path, monkeypatch):
    import threading

    from capreward.adapters.factory import RewardOptions, build_reward
    from capreward.server.http import make_server, post_json
    from capreward.cli.main import build_parser

    Image.new("RGB", (16, 16)).save(tmp_path / "im.png")
    # its option is a field of the adapters' options, an environment variable and a serve flag
    monkeypatch.setenv("CAPREWARD_WORD_OVERLAP_MIN_LETTERS", "4")
    options = RewardOptions.from_env()
    assert options.word_overlap_min_letters == 4 and RewardOptions().word_overlap_min_letters == 3
    args = build_parser().parse_args(["serve", "--reward", "word-overlap-toy", "--word-overlap-min-letters", "4"])
    assert (args.reward, args.word_overlap_min_letters) == ("word_overlap", 4)
    server = make_server(build_reward("word_overlap", options), media_root=str(tmp_path))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        prompt = "USER: describe ASSISTANT:"
        captions = ["a yellow lorry", "a red car"]
        status, body = post_json(f"{server.url}/get_reward", {
            "query": [prompt + c for c in captions], "prompts": [prompt] * 2,
            "labels": [{"image": "im.png"}, {"image": "im.png", "references": ["the red car"]}]})
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200
    # no references: 2 of 3 words have at least 4 letters; with references: a is not in "the red car"
    assert body["rewards"] == pytest.approx([2 / 3, 2 / 3])


def test_explain_and_report(toy, manifest, tmp_path, capsys):
    from capreward.cli.main import main
    from capreward.jobs.results_file import read_results
    from capreward.report.html import render_report

    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    assert "word_overlap (The words of the caption that its references hold)" in " ".join(capsys.readouterr().out.split())
    single = tmp_path / "one.jsonl"
    single.write_text(manifest.read_text().splitlines()[0] + "\n", encoding="utf-8")
    out = tmp_path / "why1.jsonl"
    assert main(["explain", str(single), "--out", str(out), "--metric", "word-overlap-toy", "--references",
                 "--no-progress"]) == 0
    (row,) = read_results(out)
    assert row["metric"] == "word_overlap" and row["word_overlap"] == 1.0
    assert row["explanation"] == "found in the references: a, red, car"

    scored = tmp_path / "scored.jsonl"
    assert main(["score", str(manifest), "--out", str(scored), "--metrics", "word_overlap", "--no-progress"]) == 0
    page = render_report(read_results(scored), tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'data-metric="word_overlap"' in page
    assert "<td>words</td><td>3.0000</td>" in page and "<td>overlap</td><td>1.0000</td>" in page
    assert "Word overlap scores images only" in page
