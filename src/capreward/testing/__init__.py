"""Offline, deterministic fixtures (tiny models) for tests and demos of code that uses capreward.

The red-team suite (a tiny judge that falls for prompt injection, hostile captions x every judge scorer
and reward, the measurement of the judge-based injection check) is not shipped: it lives in the
repository's tests (``tests/red_team.py``, ``tests/susceptible_judge.py``, ``tests/grader_judge.py``,
``tests/injection_check_measure.py``; ``python tests/red_team.py`` runs it).

Every builder the "Try it without weights" table of docs/quickstart.md names is importable from here
(``from capreward.testing import tiny_vlm_judge``); tests/test_docs_code.py checks the table against this
package.
"""

from .cache import cache_root
from .tiny_clip import (
    TINY_CLIP_CONFIG,
    build_tiny_clip,
    openai_state_dict,
    save_tiny_clip_openai,
    tiny_clip_factory,
)
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

#: The builders (tiny offline models, fixture images), documented in the API reference
#: (docs/api/testing.md). The training recipes, samplers and constants behind them (``JudgeRecipe``,
#: ``FLEUR_RECIPE``, ``openai_state_dict``...) still import from here.
__all__ = ["build_tiny_clip", "build_tiny_llava", "colour_caption", "colour_image",
           "save_tiny_clip_openai", "tiny_caption_policy", "tiny_clip_factory",
           "tiny_fleur_judge", "tiny_judge_dir", "tiny_vlm_judge", "tiny_vlm_judge_dir", "trained_clip_path"]
