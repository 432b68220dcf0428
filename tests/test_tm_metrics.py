"""The torchmetrics metrics: values equal the scorers' own (computed separately), per-sample results
ordered and deduplicated by sample id, syncing across (simulated) processes, empty captions, state_dict
without the backbone, a shared backbone that is never copied or moved, and clear errors."""

from __future__ import annotations

import copy
import math
import random
import warnings

import numpy as np
import pytest
import torch
from torchmetrics import MetricCollection

from conftest import random_video
from fixtures_llava import colour_images, fleur, tiny_judge, tiny_judge_path  # noqa: F401

from capreward import CLIPScore, EMScore, PACScore
from capreward.backbones import CLIPBackbone
from capreward.torchmetrics import CaptionScores, CLIPScoreMetric, EMScoreMetric, FLEURMetric
from capreward.testing import tiny_clip_factory

pytestmark = pytest.mark.integration  # run by scripts/version_matrix.sh at both ends

CAPTIONS = ["a red car on a road", "two dogs", "a bowl of fruit", "snow on a mountain", "a man cooking", "a cat"]
REFS = [["a car", "a red vehicle"], ["dogs playing"], ["fruit in a bowl"], ["a snowy peak"], ["someone cooks"], ["a kitten"]]
FRAMES = 4


@pytest.fixture(scope="module")
def videos():
    return [random_video(s, frames=FRAMES, height=32, width=32) for s in range(len(CAPTIONS))]


@pytest.fixture(scope="module")
def fresh_scorers():
    """Scorers on their own backbone instance: the independent path the metrics are checked against."""
    backbone = CLIPBackbone(tiny_clip_factory(0))
    return EMScore(backbone=backbone, frames=FRAMES), CLIPScore(backbone=backbone, frames=FRAMES)


def test_emscore_metric_equals_the_scorer(tiny_backbone, videos, fresh_scorers):
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES, sub_scores=True, per_sample=True)
    order = [4, 1, 5, 0, 3, 2]  # updates arrive in a different order than the ids
    for chunk in (order[:2], order[2:5], order[5:]):
        metric.update([CAPTIONS[i] for i in chunk], [videos[i] for i in chunk], [REFS[i] for i in chunk], ids=chunk)
    out = metric.compute()

    direct = fresh_scorers[0].score(CAPTIONS, videos=videos, references=REFS)
    assert out["per_sample/id"].tolist() == list(range(6))
    torch.testing.assert_close(out["per_sample/score"], direct.score, atol=1e-5, rtol=0)
    assert float(out["score"]) == pytest.approx(float(direct.score.double().mean()), abs=1e-5)
    for part in ("video", "reference", "combined"):
        for name, value in getattr(direct, part).as_dict().items():
            torch.testing.assert_close(out[f"per_sample/{part}/{name}"], value, atol=1e-5, rtol=0)
            assert float(out[f"{part}/{name}"]) == pytest.approx(float(value.double().mean()), abs=1e-5)
    assert float(out["empty"]) == 0.0 and float(out["truncated"]) == 0.0

    # the default compute() is just the mean, as a 0-d tensor
    plain = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    plain.update(CAPTIONS, videos)
    value = plain.compute()
    assert value.ndim == 0
    assert float(value) == pytest.approx(float(fresh_scorers[0].score(CAPTIONS, videos=videos).score.double().mean()), abs=1e-5)


def test_emscore_metric_on_images_and_reference_only(tiny_backbone, videos, fresh_scorers):
    images = [v[0] for v in videos]
    metric = EMScoreMetric(backbone=tiny_backbone, visual="image", per_sample=True)
    metric.update(CAPTIONS, images)
    direct = fresh_scorers[0].score(CAPTIONS, images=images)
    torch.testing.assert_close(metric.compute()["per_sample/score"], direct.score, atol=1e-5, rtol=0)

    refs_only = EMScoreMetric(backbone=tiny_backbone, visual=None, sub_scores=True)
    refs_only.update(CAPTIONS, references=REFS)
    out = refs_only.compute()
    direct = fresh_scorers[0].score(CAPTIONS, references=REFS)
    assert float(out["score"]) == pytest.approx(float(direct.score.double().mean()), abs=1e-5)
    assert "reference/fine_r" in out and "video/fine_r" not in out  # columns never computed are left out


