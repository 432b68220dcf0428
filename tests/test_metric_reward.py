"""One reward class (MetricReward) and one torchmetrics Metric (RegisteredMetric) read any metric's spec;
the per-metric classes are them fixed to one metric: the same values, sub-score logs and pickling, and
options that are explicit (in the signature, a misspelt one refused at construction with a suggestion).

Each metric runs on its tiny trained model (the CLIP of capreward.testing.trained_clip, the tiny FLEUR,
VLM, claim and QA judges), built once per module.
"""

from __future__ import annotations

import inspect
import math
import pickle
import random

import pytest

from capreward import registry
from capreward.explicit_options import constructor_parameters
from capreward.registry import UnknownOption
from capreward.rewards import MetricReward, reward_for
from fixtures_llava import one_torch_thread, tiny_judge, tiny_judge_path, vlm_judge  # noqa: F401 (fixtures)

REWARDS = [s.name for s in registry.specs() if s.reward_hooks is not None]
METRICS = [s.name for s in registry.specs() if s.metric_hooks is not None]


@pytest.fixture(scope="module")
def clip():
    from capreward.testing import trained_clip_path

    return str(trained_clip_path())


@pytest.fixture(scope="module")
def claim_backend():
    from capreward.judges import LocalChatJudge
    from capreward.testing.tiny_claim_judge import tiny_claim_judge

    return LocalChatJudge(tiny_claim_judge())


@pytest.fixture(scope="module")
def qa():
    from capreward.testing.tiny_qa_judge import qa_backend

    return qa_backend()


def reward_case(name: str, request) -> tuple[dict, list[str], dict]:
    """(options, captions, dataset columns) for metric ``name`` on its tiny model: one right caption, one
    wrong, one empty, with references where the metric reads them."""
    from capreward.testing import colour_image, fleur_task_image

    if name in ("emscore", "clip_s", "pac_s", "hallucination"):
        red = colour_image("red")
        return ({"model": request.getfixturevalue("clip")}, ["a red image.", "a blue image.", ""],
                {"image": [red] * 3, "references": [["a red image."], ["a red image."], ["a red image."]]})
    red = fleur_task_image("red", random.Random(0))
    if name == "fleur":
        return {"model": request.getfixturevalue("tiny_judge")}, ["a red car", "a yellow box", ""], {"image": [red] * 3}
    if name in ("visce2", "gveval"):
        from capreward.testing.tiny_vlm_judges import probe_image

        # the tiny VLM judge's score depends on the image's colour only (capreward.testing.tiny_vlm_judges)
        images = [probe_image(name, "blue"), probe_image(name, "green"), probe_image(name, "blue")]
        return ({"backend": request.getfixturevalue("vlm_judge")}, ["a blue kite", "a green ball", ""],
                {"image": images})
    if name == "claims":
        from capreward.testing.tiny_claim_judge import claim_image

        image = claim_image("red", "green", random.Random(0))
        return ({"backend": request.getfixturevalue("claim_backend")},
                ["the background is red.", "the background is blue.", ""],
                {"image": [image] * 3, "references": [["the background is red."]] * 3})
    if name == "qa_utility":
        from capreward.testing.tiny_qa_judge import colour_questions

        qs = colour_questions("red")
        return {"backend": request.getfixturevalue("qa")}, ["a red ball.", "a photo", ""], {"questions": [qs] * 3}
    raise AssertionError(f"no tiny case for {name}: add one")


def run(reward, captions, columns) -> tuple[list, dict, dict]:
    logged, extra = {}, {}
    values = reward(None, captions, log_metric=logged.__setitem__, log_extra=extra.__setitem__, **columns)
    return values, logged, {k: [str(r) if r is not None else None for r in v] for k, v in extra.items()}


