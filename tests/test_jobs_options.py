"""``run_job`` scores with its own copy of the options: the caller's ScoreOptions is never written to."""

from __future__ import annotations

import dataclasses
import json

from capreward.jobs.results_file import read_results
from capreward.jobs.runners import ScoreOptions
from capreward.jobs.score_job import run_job

from conftest import write_job_media


def test_run_job_leaves_the_callers_options_as_they_were(tmp_path, tiny_clip_path):
    image, video = write_job_media(tmp_path)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "caption": "a red car", "image": str(image), "references": ["a car", "a red vehicle"]},
        {"id": "b", "caption": "a man cooks", "video": str(video), "references": ["cooking"]},
    ]))
    options = ScoreOptions(metrics=["emscore", "hallucination"], clip_model=str(tiny_clip_path), frames=4)
    before = dataclasses.asdict(options)
    summary = run_job(manifest, tmp_path / "out.jsonl", options, idf="auto", progress=False)
    assert summary["written"] == 2 and "references" in summary["idf"]  # the job did use an idf table
    assert dataclasses.asdict(options) == before and options.idf_weights is None
    assert {r["id"] for r in read_results(tmp_path / "out.jsonl")} == {"a", "b"}
