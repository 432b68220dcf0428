"""One reward class (MetricReward) and one torchmetrics Metric (RegisteredMetric) read any metric's spec;
their options are explicit (in the signature, a misspelt one refused at construction with a suggestion),
and the per-metric classes keep their options and defaults. Nothing here loads a model.

That the per-metric classes give the generic classes' values, sub-score logs and pickling, on each
metric's tiny model, is the conformance tester's (tests/test_conformance.py)."""

from __future__ import annotations

import inspect

import pytest

from capreward import registry
from capreward.explicit_options import constructor_parameters
from capreward.registry import UnknownOption
from capreward.rewards import MetricReward, reward_for

REWARDS = registry.names()
METRICS = registry.names()


@pytest.fixture(scope="module")
def clip():
    from capreward.testing import trained_clip_path

    return str(trained_clip_path())


@pytest.mark.parametrize("name", REWARDS)
def test_a_misspelt_option_is_refused_at_construction_with_the_nearest_one(name):
    spec = registry.get(name)
    params, _ = constructor_parameters(spec.load())
    option = params[0].name  # model / backend / emscore ...: nothing is built before the check
    classes = [MetricReward] + ([MetricReward.named[name]] if name in MetricReward.named else [])
    for cls in classes:
        args = (name,) if cls is MetricReward else ()
        with pytest.raises(UnknownOption, match=f"unexpected keyword argument '{option}x' \\(did you mean '{option}'\\?\\)"):
            cls(*args, **{option + "x": None})
        with pytest.raises(TypeError):  # an UnknownOption is the TypeError Python raises for such a keyword
            cls(*args, image_colum="image")


@pytest.mark.parametrize("name", REWARDS)
def test_the_signature_lists_the_scorers_options_and_the_rewards_own(name):
    spec = registry.get(name)
    params, open_kwargs = constructor_parameters(spec.load())
    shown = MetricReward.signature_of(name).parameters
    for p in params:
        assert p.name in shown and shown[p.name].default == p.default, p.name
        assert shown[p.name].kind is inspect.Parameter.KEYWORD_ONLY
    for o in spec.reward_policy.options:  # the reward's own options, from its spec
        assert shown[o.name].default == o.default
    assert {"image_column", "references_column", "injection_guard", "scorer", "name"} <= set(shown)
    assert not open_kwargs and all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in shown.values())
    if name in MetricReward.named:
        assert inspect.signature(MetricReward.named[name]) == MetricReward.signature_of(name)
    assert "metric" in inspect.signature(MetricReward).parameters


def test_the_per_metric_classes_keep_their_options_and_defaults(clip):
    from capreward.rewards import CLIPScoreReward, EMScoreReward, GVEvalReward, HallucinationPenalty, VisCE2Reward
    from capreward.rewards.claims import ClaimsReward
    from capreward.rewards.qa_utility import QAUtilityReward

    em = EMScoreReward(model=clip, idf=False, frames=4, field="coarse", harmonic_mean="released", visual_id_column="v")
    assert (em.field, em.harmonic_mean, em.scorer_kwargs) == ("coarse", "released", {"model": clip, "idf": False, "frames": 4})
    assert em.frames == 4 and em.batch_size == 64  # the scorer's options read through the reward, nothing built
    assert em._scorer is None
    assert em.needs_visual is False and em.injection_guard is False and em.value_range() == (-1.0, 1.0)
    with pytest.raises(ValueError, match="batch"):
        EMScoreReward(model=clip, idf="batch")
    with pytest.raises(ValueError, match="w must be"):
        CLIPScoreReward(model=clip, w=-1)
    assert CLIPScoreReward(model=clip, use_references=False).value_range() == (0.0, 2.5)
    h = HallucinationPenalty(model=clip, threshold=0.3, use_references=True)
    assert h.use_references is False and h.threshold == 0.3 and h.value_range() == (-1.0, 0.0)
    v = VisCE2Reward(backend=object(), use_expected=True, scale=1.0)
    assert v.use_references is False and v.scorer_kwargs["expected"] is True and v.value_range() == (0.0, 100.0)
    assert v.injection_guard is True and v.reason_kind == "judge_unreadable"
    g = GVEvalReward(backend=object(), mode="ref-only")
    assert g.needs_visual is False and g.use_references is True and "parsed" in g.metric_names()
    assert GVEvalReward(backend=object()).use_references is False  # ref-free reads no references
    assert ClaimsReward(backend=object(), part="recall").part == "recall"
    with pytest.raises(ValueError, match="part must be"):
        ClaimsReward(backend=object(), part="both")
    q = QAUtilityReward(backend=object(), questions_column="qs")
    assert q.questions_column == "qs" and q.needs_visual is False and q.injection_guard is True


def test_a_wrong_metric_name_is_refused_with_the_nearest_name():
    with pytest.raises(registry.UnknownMetric, match="did you mean 'emscore'"):
        MetricReward("emscor")
    with pytest.raises(TypeError, match="needs a metric name"):
        MetricReward()
    from capreward.rewards import EMScoreReward

    with pytest.raises(ValueError, match="use MetricReward"):
        EMScoreReward("clip_s")


# ------------------------------------------------------------------------------------ torchmetrics
@pytest.mark.parametrize("name", METRICS)
def test_the_metrics_options_are_explicit(name):
    from capreward.torchmetrics import RegisteredMetric

    spec = registry.get(name)
    params, open_kwargs = constructor_parameters(spec.load())
    shown = RegisteredMetric.signature_of(name).parameters
    assert list(shown)[0] == params[0].name  # model / backend, positional as before
    for p in params:
        assert p.name in shown, p.name
    assert {"scorer", "per_sample", "sub_scores", "dataset_size", "sync_on_compute"} <= set(shown)
    option = params[1].name
    classes = [RegisteredMetric] + ([RegisteredMetric.named[name]] if name in RegisteredMetric.named else [])
    for cls in classes:
        args = (name,) if cls is RegisteredMetric else ()
        if open_kwargs:  # the scorer forwards **options (the hallucination penalty's to its EMScore): it refuses them
            with pytest.raises(TypeError, match=f"'{option}x'"):
                cls(*args, **{option + "x": 1})
            continue
        with pytest.raises(UnknownOption, match=f"'{option}x' \\(did you mean '{option}'\\?\\)"):
            cls(*args, **{option + "x": 1})
        if name in RegisteredMetric.named:
            assert inspect.signature(RegisteredMetric.named[name]) == RegisteredMetric.signature_of(name)