def test_clipscore_metric_equals_the_scorer(tiny_backbone, videos, fresh_scorers):
    images = [v[0] for v in videos]
    clip_s = CLIPScoreMetric(backbone=tiny_backbone, sub_scores=True)
    clip_s.update(CAPTIONS[:3], images[:3])
    clip_s.update(CAPTIONS[3:], torch.from_numpy(np.stack(images[3:])))  # a batched uint8 tensor works too
    direct = fresh_scorers[1].score(CAPTIONS, images=images)
    out = clip_s.compute()
    assert float(out["score"]) == pytest.approx(float(direct.clip_s.double().mean()), abs=1e-5)
    assert "ref_clip_s" not in out

    ref = CLIPScoreMetric(backbone=tiny_backbone, visual="video", frames=FRAMES, per_sample=True, sub_scores=True)
    ref.update(CAPTIONS, videos, REFS, ids=range(6))
    direct = fresh_scorers[1].score(CAPTIONS, videos=videos, references=REFS)
    out = ref.compute()
    torch.testing.assert_close(out["per_sample/score"], direct.ref_clip_s, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["per_sample/clip_s"], direct.clip_s, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["per_sample/ref_similarity"], direct.ref_similarity, atol=1e-5, rtol=0)

    # any configured scorer can be wrapped, e.g. PAC-S (w = 2.0) on the same backbone
    pac = CLIPScoreMetric(scorer=PACScore(tiny_clip_factory(0), backbone=tiny_backbone), name="pac_s")
    pac.update(CAPTIONS, images)
    assert pac.name == "pac_s"
    assert float(pac.compute()) == pytest.approx(float(direct_pac(images)), abs=1e-5)


def direct_pac(images):
    return PACScore(tiny_clip_factory(0)).score(CAPTIONS, images=images).clip_s.double().mean()


def test_state_dict_has_no_backbone_and_loads_strictly(tiny_backbone, videos):
    em = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    cs = CLIPScoreMetric(backbone=tiny_backbone, visual="video", frames=FRAMES)
    assert em.scorer.backbone is tiny_backbone and cs.scorer.backbone is tiny_backbone
    em.update(CAPTIONS[:2], videos[:2], ids=[0, 1])
    assert em.state_dict() == {}

    class Module(torch.nn.Module):  # e.g. a LightningModule that keeps its metrics as attributes
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3, 2)
            self.em, self.cs = em, cs

    sd = Module().state_dict()
    assert set(sd) == {"head.weight", "head.bias"}
    Module().load_state_dict(sd, strict=True)

    # with persistent states, exactly the per-sample states are saved and restored
    em.persistent(True)
    sd = em.state_dict()
    assert set(sd) == {"ids", "values"}
    restored = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    restored.persistent(True)
    restored.load_state_dict(sd, strict=True)
    restored._update_count = 1
    assert float(restored.compute()) == float(em.compute())
    em.persistent(False)


def test_shared_backbone_is_never_copied_or_moved(tiny_backbone, videos):
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    params = [(p, p.data_ptr(), p.dtype) for p in tiny_backbone.model.parameters()]
    for clone in (metric.clone(), copy.deepcopy(metric)):
        assert clone.scorer is metric.scorer
    moved = metric.to(torch.device("cpu")).set_dtype(torch.float64).float()
    moved.update(CAPTIONS[:2], videos[:2])
    assert moved.scorer.backbone is tiny_backbone
    assert [(p, p.data_ptr(), p.dtype) for p in tiny_backbone.model.parameters()] == params


