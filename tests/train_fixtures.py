"""Trains the suite's trained fixtures ahead of the tests that need them: ``python tests/train_fixtures.py
GROUP`` (``a`` or ``b``, two halves of similar size, or ``all``). conftest.py starts both halves in the
background when a run collects most of the suite, so that a pytest-xdist worker reaching a test whose
fixture is still training waits for a trainer that is using the CPU, not for the other worker. Each
fixture is the cached, locked one the tests ask for (``$CAPREWARD_CACHE``): training it here or in a test
is the same; one that fails here is trained again (and fails visibly) in its test."""

from __future__ import annotations

import re
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "experiments")]


def vlm() -> None:
    from capreward.testing.tiny_vlm_judges import tiny_vlm_judge_dir

    tiny_vlm_judge_dir()


def fleur() -> None:
    from capreward.testing.tiny_llava import tiny_judge_dir

    tiny_judge_dir()


def claims() -> None:
    from capreward.testing.tiny_claim_judge import tiny_claim_judge_dir

    tiny_claim_judge_dir()


def qa() -> None:
    from capreward.testing.tiny_qa_judge import tiny_qa_judge_dir

    tiny_qa_judge_dir()


def colours() -> None:
    from capreward.testing.trained_clip import trained_clip_path

    trained_clip_path()


def grader() -> None:
    from grader_judge import GRADER_RECIPE

    from capreward.testing.tiny_llava import tiny_judge_dir

    tiny_judge_dir(GRADER_RECIPE)


def susceptible() -> None:
    from susceptible_judge import susceptible_judge_dir

    susceptible_judge_dir()


def scenes_a() -> None:
    from scenes_world.clips import MODEL_A
    from scenes_world.evaluation import shared_clip_path

    shared_clip_path(MODEL_A)


def scenes_b() -> None:
    from scenes_world.clips import MODEL_B
    from scenes_world.evaluation import shared_clip_path

    shared_clip_path(MODEL_B)


#: two halves of about equal CPU (minutes on an idle core: vlm 10, claims 4.5, scenes 3 each, fleur 1.3), the
#: longest first, each in the order of :data:`TIERS`
GROUPS = {"a": [vlm, grader], "b": [fleur, colours, claims, qa, susceptible, scenes_a, scenes_b]}

#: The suite runs its test files in the order their trained fixtures become ready (conftest.py sorts them by
#: :func:`file_tier`): first the files that need none, then those whose source names a fixture of tier 1
#: (trained first), 2, 3 (the VLM judge, the grader, the susceptible judge, the scenes CLIPs: trained last).
#: So a pytest-xdist worker runs tests while the trainers train, rather than wait on a lock.
TIERS = (
    (3, re.compile(r"vlm_judge|tiny_vlm|grader_judge|susceptible|red_team|scenes_world|shared_clip_path|tiny_judges"
                   r"|judges_by_name")),
    (2, re.compile(r"claim_judge|qa_judge|qa_backend|tiny_claim")),
    (1, re.compile(r"fleur|trained_clip|TrainedClip|tiny_judge")),
)
#: files that run the docs' or docstrings' examples, which use every fixture
LAST_FILES = {"test_public_api.py", "test_docs_code.py", "test_docs_scripts.py", "test_docs_examples.py"}


def file_tier(path: Path) -> int:
    """0 for a test file that needs no trained fixture, else the tier of the last-trained one it names."""
    if path.name in LAST_FILES:
        return 3
    text = path.read_text(encoding="utf-8", errors="replace")
    return next((tier for tier, pattern in TIERS if pattern.search(text)), 0)


def main(argv: list[str]) -> int:
    import torch

    torch.set_num_threads(1)
    names = GROUPS["a"] + GROUPS["b"] if argv[1:] == ["all"] else GROUPS[argv[1]]
    failed = 0
    for train in names:
        start = time.perf_counter()
        try:
            train()
            print(f"{train.__name__}: ready in {time.perf_counter() - start:.0f} s", flush=True)
        except Exception:
            failed += 1
            print(f"{train.__name__}: failed (its tests will train it again)\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
