"""The metric registry: one spec per metric, read by every consumer.

Lookups (canonical names, aliases, any spelling), did-you-mean on a wrong name, a lazy registry (no torch
or scorer imported to read a spec), and each spec's ``sub_scores`` against what its scorer really writes,
for several configurations, on the tiny models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from capreward import names, registry
from capreward.registry import Deviation, MetricSpec, Option

from conftest import random_video, write_mp4

BUILTIN = ("emscore", "clip_s", "pac_s", "fleur", "hallucination", "visce2", "gveval", "claims", "qa_utility")


def test_every_builtin_metric_has_one_spec_in_the_registry_order():
    assert registry.names() == BUILTIN
    assert tuple(s.name for s in registry.specs()) == BUILTIN
    assert names.METRICS == BUILTIN  # the names module is a view of the registry
    for spec in registry.specs():
        assert registry.get(spec.name) is spec
        assert spec.references in ("none", "optional", "required")
        assert spec.value_range[0] < spec.value_range[1]
        assert set(spec.visuals) <= {"image", "video"}
        assert spec.title and spec.summary and spec.paper
        assert len({o.name for o in spec.options}) == len(spec.options)


def test_aliases_and_spellings_resolve_to_the_canonical_name():
    assert registry.get("CLIPScore").name == "clip_s"
    assert registry.get("clip-s").name == "clip_s"
    assert registry.get(" PAC-S ").name == "pac_s"
    assert registry.get("VisCE²").name == "visce2"
    assert registry.get("G-VEval").name == "gveval"
    assert registry.get("hallucination_penalty").name == "hallucination"
    assert names.ALIASES == registry.aliases()
    assert set(registry.aliases().values()) <= set(BUILTIN)
    assert registry.lookup("bleu") is None


def test_a_wrong_name_is_refused_with_the_nearest_names():
    with pytest.raises(registry.UnknownMetric, match=r"unknown metric 'emscor' \(did you mean 'emscore'\?\); choose one of emscore"):
        registry.get("emscor")
    with pytest.raises(ValueError, match=r"did you mean 'visce2'"):
        registry.get("visce")
    with pytest.raises(KeyError):  # also a KeyError, as a mapping lookup would raise
        registry.get("gvevl")
    with pytest.raises(ValueError, match=r"^unknown metric 'bleu'; choose one of"):  # nothing close: no guess
        registry.get("bleu")
    with pytest.raises(TypeError):
        registry.get(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"did you mean 'clip_s'"):
        names.canonical("clipscor")


def test_sharing_idf_and_backbones_are_read_from_the_specs():
    assert registry.sharing("clip") == ("emscore", "clip_s", "hallucination")
    assert registry.sharing("chat_judge") == ("fleur", "visce2", "gveval", "claims")
    assert registry.on_backbone("clip") == ("emscore", "clip_s", "pac_s", "hallucination")
    assert registry.using_idf() == ("emscore", "hallucination")
    with pytest.raises(ValueError):
        registry.sharing("gpu")


def test_configuration_dependent_facts():
    gveval = registry.get("gveval")
    assert gveval.references_for({"mode": "ref-free"}) == "none"
    assert gveval.references_for({"mode": "ref-only"}) == "required"
    assert gveval.references_for({"mode": "combined"}) == "required"
    assert gveval.visual_kinds({"accr": True}) == ("video",)
    assert gveval.visual_kinds() == ("image", "video")
    assert registry.get("visce2").visual_kinds() == ("image",)
    assert registry.get("clip_s").field_of("ref") == "ref_clip_s"
    assert registry.get("fleur").field_of("raw") == "fleur/raw"
    assert registry.get("emscore").option("idf").default is False
    with pytest.raises(KeyError, match="has no option 'nope'"):
        registry.get("emscore").option("nope")
    for spec in registry.specs():  # every deviation names what differs; most say how to restore the release
        assert all(isinstance(d, Deviation) and d.what for d in spec.deviations)


def test_register_adds_a_metric_and_refuses_a_taken_alias():
    spec = MetricSpec(name="toy_metric", aliases=("toy",), title="Toy", summary="s", paper="p", released_code=None,
                      scorer="capreward.scorers.clipscore:CLIPScore", options=(Option("w", 1.0, "scale"),))
    try:
        assert registry.register(spec) is spec
        assert registry.get("TOY").name == "toy_metric" and "toy_metric" in names.METRICS
        with pytest.raises(ValueError, match="already names"):
            registry.register(MetricSpec(name="other_toy", aliases=("clipscore",), title="T", summary="s", paper="p",
                                         released_code=None, scorer="a:b"))
        with pytest.raises(ValueError, match="lower case"):
            registry.register(MetricSpec(name="Toy-2", aliases=(), title="T", summary="s", paper="p",
                                         released_code=None, scorer="a:b"))
        with pytest.raises(ValueError, match="references"):
            MetricSpec(name="x", aliases=(), title="T", summary="s", paper="p", released_code=None, scorer="a:b",
                       references="sometimes")
    finally:
        registry._SPECS.pop("toy_metric", None)
        registry._ALIASES.pop("toy", None)
    assert registry.names() == BUILTIN


def test_reading_the_registry_imports_no_scorer_and_no_torch():
    code = ("import sys, capreward.registry as r, capreward.names as n\n"
            "specs = r.specs(); [s.sub_scores_for({'references': True}) for s in specs]; n.METRICS; n.canonical('clip-s')\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'open_clip', 'numpy')"
            " or m in [s.scorer.partition(':')[0] for s in specs])\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_load_imports_the_scorer_class():
    from capreward.scorers.clipscore import CLIPScore, PACScore
    from capreward.scorers.emscore import EMScore
    from capreward.scorers.gveval import GVEval

    assert registry.get("emscore").load() is EMScore
    assert registry.get("clip_s").load() is CLIPScore and registry.get("pac_s").load() is PACScore
    assert registry.get("gveval").load() is GVEval
    for spec in registry.specs():
        assert callable(spec.load())


# ------------------------------------------------------------------ sub-scores against the scorers' output
@pytest.mark.parametrize("visual", ["image", "video"])
@pytest.mark.parametrize("references", [False, True])
def test_emscore_sub_scores_are_what_the_scorer_writes(tiny_backbone, tmp_path, visual, references):
    from capreward.scorers.emscore import EMScore

    scorer = EMScore(backbone=tiny_backbone, frames=4)
    clip = random_video(0, frames=6)
    visuals = {"videos": [clip]} if visual == "video" else {"images": [clip[0]]}
    res = scorer.score(["a red car"], references=[["a car", "a red vehicle"]] if references else None, **visuals)
    written = tuple(k for k in res.rows()[0] if k != "score")
    assert written == registry.get("emscore").sub_scores_for({"visual": visual, "references": references})
    refs_only = scorer.score(["a red car"], references=[["a car"]])
    assert tuple(k for k in refs_only.rows()[0] if k != "score") == registry.get("emscore").sub_scores_for(
        {"visual": None, "references": True})


def manifest(tmp_path: Path, rows: list[dict]):
    from capreward.jobs.manifest import read_manifest

    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_manifest(path)


def metric_fields(row: dict, metric: str) -> set[str]:
    spec = registry.get(metric)
    legacy = set(spec.result_fields.values())
    return {k for k in row if k == metric or k.startswith(metric + "/") or k in legacy}


def test_clip_metrics_write_the_fields_of_their_specs(tmp_path, tiny_clip_path):
    from PIL import Image

    from capreward.jobs.runners import ManifestScorer, ScoreOptions

    image = tmp_path / "im.png"
    Image.fromarray(random_video(3, frames=1)[0]).save(image)
    video = write_mp4(tmp_path / "v.mp4", random_video(4, frames=6))
    rows = manifest(tmp_path, [
        {"id": "i", "caption": "a red car", "image": str(image)},
        {"id": "ir", "caption": "a red car", "image": str(image), "references": ["a car"]},
        {"id": "v", "caption": "a man cooks", "video": str(video)},
        {"id": "vr", "caption": "a man cooks", "video": str(video), "references": ["cooking", "a kitchen"]},
    ])
    metrics = ["emscore", "clip_s", "hallucination"]
    out = ManifestScorer(ScoreOptions(metrics=metrics, clip_model=str(tiny_clip_path), frames=4)).score_rows(rows)
    for row, r in zip(out, rows):
        assert row["errors"] is None
        config = {"visual": r.kind, "references": r.references is not None}
        for metric in metrics:
            assert metric_fields(row, metric) == set(registry.get(metric).fields(config)), (metric, r.id)


def test_judge_metrics_write_the_fields_of_their_specs(tmp_path):
    import torch

    from capreward.jobs.runners import ManifestScorer, ScoreOptions
    from capreward.testing.tiny_vlm_judges import probe_image, synthetic_video, tiny_vlm_judge_dir

    image = tmp_path / "im.png"
    probe_image("visce2", "green").save(image)
    video = write_mp4(tmp_path / "v.mp4", synthetic_video("red"))
    rows = manifest(tmp_path, [
        {"id": "i", "caption": "a green ball", "image": str(image), "references": ["a green square"]},
        {"id": "v", "caption": "a red car", "video": str(video), "references": ["a red square"]},
    ])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for accr in (False, True):
            options = ScoreOptions(metrics=["visce2", "gveval"], judge_model=str(tiny_vlm_judge_dir()),
                                   gveval_mode="combined", gveval_accr=accr)
            out = ManifestScorer(options).score_rows(rows)
            for row, r in zip(out, rows):
                config = {"visual": r.kind, "references": True, "mode": "combined", "accr": accr}
                for metric in ("visce2", "gveval"):
                    spec = registry.get(metric)
                    written = metric_fields(row, metric)
                    if r.kind in spec.visual_kinds(config):
                        assert written == set(spec.fields(config)), (metric, r.id, accr)
                    else:  # a visual the metric does not take: an error, no field
                        assert written == set() and metric in row["errors"], (metric, r.id, accr)
    finally:
        torch.set_num_threads(threads)


def test_fleur_writes_the_fields_of_its_spec(tmp_path):
    import torch

    from capreward.jobs.runners import ManifestScorer, ScoreOptions
    from capreward.testing import FLEUR_RECIPE, tiny_judge_dir
    from capreward.testing.tiny_llava import fleur_task_image

    image = tmp_path / "im.png"
    fleur_task_image("red").save(image)
    rows = manifest(tmp_path, [{"id": "i", "caption": "a red car", "image": str(image)},
                               {"id": "ir", "caption": "a red car", "image": str(image), "references": ["a red square"]}])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = ManifestScorer(ScoreOptions(metrics=["fleur"], judge_model=str(tiny_judge_dir(FLEUR_RECIPE)))).score_rows(rows)
    finally:
        torch.set_num_threads(threads)
    for row, r in zip(out, rows):
        assert metric_fields(row, "fleur") == set(registry.get("fleur").fields({"references": r.references is not None}))


def test_the_named_classes_are_the_generic_ones_under_the_metrics_name():
    from capreward.rewards import MetricReward
    from capreward.torchmetrics import RegisteredMetric, judges, metrics  # noqa: F401  (the named classes)

    for name, cls in MetricReward.named.items():
        assert vars(cls)["__name__"] == name == cls.metric  # the instances' __name__ (TRL's key)
    for name, cls in RegisteredMetric.named.items():
        assert cls.default_name == name == cls.metric
    # a metric with no named class gets the generic one fixed to it (PAC-S, the hallucination penalty)
    for name in ("pac_s", "hallucination"):
        assert name not in RegisteredMetric.named
        built = RegisteredMetric.class_for(name)
        assert built.func is RegisteredMetric and built.args == (name,)


def test_a_spec_holds_facts_only():
    """No spec names code of a consumer package: its only code references are its scorers."""
    import dataclasses

    for spec in registry.specs():
        for f in dataclasses.fields(spec):
            value = getattr(spec, f.name)
            if isinstance(value, str) and ":" in value and value.startswith("capreward."):
                assert f.name in ("scorer", "remote_scorer") and value.startswith("capreward.scorers."), (spec.name, f.name)


def test_generic_consumers_build_any_metric_by_name(tiny_backbone):
    from capreward.rewards import CLIPScoreReward, EMScoreReward, HallucinationPenalty, reward_for
    from capreward.torchmetrics import EMScoreMetric, metric_for

    reward = reward_for("CLIPScore", backbone=tiny_backbone, w=2.0)
    assert type(reward) is CLIPScoreReward and reward.__name__ == "clip_s"
    assert type(reward_for("em", backbone=tiny_backbone)) is EMScoreReward
    assert type(reward_for("hallucination_penalty", backbone=tiny_backbone)) is HallucinationPenalty
    metric = metric_for("emscore", backbone=tiny_backbone)
    assert type(metric) is EMScoreMetric
    with pytest.raises(ValueError, match="did you mean 'emscore'"):
        reward_for("emscor")


def test_the_hallucination_penalty_has_a_metric_through_the_generic_class(tiny_backbone):
    """Hallucination is a scorer like the others: its torchmetrics Metric is the generic one (its hooks
    read the penalty, the flagged and content token counts), equal to the scorer called directly."""
    import numpy as np

    from capreward.scorers.hallucination import Hallucination
    from capreward.torchmetrics import metric_for

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(3)]
    captions = ["a red car on a road", "a blue kite", "the image"]
    metric = metric_for("hallucination", backbone=tiny_backbone, visual="image", frames=2)
    assert metric.name == "hallucination" and metric.columns[:2] == ("score", "empty")
    metric.update(captions, images)
    direct = Hallucination(backbone=tiny_backbone, frames=2).score(captions, images=images)
    assert float(metric.compute()) == pytest.approx(sum(direct.penalty) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="needs visuals"):
        metric.update(captions, None, [["a car"]] * 3)