def test_duplicate_ids_in_one_update_are_refused_but_padding_across_processes_is_not(tiny_backbone, videos,
                                                                                     fresh_scorers):
    """A real DistributedSampler (2 processes, 5 samples: one padded repeat) gives each process ids without
    a repeat; the metric dedups the padding at sync. The same id twice in one update would drop a sample
    and is refused."""
    from torch.utils.data.distributed import DistributedSampler

    data = list(range(5))
    ranks = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=False)) for r in range(2)]
    assert sorted(ranks[0] + ranks[1]) == [0, 0, 1, 2, 3, 4]  # sample 0 is the padding, on the other process
    states = []
    for r, ids in enumerate(ranks):
        m = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
        m.update([CAPTIONS[i] for i in ids], [videos[i] for i in ids], ids=ids)  # one update per process: accepted
        states.append((torch.cat(m.ids), torch.cat(m.values)))
    remote = iter(states[1])
    rank0 = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES, per_sample=True,
                          dist_sync_fn=lambda t, group=None: [t, next(remote)], distributed_available_fn=lambda: True)
    rank0.update([CAPTIONS[i] for i in ranks[0]], [videos[i] for i in ranks[0]], ids=ranks[0])
    out = rank0.compute()
    assert out["per_sample/id"].tolist() == data
    torch.testing.assert_close(out["per_sample/score"], fresh_scorers[0].score(CAPTIONS[:5], videos=videos[:5]).score,
                               atol=1e-5, rtol=0)
    single = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    with pytest.raises(ValueError, match=r"ids\[1\] = 3 repeats ids\[0\]"):
        single.update(CAPTIONS[:2], videos[:2], ids=torch.tensor([3, 3]))


def test_simulated_two_process_sync_deduplicates_padded_samples(tiny_backbone, videos, fresh_scorers):
    """Rank 0 holds samples 0, 2, 4; rank 1 holds 1, 3, 5 and a repeat of 0 (a DistributedSampler's pad).

    torchmetrics gathers the list states through ``dist_sync_fn``; here it hands back rank 1's states,
    so the sync path (concatenation, then deduplication and ordering by id) runs for real.
    """
    rank1 = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    for chunk in ([1, 3], [5, 0]):
        rank1.update([CAPTIONS[i] for i in chunk], [videos[i] for i in chunk], ids=chunk)
    remote = iter([torch.cat(rank1.ids), torch.cat(rank1.values)])

    def gather(tensor, group=None):
        return [tensor, next(remote)]

    rank0 = EMScoreMetric(
        backbone=tiny_backbone, frames=FRAMES, per_sample=True, dist_sync_fn=gather, distributed_available_fn=lambda: True
    )
    for chunk in ([0, 2], [4]):
        rank0.update([CAPTIONS[i] for i in chunk], [videos[i] for i in chunk], ids=chunk)
    out = rank0.compute()
    direct = fresh_scorers[0].score(CAPTIONS, videos=videos)
    assert out["per_sample/id"].tolist() == list(range(6))
    torch.testing.assert_close(out["per_sample/score"], direct.score, atol=1e-5, rtol=0)
    assert float(out["score"]) == pytest.approx(float(direct.score.double().mean()), abs=1e-5)
    assert len(rank0.ids) == 2  # local state restored after the sync


