"""A metric in a user's own installed package reaches every entry point through the ``capreward.metrics``
entry-point group (issue #40 item 2): a throwaway package (a ``pyproject.toml`` declaring the entry
point, and tests/toy_metric.py as its module) is installed with pip (``--no-deps --no-build-isolation
--target``, offline) into a temporary directory, and fresh processes with that directory on their path
reach it by name: the registry, ``reward_for`` / ``metric_for``, the adapters' ``build_reward`` and veRL's
``compute_score``, the GRPO recipe's ``--rewards``, ``capreward score``, ``capreward explain`` and
``capreward serve``. Nothing registers it by hand; the numbers are counted by hand from the captions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.slow  # six fresh processes (pip, the CLI, the server): a minute or more on a busy machine

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "capreward-toy-plugin"
version = "0.0.1"

[tool.setuptools]
py-modules = ["toy_plugin_metric"]

[project.entry-points."capreward.metrics"]
word_overlap = "toy_plugin_metric"
"""


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that has the plugin installed (its site directory first on the path)."""
    root = tmp_path_factory.mktemp("plugin")
    package = root / "pkg"
    package.mkdir()
    (package / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
    shutil.copy(HERE / "toy_metric.py", package / "toy_plugin_metric.py")
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(package)], check=True, capture_output=True, text=True, timeout=600)
    assert (next(site.glob("*.dist-info")) / "entry_points.txt").read_text().count("capreward.metrics") == 1
    paths = [str(site), str(REPO / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("media")
    Image.new("RGB", (16, 16), (200, 10, 10)).save(root / "red.png")
    rows = [{"id": "refs", "caption": "a red car", "image": "red.png", "references": ["A red car on a road."]},
            {"id": "bare", "caption": "a yellow lorry", "image": "red.png"}]
    (root / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_library_entry_points_reach_the_installed_metric(plugin_env, media):
    script = textwrap.dedent(f"""
        import json
        import os
        from capreward import registry
        from capreward.adapters.factory import build_reward
        from capreward.adapters.verl import compute_score
        from capreward.recipes.grpo_captioner import parse_rewards
        from capreward.rewards import MetricReward, reward_for
        from capreward.torchmetrics import metric_for

        image = {str(media / "red.png")!r}
        out = {{"names": list(registry.names()), "module": registry.get("word-overlap-toy").scorer,
               "recipe": parse_rewards("word-overlap-toy:2")}}
        for label, reward in (("reward_for", reward_for("word_overlap")), ("build_reward", build_reward("word_overlap"))):
            assert type(reward) is MetricReward
            out[label] = reward(None, ["a red car", "a blue car"], image=[image] * 2, references=[["a red car"]] * 2)
        metric = metric_for("word_overlap")
        metric.update(["a red car", "a blue car"], [image, image], [["a red car"], ["a red car"]])
        out["metric"] = [list(metric.columns), float(metric.compute())]
        os.environ["CAPREWARD_REWARD"] = "word-overlap-toy"  # veRL's reward, chosen by name in the environment
        out["verl"] = compute_score("captions", "a blue car", ["a red car"], {{"image": image}})
        print(json.dumps(out))
    """)
    proc = run([sys.executable, "-c", script], plugin_env, media)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["names"][-1] == "word_overlap" and got["module"] == "toy_plugin_metric:WordOverlap"
    assert got["recipe"] == [["word_overlap", 2.0]]
    # "a red car" against "a red car": 3 of 3 words; "a blue car": a and car, 2 of 3
    assert got["reward_for"] == got["build_reward"] == pytest.approx([1.0, 2 / 3])
    assert got["metric"][0] == ["score", "empty", "words", "overlap"]
    assert got["metric"][1] == pytest.approx((1 + 2 / 3) / 2)
    assert got["verl"] == pytest.approx(2 / 3)


def test_score_and_explain_reach_the_installed_metric(plugin_env, media):
    cli = [sys.executable, "-m", "capreward.cli.main"]
    run([*cli, "score", "m.jsonl", "--out", "out.jsonl", "--metrics", "word-overlap-toy", "--no-progress",
         "--word-overlap-min-letters", "4"], plugin_env, media)
    rows = {r["id"]: r for r in map(json.loads, (media / "out.jsonl").read_text().splitlines())}
    assert rows["refs"]["word_overlap"] == 1.0 and rows["refs"]["word_overlap/words"] == 3
    assert rows["bare"]["word_overlap"] == pytest.approx(2 / 3)  # yellow and lorry have 4 letters or more
    run([*cli, "explain", "m.jsonl", "--out", "why.jsonl", "--metric", "word_overlap", "--references", "--no-progress"],
        plugin_env, media)
    why = {r["id"]: r for r in map(json.loads, (media / "why.jsonl").read_text().splitlines())}
    assert why["refs"]["explanation"] == "found in the references: a, red, car"
    assert why["bare"]["errors"] == {"word_overlap": "ValueError: --references: row 'bare' has no references"}


def test_serve_reaches_the_installed_metric(plugin_env, media, monkeypatch):
    from capreward.server.http import post_json
    from serve_process import Server

    monkeypatch.setenv("PYTHONPATH", plugin_env["PYTHONPATH"])
    server = Server(["--reward", "word-overlap-toy", "--media-root", str(media), "--word-overlap-min-letters", "4"])
    try:
        prompt = "USER: describe ASSISTANT:"
        status, body = post_json(f"{server.url}/get_reward", {
            "query": [prompt + "a yellow lorry", prompt + "a red car"], "prompts": [prompt] * 2,
            "labels": [{"image": "red.png"}, {"image": "red.png", "references": ["the red car"]}]})
    finally:
        server.stop()
    assert status == 200
    # no references: 2 of 3 words have at least 4 letters; with references: "a" is not in "the red car"
    assert body["rewards"] == pytest.approx([2 / 3, 2 / 3])
