"""capreward's own calls into transformers, TRL, torch and torchmetrics raise no deprecation warning.

Every framework announces a renamed argument or a call pattern on its way out with a ``FutureWarning`` /
``DeprecationWarning`` (``warnings.warn``) or, in transformers, a logged line ("... is deprecated ...",
``logger.warning_once``). A user sees both on every run, and the call stops working in a later release
(transformers 5.24 renamed ``past_key_values`` to ``cache``, to be removed in 5.40). These tests run the
paths that call the frameworks (the local judges' prefill / cached decode / teacher-forced pass through
FLEUR, VisCE² and G-VEval, the CLIP scorers, a torchmetrics metric, TRL's GRPOTrainer with a capreward
reward) with every warning recorded, and fail on any deprecation that is not listed in
:data:`FRAMEWORK_INTERNAL` (warnings raised inside a framework by its own code, whatever we pass).

Run by ``scripts/version_matrix.sh`` at both ends (integration): at the newest end it is the check that
the suite keeps up with the frameworks' renames.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import warnings

import pytest
import torch

from fixtures_llava import colour_images, fleur, tiny_judge, tiny_judge_path, vlm_judge  # noqa: F401

pytestmark = pytest.mark.integration

DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

#: (module regex of the warning's origin, message regex): deprecations a framework raises from inside
#: its own code, not caused by capreward's arguments. Add an entry only with a comment naming the
#: framework call that raises it.
FRAMEWORK_INTERNAL: tuple[tuple[str, str], ...] = (
    # TRL 1.16's GRPOTrainer reads `model.is_gradient_checkpointing` in its own
    # trl.models.utils.disable_gradient_checkpointing (the no-grad log-prob pass); transformers 5.24
    # renamed it is_activation_checkpointing. Whatever config capreward passes, TRL makes this call.
    (r"transformers[/\\]modeling_utils\.py$", r"^`is_gradient_checkpointing` is deprecated"),
)

_DEPRECATED_LOG = re.compile(r"deprecat", re.IGNORECASE)


def _internal(filename: str, message: str) -> bool:
    return any(re.search(where, filename) and re.search(what, message) for where, what in FRAMEWORK_INTERNAL)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if _DEPRECATED_LOG.search(text):
            self.lines.append(f"[{record.name}] {text}")


@contextlib.contextmanager
def no_deprecations():
    """Fail the test if the block raises a deprecation warning or logs a transformers "deprecated" line.

    transformers' ``warning_once`` remembers what it said for the whole process: its memory is cleared
    first, so a line said by an earlier test is said (and seen) here again."""
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    handler = _Records()
    loggers = [logging.getLogger(name) for name in ("transformers", "trl", "torchmetrics", "torch")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        hf_logging.set_verbosity(verbosity)
    found = [
        f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, DEPRECATIONS) and not _internal(w.filename, str(w.message))
    ]
    found += handler.lines
    assert not found, "deprecated calls:\n" + "\n".join(found)


def test_the_judges_cache_keyword_is_the_one_the_installed_forward_declares(tiny_judge):
    """The decision is read from the installed model's forward, whatever the transformers version."""
    import inspect

    from capreward.judges import LocalJudge
    from capreward.judges.cache import cache_keyword

    params = inspect.signature(tiny_judge[0].forward).parameters
    keyword = cache_keyword(tiny_judge[0])
    assert keyword in params
    assert keyword == ("cache" if "cache" in params else "past_key_values")
    assert LocalJudge(tiny_judge)._cache_keyword == keyword


def test_fleur_score_explain_and_gradients_warn_nothing(fleur, colour_images):
    captions = ["a red ball", "a green box", "a photo of a kite", "many blue cars"]
    images = [colour_images[c] for c in ("red", "green", "blue", "blue")]
    with no_deprecations():
        result = fleur.score(captions, images)
        fleur.explain(captions[:2], images[:2], scores=result.score[:2], max_new_tokens=4)
        with torch.enable_grad():
            grad = fleur.score(captions[:2], images[:2], requires_grad=True)
            grad.score.sum().backward()
    assert torch.isfinite(result.score[:2]).all()


def test_visce2_and_gveval_on_the_local_judge_warn_nothing(vlm_judge):
    from capreward import GVEval, VisCE2
    from capreward.testing.tiny_vlm_judges import probe_image

    images = [probe_image("visce2", "green"), probe_image("visce2", "blue")]
    with no_deprecations():
        visce2 = VisCE2(vlm_judge, expected=True).score(["a green ball", "a blue kite"], images)
        gveval = GVEval(vlm_judge).score(["a green ball", "a blue kite"], images=images)
    assert visce2.error[0] is None and gveval.score.shape == (2,)


def test_clip_scorers_and_a_torchmetrics_metric_warn_nothing(tiny_backbone):
    from capreward import CLIPScore, EMScore
    from capreward.torchmetrics import CLIPScoreMetric
    from capreward.testing import FLEUR_COLOURS, fleur_task_image

    from conftest import random_video

    images = [fleur_task_image(c, random.Random(c)) for c in FLEUR_COLOURS]
    captions = [f"a {c} square" for c in FLEUR_COLOURS]
    refs = [[f"{c} things"] for c in FLEUR_COLOURS]
    with no_deprecations():
        CLIPScore(backbone=tiny_backbone).score(captions, images=images, references=refs)
        EMScore(backbone=tiny_backbone, frames=4).score(captions[:2], videos=[random_video(s, frames=4) for s in range(2)])
        metric = CLIPScoreMetric(backbone=tiny_backbone)
        metric.update(captions[:2], images[:2])
        metric.update(captions[2:], images[2:])
        value = metric.compute()
    assert torch.isfinite(torch.as_tensor(value)).all()


def test_a_trl_grpo_step_with_the_recipes_config_and_a_capreward_reward_warns_nothing(tiny_clip_path, tmp_path):
    """TRL's GRPOTrainer built from the GRPO recipe's own ``GRPOConfig`` and stepped once with a capreward
    reward."""
    import numpy as np
    from datasets import Dataset, Features, Image as ImageFeature, List, Value
    from PIL import Image
    from trl import GRPOTrainer

    from capreward.recipes.grpo_captioner import grpo_config, parse_args
    from capreward.rewards import CLIPScoreReward
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    rng = np.random.default_rng(0)
    rows = [
        {"prompt": [{"role": "user", "content": "Describe the image"}],
         "image": Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))}
        for _ in range(2)
    ]
    features = Features({"prompt": List({"role": Value("string"), "content": Value("string")}), "image": ImageFeature()})
    dataset = Dataset.from_list(rows, features=features)
    model, processor = build_tiny_llava(TinyLlavaSpec(words=("a", "the", "image", "Describe"), seed=0))
    args = parse_args(["--tiny", "--out", str(tmp_path), "--steps", "1", "--batch-size", "2", "--num-generations", "2",
                       "--max-completion-length", "4", "--quiet"])
    with no_deprecations():
        config = grpo_config(args, [1.0])
        trainer = GRPOTrainer(model=model.train(), processing_class=processor, args=config,
                              reward_funcs=[CLIPScoreReward(model=str(tiny_clip_path))], train_dataset=dataset)
        trainer.train()
    assert any("reward" in h for h in trainer.state.log_history)