def test_empty_captions_get_empty_score_and_are_counted(tiny_backbone, videos, fresh_scorers):
    caps = ["", "a red car on a road", "   "]
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES, per_sample=True, sub_scores=True)
    metric.update(caps, videos[:3])
    out = metric.compute()
    direct = fresh_scorers[0].score(caps[1:2], videos=videos[1:2])
    assert out["per_sample/score"].tolist() == pytest.approx([0.0, float(direct.score[0]), 0.0], abs=1e-5)
    assert out["per_sample/empty"].tolist() == [1.0, 0.0, 1.0]
    assert float(out["empty"]) == pytest.approx(2 / 3)
    assert out["per_sample/video/fine_p"][0] == 0.0

    skip = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES, empty_score=None)
    skip.update(caps, videos[:3])
    assert float(skip.compute()) == pytest.approx(float(direct.score[0]), abs=1e-5)  # NaNs left out of the mean

    all_empty = CLIPScoreMetric(backbone=tiny_backbone)
    all_empty.update(["", ""], [v[0] for v in videos[:2]], REFS[:2])
    assert all_empty.summary().values["ref_clip_s"].tolist() == [0.0, 0.0]


def test_forward_gives_the_batch_value_and_compute_the_epoch_value(tiny_backbone, videos, fresh_scorers):
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    first = metric(CAPTIONS[:3], videos[:3])
    metric(CAPTIONS[3:], videos[3:])
    direct = fresh_scorers[0].score(CAPTIONS, videos=videos).score.double()
    assert float(first) == pytest.approx(float(direct[:3].mean()), abs=1e-5)
    assert float(metric.compute()) == pytest.approx(float(direct.mean()), abs=1e-5)
    metric.reset()
    with pytest.warns(UserWarning):
        assert math.isnan(float(metric.compute()))


def test_metric_collection_keeps_metrics_apart(tiny_backbone, videos, fresh_scorers):
    collection = MetricCollection(
        {"em": EMScoreMetric(backbone=tiny_backbone, frames=FRAMES), "cs": CLIPScoreMetric(backbone=tiny_backbone, visual="video", frames=FRAMES)}
    )
    collection.update(CAPTIONS, videos)
    out = collection.compute()
    assert float(out["em"]) == pytest.approx(float(fresh_scorers[0].score(CAPTIONS, videos=videos).score.double().mean()), abs=1e-5)
    assert float(out["cs"]) == pytest.approx(float(fresh_scorers[1].score(CAPTIONS, videos=videos).clip_s.double().mean()), abs=1e-5)


def test_summary_rows(tiny_backbone, videos):
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    metric.update(CAPTIONS[:2], videos[:2], ids=[7, 3])
    summary = metric.summary()
    assert isinstance(summary, CaptionScores) and len(summary) == 2
    rows = summary.rows()
    assert [r["id"] for r in rows] == [3, 7]
    assert rows[0]["score"] == pytest.approx(float(summary.score[0]))
    assert summary.means()["score"] == pytest.approx(summary.mean)


def test_errors_name_the_offending_item(tiny_backbone, videos):
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    with pytest.raises(TypeError, match=r"candidates\[1\]"):
        metric.update(["a dog", None], videos[:2])
    with pytest.raises(ValueError, match="visuals has 3 entries for 2 captions"):
        metric.update(["a dog", "a cat"], videos[:3])
    with pytest.raises(ValueError, match="1 sample ids for 2"):
        metric.update(["a dog", "a cat"], videos[:2], ids=[0])
    with pytest.raises(TypeError, match=r"ids\[1\]"):
        metric.update(["a dog", "a cat"], videos[:2], ids=[0, "x"])
    with pytest.raises(ValueError, match=r"ids\[0\] = -1"):
        metric.update(["a dog", "a cat"], videos[:2], ids=[-1, 1])
    with pytest.raises(ValueError, match=r"ids\[2\] = 4 repeats ids\[0\] in one update"):
        metric.update(["a dog", "a cat", "a bird"], videos[:3], ids=[4, 1, 4])
    assert metric.ids == []  # the refused update kept nothing
    with pytest.raises(TypeError, match=r"references\[0\]\[1\]"):
        metric.update(["a dog", "a cat"], videos[:2], [["ok", 3], ["fine"]])
    with pytest.raises(ValueError, match="needs visuals and/or references"):
        metric.update(["a dog"])
    metric.update(["a dog"], videos[:1], [["a dog"]])
    with pytest.raises(ValueError, match="references=False but earlier updates"):
        metric.update(["a dog"], videos[:1])
    metric.reset()
    metric.update(["a dog"], videos[:1], ids=[0])
    metric.update(["a cat"], videos[1:2])
    with pytest.raises(ValueError, match="some updates gave sample ids"):
        metric.compute()
    with pytest.raises(ValueError, match="visual must be"):
        EMScoreMetric(backbone=tiny_backbone, visual="audio")
    with pytest.raises(ValueError, match="not both"):
        EMScoreMetric(backbone=tiny_backbone, scorer=EMScore(backbone=tiny_backbone))
    with pytest.raises(ValueError, match="CLIP-S needs visuals"):
        CLIPScoreMetric(backbone=tiny_backbone).update(["a dog"], references=[["a dog"]])


