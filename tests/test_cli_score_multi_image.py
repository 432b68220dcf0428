"""`capreward score` on rows with several images (``"image": [path, ...]``): every image is scored, each
metric's value is the ``--image-aggregation`` (mean, min, max) of the images' values, the per-image values
are written in ``<metric>/per_image``; an image without a value leaves the metric without one, naming the
image; resumes check every image; the aggregation is a recorded setting. Run through the CLI, against
direct scorer calls on each image."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from capreward import CLIPScore, EMScore
from capreward.jobs.manifest import ManifestError, read_manifest
from capreward.jobs.results_file import read_results

from conftest import random_video
import cli_process

REFS = ["a person", "a dog runs"]


def cli(*args):
    return cli_process.run(args, timeout=600)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("multi")
    paths = []
    for i in range(3):
        p = d / f"im{i}.png"
        Image.fromarray(random_video(20 + i, frames=1)[0]).save(p)
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def manifest(images, tmp_path_factory):
    d = images[0].parent
    rows = [
        {"id": "one", "caption": "a red car", "image": str(images[0])},
        {"id": "three", "caption": "a red car", "image": [str(p) for p in images], "references": REFS},
        {"id": "relative", "caption": "two dogs", "image": [images[2].name, images[1].name]},
        {"id": "listed-once", "caption": "two dogs", "image": [str(images[1])]},
        {"id": "missing", "caption": "a cat", "image": [str(images[0]), str(d / "nope.png")]},
    ]
    path = d / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def direct(tiny_clip_path, caption, paths, refs=None):
    """CLIP-S and RefCLIP-S as ``capreward score`` forms them (sign-safe harmonic mean, its default)."""
    from capreward.metrics.clipscore import ref_clip_s
    from capreward.metrics.harmonic import sign_safe_harmonic_mean

    res = CLIPScore(model=tiny_clip_path).score([caption] * len(paths), images=[str(p) for p in paths],
                                               references=[refs] * len(paths) if refs else None)
    ref = None if refs is None else ref_clip_s(res.clip_s, res.ref_similarity, sign_safe_harmonic_mean)
    return [float(v) for v in res.clip_s], (None if refs is None else [float(v) for v in ref])


def direct_emscore(tiny_clip_path, caption, paths, refs=None):
    res = EMScore(model=tiny_clip_path, idf=False).score([caption] * len(paths), images=[str(p) for p in paths],
                                                        references=[refs] * len(paths) if refs else None,
                                                        harmonic_mean="sign-safe")  # score's default
    return [float(v) for v in res.score]


@pytest.mark.parametrize("how", ["mean", "min", "max"])
def test_several_images_are_each_scored_and_aggregated(tmp_path, manifest, images, tiny_clip_path, how):
    out = tmp_path / f"{how}.jsonl"
    proc = cli("score", manifest, "--out", out, "--metrics", "emscore,clip-s", "--clip-model", tiny_clip_path,
               "--idf", "none", "--image-aggregation", how, "--batch-size", "3", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in read_results(out)}
    assert list(rows) == ["one", "three", "relative", "listed-once", "missing"]
    reduce = {"mean": np.mean, "min": np.min, "max": np.max}[how]

    three = rows["three"]
    per, ref_per = direct(tiny_clip_path, "a red car", images, REFS)
    assert three["image"] == [str(p) for p in images] and three["errors"] is None
    assert three["clip_s"] == pytest.approx(float(reduce(per)), abs=1e-6)
    assert three["ref_clip_s"] == pytest.approx(float(reduce(ref_per)), abs=1e-6)
    entries = three["clip_s/per_image"]
    assert [e["image"] for e in entries] == [str(p) for p in images]
    assert [e["clip_s"] for e in entries] == pytest.approx(per, abs=1e-6)
    assert [e["ref_clip_s"] for e in entries] == pytest.approx(ref_per, abs=1e-6)
    assert all(e["error"] is None for e in entries)
    em = direct_emscore(tiny_clip_path, "a red car", images, REFS)
    assert len(set(np.round(em, 6))) == 3  # the images differ: the aggregation is tested, not a constant
    assert three["emscore"] == pytest.approx(float(reduce(em)), abs=1e-6)
    assert [e["emscore"] for e in three["emscore/per_image"]] == pytest.approx(em, abs=1e-6)
    assert all(any(k.startswith("emscore/") for k in e) for e in three["emscore/per_image"])  # sub-scores per image
    assert not any(k.startswith("emscore/") and k != "emscore/per_image" for k in three)
    assert isinstance(three["visual_hash"], list) and len(three["visual_hash"]) == 3 and None not in three["visual_hash"]

    # a single-image row beside them is unchanged: its value is its image's, no per-image list
    assert rows["one"]["clip_s"] == pytest.approx(per[0], abs=1e-6) and "clip_s/per_image" not in rows["one"]
    # relative paths resolve against the manifest's folder, in the given order
    rel, _ = direct(tiny_clip_path, "two dogs", [images[2], images[1]])
    assert rows["relative"]["image"] == [str(images[2]), str(images[1])]
    assert rows["relative"]["clip_s"] == pytest.approx(float(reduce(rel)), abs=1e-6)
    # a list of one image is a plain image row
    assert rows["listed-once"]["image"] == str(images[1]) and rows["listed-once"]["clip_s"] == pytest.approx(rel[1], abs=1e-6)

    # an image that cannot be read: no value (never the other image's), the image named
    missing = rows["missing"]
    assert missing["clip_s"] is None and missing["emscore"] is None
    for metric in ("clip_s", "emscore"):
        assert "image 1 of 2" in missing["errors"][metric] and "does not exist" in missing["errors"][metric]
    assert missing["clip_s/per_image"][0]["clip_s"] is not None and missing["clip_s/per_image"][1]["error"]


def test_a_resume_keeps_the_rows_and_refuses_another_aggregation(tmp_path, manifest, tiny_clip_path):
    out = tmp_path / "r.jsonl"
    base = ["score", manifest, "--out", out, "--metrics", "clip-s", "--clip-model", tiny_clip_path, "--no-progress"]
    assert cli(*base).returncode == 0
    first = read_results(out)
    again = cli(*base)
    assert again.returncode == 0, again.stderr
    assert read_results(out) == first
    other = cli(*base, "--image-aggregation", "min")
    assert other.returncode == 2 and "--image-aggregation" in other.stderr


def test_manifest_lists_of_visuals_are_checked(tmp_path):
    m = tmp_path / "m.jsonl"
    for row, message in [({"caption": "x", "image": []}, "non-empty list of paths"),
                         ({"caption": "x", "image": ["a.png", ""]}, "non-empty list of paths"),
                         ({"caption": "x", "image": ["a.png", 3]}, "non-empty list of paths"),
                         ({"caption": "x", "video": ["a.mp4", "b.mp4"]}, "one video per row")]:
        m.write_text(json.dumps(row) + "\n")
        with pytest.raises(ManifestError, match=message):
            read_manifest(m)
    m.write_text(json.dumps({"caption": "x", "image": ["a.png", "/abs/b.png"]}) + "\n")
    (row,) = read_manifest(m)
    assert row.paths == [str(tmp_path / "a.png"), "/abs/b.png"] and row.path == row.paths[0]
    assert row.visual == row.paths