def same(a, b) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_every_metric_with_a_reward_class_is_the_generic_reward_fixed_to_it():
    for spec in registry.specs():
        if spec.reward is not None:
            cls = spec.load_reward()
            assert issubclass(cls, MetricReward) and registry.get(cls.metric) is spec
            assert spec.reward_hooks is not None
        if spec.torchmetric is not None:
            from capreward.torchmetrics import RegisteredMetric

            cls = spec.load_torchmetric()
            assert issubclass(cls, RegisteredMetric) and registry.get(cls.metric) is spec


@pytest.mark.parametrize("name", REWARDS)
def test_the_generic_reward_gives_what_the_per_metric_class_gives(name, request):
    options, captions, columns = reward_case(name, request)
    spec = registry.get(name)
    generic = MetricReward(name, **options)
    assert generic.__name__ == name and type(generic) is MetricReward
    values, logged, extra = run(generic, captions, columns)
    assert values[2] is None  # the empty caption: unscored, its reason logged
    assert values[0] is not None and values[1] is not None
    if name not in ("visce2", "gveval"):  # each tiny model tells the right caption from the wrong one
        assert values[0] > values[1]
    assert f"rewards/{name}/unscored_frac" in logged and extra[f"{name}/error"][2] is not None
    if spec.reward is not None:
        alias = spec.load_reward()(**options)
        assert alias.__name__ == name and alias.value_range() == generic.value_range()
        assert alias.metric_names() == generic.metric_names()
        assert same(run(alias, captions, columns), (values, logged, extra))
    assert reward_for(name, **options).metric_names() == generic.metric_names()
    # pickled (TRL's AsyncGRPOTrainer sends rewards to a spawned process): the scorer is rebuilt there;
    # the tiny judges are in-memory models, which do not pickle (a reward holding one did not before either)
    if name in ("emscore", "clip_s", "pac_s", "hallucination"):
        copy = pickle.loads(pickle.dumps(generic))
        assert type(copy) is MetricReward and copy.metric == name and copy._scorer is None
        assert same(run(copy, captions, columns), (values, logged, extra))
        if spec.reward is not None:
            copy = pickle.loads(pickle.dumps(spec.load_reward()(**options)))
            assert type(copy) is spec.load_reward() and same(run(copy, captions, columns), (values, logged, extra))


@pytest.mark.parametrize("name", REWARDS)
def test_a_misspelt_option_is_refused_at_construction_with_the_nearest_one(name):
    spec = registry.get(name)
    hooks = spec.load_reward_hooks()()
    params, _ = constructor_parameters(hooks.scorer_class(spec))
    option = params[0].name  # model / backend / emscore ...: nothing is built before the check
    classes = [MetricReward] + ([spec.load_reward()] if spec.reward is not None else [])
    for cls in classes:
        args = (name,) if cls is MetricReward else ()
        with pytest.raises(UnknownOption, match=f"unexpected keyword argument '{option}x' \\(did you mean '{option}'\\?\\)"):
            cls(*args, **{option + "x": None})
        with pytest.raises(TypeError):  # an UnknownOption is the TypeError Python raises for such a keyword
            cls(*args, image_colum="image")


@pytest.mark.parametrize("name", REWARDS)
def test_the_signature_lists_the_scorers_options_and_the_rewards_own(name):
    spec = registry.get(name)
    hooks = spec.load_reward_hooks()()
    params, open_kwargs = constructor_parameters(hooks.scorer_class(spec))
    shown = MetricReward.signature_of(name).parameters
    for p in params:
        assert p.name in shown and shown[p.name].default == p.default, p.name
        assert shown[p.name].kind is inspect.Parameter.KEYWORD_ONLY
    for p in inspect.signature(hooks.options).parameters.values():
        assert shown[p.name].default == p.default
    assert {"image_column", "references_column", "injection_guard", "scorer", "name"} <= set(shown)
    assert not open_kwargs and all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in shown.values())
    if spec.reward is not None:
        assert inspect.signature(spec.load_reward()) == MetricReward.signature_of(name)
    assert "metric" in inspect.signature(MetricReward).parameters