# -------------------------------------------------------------------------------------- FLEUR
class _FakeFleur:
    """Duck-typed FLEUR scorer: NaN for captions containing "?" (an answer that did not parse)."""

    def __init__(self):
        self.calls = []

    def score(self, candidates, images=None, references=None, videos=None):
        self.calls.append(list(candidates))
        return type("R", (), {"score": torch.tensor([math.nan if "?" in c else len(c) / 100 for c in candidates])})()


def test_fleur_metric_skips_unparsed_answers_and_reports_the_parse_rate(videos):
    fake = _FakeFleur()
    metric = FLEURMetric(scorer=fake, sub_scores=True, per_sample=True)
    metric.update(["a red ball", "what?", ""], [v[0] for v in videos[:3]], ids=[0, 1, 2])
    out = metric.compute()
    assert fake.calls == [["a red ball", "what?"]]  # the empty caption never reaches the judge
    assert float(out["score"]) == pytest.approx((0.1 + 0.0) / 2)  # NaN left out; empty caption scores 0
    assert float(out["parsed"]) == pytest.approx(0.5)  # of the captions sent to the judge
    assert float(out["empty"]) == pytest.approx(1 / 3)
    assert math.isnan(float(out["per_sample/score"][1]))


def test_fleur_metric_equals_the_fleur_scorer(fleur, tiny_judge, colour_images):  # noqa: F811
    rng = random.Random(0)
    colours = sorted(colour_images)
    images = [colour_images[colours[i % len(colours)]] for i in range(6)]
    captions = [f"a {rng.choice(colours)} ball" for _ in range(5)] + ["no colour words here"]
    direct = fleur.score(captions, images)
    metric = FLEURMetric(scorer=fleur, per_sample=True, sub_scores=True)
    metric.update(captions[:4], images[:4], ids=range(4))
    metric.update(captions[4:], images[4:], ids=range(4, 6))
    out = metric.compute()
    torch.testing.assert_close(out["per_sample/score"], direct.score, atol=1e-5, rtol=0, equal_nan=True)
    assert out["per_sample/parsed"].tolist() == [float(e is None) for e in direct.error]
    valid = direct.score[~torch.isnan(direct.score)].double()
    assert float(out["score"]) == pytest.approx(float(valid.mean()), abs=1e-5)

    built = FLEURMetric(tiny_judge)  # builds its own FLEUR on the given (model, processor)
    built.update(captions[:2], images[:2])
    torch.testing.assert_close(built.summary().score, direct.score[:2], atol=1e-5, rtol=0, equal_nan=True)


def test_forward_still_refuses_mixed_inputs(tiny_backbone, videos):
    """torchmetrics' forward resets around the batch update; the inputs mode survives that reset."""
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES)
    metric(CAPTIONS[:2], videos[:2], REFS[:2])
    with pytest.raises(ValueError, match="references=False but earlier updates"):
        metric(CAPTIONS[2:4], videos[2:4])
    metric.reset()
    metric(CAPTIONS[2:4], videos[2:4])  # after a real reset any mode is accepted again


