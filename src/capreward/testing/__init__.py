"""Offline, deterministic fixtures (tiny models) for tests and demos of code that uses capreward.

The red-team suite lives here too: :mod:`~capreward.testing.susceptible_judge` (a tiny judge that falls
for prompt injection) and :mod:`~capreward.testing.red_team` (hostile captions x every judge scorer and
reward).

Every builder the "Try it without weights" table of docs/quickstart.md names is importable from here
(``from capreward.testing import tiny_vlm_judge``); tests/test_docs_code.py checks the table against this
package.
"""

from .tiny_clip import (
    TINY_CLIP_CONFIG,
    build_tiny_clip,
    openai_state_dict,
    save_tiny_clip_openai,
    tiny_clip_factory,
)
from .red_team import ATTACKS, Attack, Verdict, run_red_team
from .susceptible_judge import SUSCEPTIBLE_RECIPE, susceptible_judge, susceptible_judge_dir
from .tiny_llava import (
    FLEUR_ANSWERS,
    FLEUR_COLOURS,
    FLEUR_GENERATORS,
    FLEUR_PROBES,
    FLEUR_RECIPE,
    JudgeExample,
    JudgeRecipe,
    SAMPLERS,
    TinyLlavaSpec,
    build_tiny_llava,
    build_tiny_processor,
    build_tiny_tokenizer,
    cache_root,
    fleur_explain_example,
    fleur_score_example,
    fleur_task_answer,
    fleur_task_caption,
    fleur_task_image,
    load_tiny_judge,
    mixture,
    ref_fleur_score_example,
    sample_fleur_example,
    tiny_fleur_judge,
    tiny_judge_dir,
    train_tiny_judge,
)
from .tiny_vlm_judges import tiny_vlm_judge, tiny_vlm_judge_dir
from .colour_task import tiny_caption_policy
from .trained_clip import TrainedClipFactory, colour_caption, colour_image, trained_clip_path

#: The builders (tiny offline models, fixture images) and the red-team run, documented in the API reference
#: (docs/api/testing.md). The training recipes, samplers and constants behind them (``JudgeRecipe``,
#: ``FLEUR_RECIPE``, ``openai_state_dict``...) still import from here.
__all__ = ["ATTACKS", "build_tiny_clip", "build_tiny_llava", "colour_caption", "colour_image", "run_red_team",
           "save_tiny_clip_openai", "susceptible_judge", "susceptible_judge_dir", "tiny_caption_policy", "tiny_clip_factory",
           "tiny_fleur_judge", "tiny_judge_dir", "tiny_vlm_judge", "tiny_vlm_judge_dir", "trained_clip_path"]