def test_the_per_metric_classes_keep_their_options_and_defaults(clip):
    from capreward.rewards import CLIPScoreReward, EMScoreReward, GVEvalReward, HallucinationPenalty, VisCE2Reward
    from capreward.rewards.claims import ClaimsReward
    from capreward.rewards.qa_utility import QAUtilityReward

    em = EMScoreReward(model=clip, idf=False, frames=4, field="coarse", harmonic_mean="released", visual_id_column="v")
    assert (em.field, em.harmonic_mean, em.scorer_kwargs) == ("coarse", "released", {"model": clip, "idf": False, "frames": 4})
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
def metric_case(name: str, request) -> tuple[tuple, dict, list[str], list]:
    from capreward.testing import colour_image, fleur_task_image

    if name in ("emscore", "clip_s", "pac_s"):
        red = colour_image("red")
        return (request.getfixturevalue("clip"),), {"visual": "image"}, ["a red image.", "a blue image.", ""], [red] * 3
    if name == "hallucination":  # its scorer's first option is an EMScore: the CLIP comes as model=
        red = colour_image("red")
        return (), {"model": request.getfixturevalue("clip"), "visual": "image"}, ["a red image.", "a blue car.", ""], [red] * 3
    if name == "fleur":
        red = fleur_task_image("red", random.Random(0))
        return (request.getfixturevalue("tiny_judge"),), {}, ["a red car", "a yellow box", ""], [red] * 3
    from capreward.testing.tiny_vlm_judges import probe_image

    images = [probe_image(name, "blue"), probe_image(name, "green"), probe_image(name, "blue")]
    return (request.getfixturevalue("vlm_judge"),), {}, ["a blue kite", "a green ball", ""], images


@pytest.mark.parametrize("name", METRICS)
def test_the_generic_metric_gives_what_the_per_metric_class_gives(name, request):
    from capreward.torchmetrics import RegisteredMetric, metric_for

    args, options, captions, visuals = metric_case(name, request)
    spec = registry.get(name)
    generic = RegisteredMetric(name, *args, per_sample=True, sub_scores=True, **options)
    assert generic.name == name
    assert (generic.plot_lower_bound, generic.plot_upper_bound) == tuple(float(v) for v in spec.value_range)
    generic.update(captions, visuals)
    out = generic.compute()
    assert float(out["per_sample/empty"][2]) == 1.0
    if spec.torchmetric is not None:
        alias = spec.load_torchmetric()(*args, per_sample=True, sub_scores=True, **options)
        assert alias.name == name and alias.columns == generic.columns
        alias.update(captions, visuals)
        assert same({k: v.tolist() for k, v in alias.compute().items()}, {k: v.tolist() for k, v in out.items()})
    else:  # PAC-S: the CLIP-S Metric on a PAC-S scorer is named pac_s
        from capreward.torchmetrics import CLIPScoreMetric

        alias = CLIPScoreMetric(scorer=generic.scorer, per_sample=True, sub_scores=True, **options)
        assert alias.name == name
    assert metric_for(name, *args, **options).columns == generic.columns
    copy = generic.clone()
    assert copy.scorer is generic.scorer and copy.columns == generic.columns
    assert same({k: v.tolist() for k, v in copy.compute().items()}, {k: v.tolist() for k, v in out.items()})
    assert len(generic.state_dict()) == 0


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
    classes = [RegisteredMetric] + ([spec.load_torchmetric()] if spec.torchmetric is not None else [])
    for cls in classes:
        args = (name,) if cls is RegisteredMetric else ()
        if open_kwargs:  # the scorer forwards **options (the hallucination penalty's to its EMScore): it refuses them
            with pytest.raises(TypeError, match=f"'{option}x'"):
                cls(*args, **{option + "x": 1})
            continue
        with pytest.raises(UnknownOption, match=f"'{option}x' \\(did you mean '{option}'\\?\\)"):
            cls(*args, **{option + "x": 1})
        if spec.torchmetric is not None:
            assert inspect.signature(spec.load_torchmetric()) == RegisteredMetric.signature_of(name)