def test_metrics_sharing_one_backbone_keep_sharing_it_through_copies_and_moves(tiny_backbone, videos):
    """Two metrics on one CLIP inside a module (as in a LightningModule): deep-copying the module, moving
    it and changing its dtype copy and move only the metric states; both metrics of every copy still use
    the one backbone object, whose parameters stay where they were."""
    params = [(p.data_ptr(), p.dtype, p.device) for p in tiny_backbone.model.parameters()]
    module = torch.nn.ModuleDict({
        "em": EMScoreMetric(backbone=tiny_backbone, frames=FRAMES),
        "cs": CLIPScoreMetric(backbone=tiny_backbone, visual="video", frames=FRAMES),
    })
    module["em"].update(CAPTIONS[:2], videos[:2], ids=[0, 1])
    for copy_ in (copy.deepcopy(module), module.to(torch.device("cpu")).double(), module.half().float()):
        assert copy_["em"].scorer.backbone is tiny_backbone and copy_["cs"].scorer.backbone is tiny_backbone
        assert set(copy_.state_dict()) == set()
    collection = MetricCollection({"em": module["em"], "cs": module["cs"]}, compute_groups=False)
    cloned = collection.clone(prefix="val_")
    assert cloned["val_em"].scorer is module["em"].scorer and cloned["val_cs"].scorer is module["cs"].scorer
    assert cloned["val_em"] is not module["em"] and torch.equal(cloned["val_em"].ids[0], module["em"].ids[0])
    assert [(p.data_ptr(), p.dtype, p.device) for p in tiny_backbone.model.parameters()] == params
    # the copies still score, with the same numbers
    copied = copy.deepcopy(module)
    copied["em"].update(CAPTIONS[2:4], videos[2:4], ids=[2, 3])
    module["em"].update(CAPTIONS[2:4], videos[2:4], ids=[2, 3])
    torch.testing.assert_close(copied["em"].summary().score, module["em"].summary().score)


def test_fleur_metric_on_videos_uses_the_composite_and_logs_unscored_answers(fleur, caplog):  # noqa: F811
    clips = [random_video(50 + i, frames=6, height=24, width=24) for i in range(3)]
    captions = ["a red ball", "a blue ball", "red " * 600]  # the last one does not fit the judge's context
    direct = fleur.score(captions, videos=clips)
    assert [e is None for e in direct.error] == [True, True, False]
    metric = FLEURMetric(scorer=fleur, visual="video", per_sample=True)
    with caplog.at_level("INFO", logger="capreward.torchmetrics.metrics"):
        metric.update(captions, clips, ids=[0, 1, 2])
    torch.testing.assert_close(metric.compute()["per_sample/score"], direct.score, atol=1e-5, rtol=0, equal_nan=True)
    assert float(metric.compute()["score"]) == pytest.approx(float(direct.score[:2].double().mean()), abs=1e-5)
    logged = [r.getMessage() for r in caplog.records if "gave no score" in r.getMessage()]
    assert len(logged) == 1 and "1 of 3" in logged[0] and direct.error[2] in logged[0]


def test_dataset_size_warns_when_more_samples_were_counted(tiny_backbone, videos):
    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES, dataset_size=3)
    metric.update(CAPTIONS[:3], videos[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exactly the dataset: no warning
        metric.compute()
    metric.update(CAPTIONS[:1], videos[:1])
    with pytest.warns(UserWarning, match="emscore: 4 samples counted for a dataset of 3; some samples were counted more"):
        metric.compute()
    with pytest.raises(ValueError, match="dataset_size"):
        EMScoreMetric(backbone=tiny_backbone, dataset_size=0)


def test_sampler_ids_follow_the_distributed_sampler_batch_by_batch():
    """The indices read back for each batch are the ones the loader yields, the padding repeat included,
    for an unshuffled and a shuffled (seeded, per-epoch) DistributedSampler; other samplers give None."""
    from torch.utils.data import DataLoader, DistributedSampler

    from capreward.callbacks.sampler_ids import loader_batch_ids

    data = list(range(13))
    for shuffle in (False, True):
        sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=shuffle, seed=3)
        loader = DataLoader(data, batch_size=3, sampler=sampler)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            seen = [batch.tolist() for batch in loader]  # the dataset holds its own index: what the loader fed
            assert [loader_batch_ids(loader, i) for i in range(len(seen))] == seen
            assert loader_batch_ids(loader, len(seen)) is None
        if not shuffle:  # rank 1's share of 13 samples: the odd ones and, to pad, a repeat of sample 0
            assert sum(seen, []) == [1, 3, 5, 7, 9, 11, 0]
    assert loader_batch_ids(DataLoader(data, batch_size=3, shuffle=True), 0) is None
    assert loader_batch_ids(DataLoader(data, batch_size=3), 0) is None


def test_plot_draws_the_main_score_between_the_metric_bounds(tiny_backbone, videos):
    """torchmetrics' Metric.plot conventions: plot() plots compute(); plot(values) a list of forward()
    results as steps; dict results (sub_scores=True) plot their main score; the axis spans the metric's range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = EMScoreMetric(backbone=tiny_backbone, frames=FRAMES, sub_scores=True)
    steps = [metric(CAPTIONS[:3], videos[:3]), metric(CAPTIONS[3:], videos[3:])]
    fig, ax = metric.plot(steps)
    (line,) = [l for l in ax.lines if len(l.get_ydata()) == 2]
    assert list(line.get_ydata()) == pytest.approx([float(s["score"]) for s in steps])
    low, high = ax.get_ylim()
    assert low < -1.0 and high > 1.0  # EMScore's range [-1, 1], with torchmetrics' margin
    plt.close(fig)
    fig, ax = metric.plot()
    assert [float(y) for l in ax.lines for y in l.get_ydata()][:1] == pytest.approx([float(metric.compute()["score"])])
    plt.close(fig)


# ------------------------------------------------------------------------------ round 3: silent behaviours
def test_compute_before_any_scored_update_warns(tiny_backbone):
    metric = CLIPScoreMetric(backbone=tiny_backbone, visual="image")
    with pytest.warns(UserWarning, match="no sample has been scored"):
        assert math.isnan(float(metric.compute()))
    metric.update([], [])  # an update with no captions still scores nothing
    with pytest.warns(UserWarning, match="no sample has been scored"):
        assert math.isnan(float(metric.compute()))


def test_an_id_reused_with_other_content_across_updates_warns(tiny_backbone, videos):
    metric = EMScoreMetric(backbone=tiny_backbone, per_sample=True)
    metric.update(["a man is cooking food"], [videos[0]], ids=[7])
    metric.update(["a man is cooking food"], [videos[0]], ids=[7])  # DDP padding: the same sample again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.compute()
    metric.update(["two dogs play in the snow"], [videos[1]], ids=[7])  # another sample, same id
    with pytest.warns(UserWarning, match=r"sample id\(s\) 7 were given to samples with other scores"):
        out = metric.compute()
    assert out["per_sample/id"].reshape(-1).tolist() == [7]


def test_emscore_metric_fed_images_names_visual_image(tiny_backbone, tmp_path):
    from PIL import Image

    image = Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8))
    path = tmp_path / "red.png"
    image.save(path)
    metric = EMScoreMetric(backbone=tiny_backbone)
    for visuals in ([image], [str(path)], np.zeros((32, 32, 3), dtype=np.uint8), [np.zeros((32, 32, 3), np.uint8)]):
        with pytest.raises(TypeError, match=r'visual="image"'):
            metric.update(["a red image"], visuals)
    metric_images = EMScoreMetric(backbone=tiny_backbone, visual="image")
    metric_images.update(["a red image"], [image])
    assert not math.isnan(float(metric_images.compute()))
