"""Trains the suite's trained fixtures ahead of the tests that need them: ``python tests/train_fixtures.py
GROUP`` (``a`` or ``b``, two halves of similar size, or ``all``; ``store``: see below). conftest.py starts both halves in the
background when a run collects most of the suite, so that a pytest-xdist worker reaching a test whose
fixture is still training waits for a trainer that is using the CPU, not for the other worker. Each
fixture is the cached, locked one the tests ask for (``$CAPREWARD_CACHE``): training it here or in a test
is the same; one that fails here is trained again (and fails visibly) in its test.

The trained judges (six directories of about a megabyte) are also kept in the repository, under
``tests/data/trained``: conftest.py copies them into an empty cache before a run (:func:`seed_cache`), so a
fresh machine (CI) reads them instead of training them (about half an hour of CPU on a busy 2-core
machine). They are used only where their key is the one the current code computes (the recipe, its
sources, the torch version): a change to a judge's training trains it again, and
tests/test_stored_fixtures.py fails until ``python tests/train_fixtures.py store`` has stored the new one.
The CLIPs (6.5 MB each) are not stored: they train in a minute or a few."""

from __future__ import annotations

import re
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "experiments")]


def vlm() -> Path:
    from capreward.testing.tiny_vlm_judges import tiny_vlm_judge_dir

    return tiny_vlm_judge_dir()


def fleur() -> Path:
    from capreward.testing.tiny_llava import tiny_judge_dir

    return tiny_judge_dir()


def claims() -> Path:
    from capreward.testing.tiny_claim_judge import tiny_claim_judge_dir

    return tiny_claim_judge_dir()


def qa() -> Path:
    from capreward.testing.tiny_qa_judge import tiny_qa_judge_dir

    return tiny_qa_judge_dir()


def colours() -> None:
    from capreward.testing.trained_clip import trained_clip_path

    trained_clip_path()


def grader() -> Path:
    from grader_judge import GRADER_RECIPE

    from capreward.testing.tiny_llava import tiny_judge_dir

    return tiny_judge_dir(GRADER_RECIPE)


def susceptible() -> Path:
    from susceptible_judge import susceptible_judge_dir

    return susceptible_judge_dir()


def scenes_a() -> None:
    from scenes_world.clips import MODEL_A
    from scenes_world.evaluation import shared_clip_path

    shared_clip_path(MODEL_A)


def scenes_b() -> None:
    from scenes_world.clips import MODEL_B
    from scenes_world.evaluation import shared_clip_path

    shared_clip_path(MODEL_B)


#: two halves of about equal CPU when every fixture trains (minutes on an idle core: vlm 10, claims 4.5, scenes
#: 3 each, fleur 1.3); with the judges copied from the repository (:func:`seed_cache`) only the CLIPs train:
#: colours (1) and scenes-b (3) in one, scenes-a (3) in the other
GROUPS = {"a": [colours, scenes_b, vlm, grader, fleur], "b": [scenes_a, claims, qa, susceptible]}

#: The suite runs its test files in the order their trained fixtures become ready (conftest.py sorts them by
#: :func:`run_order`): first the files that need none (or only judges already in the cache), then those whose
#: source names a fixture of tier 1 (trained first), 2, 3 (trained last); within a tier, the files known to
#: take minutes first (:data:`LONG_FILES`), so that neither worker is left with one long file at the end.
#: So a pytest-xdist worker runs tests while the trainers train, rather than wait on a lock. Each entry:
#: (tier, pattern, whether it names judges, which count only while a stored judge is missing from the cache).
TIERS = (
    (3, re.compile(r"scenes_world|shared_clip_path"), False),
    (3, re.compile(r"vlm_judge|tiny_vlm|grader_judge|susceptible|red_team|tiny_judges|judges_by_name"), True),
    (2, re.compile(r"claim_judge|qa_judge|qa_backend|tiny_claim"), True),
    (1, re.compile(r"trained_clip|TrainedClip"), False),
    (1, re.compile(r"fleur|tiny_judge"), True),
)
#: files that run the docs' or docstrings' examples, which use the judges and the colour CLIP
DOCS_FILES = {"test_public_api.py", "test_docs_code.py", "test_docs_scripts.py", "test_docs_examples.py"}
#: the files that took minutes in a full run (measured: a cold run of 8bb7cd4's suite), longest first
LONG_FILES = ("test_bad_inputs.py", "test_docs_scripts.py", "test_red_team.py", "test_gpu_all.py", "test_install.py",
              "test_public_api.py", "test_exact_remote_scores.py", "test_cli_score.py", "test_cli_usage.py",
              "test_vlm_judges_remote.py", "test_jobs_resume.py", "test_lightning_callback.py", "test_grpo_recipe.py",
              "test_goodhart.py", "test_packaging.py", "test_docs_code.py", "test_scst.py", "test_judge_families.py")


def judges_ready(root: Path | None = None) -> bool:
    """Whether every judge the repository keeps is in the fixture cache (copied or trained)."""
    return bool(stored_names()) and not missing_judges(root)


def file_tier(path: Path, judges: bool = False) -> int:
    """0 for a test file that needs no fixture still to train, else the tier of the last-trained one it
    names; ``judges``: the judges are in the cache already."""
    if path.name in DOCS_FILES:
        return 1 if judges else 3
    text = path.read_text(encoding="utf-8", errors="replace")
    return next((tier for tier, pattern, names_judges in TIERS
                 if not (judges and names_judges) and pattern.search(text)), 0)


def run_order(path: Path, judges: bool = False) -> tuple[int, int]:
    """The sort key of a test file: its tier (:func:`file_tier`), then long files first."""
    long = LONG_FILES.index(path.name) if path.name in LONG_FILES else len(LONG_FILES)
    return file_tier(path, judges), long


#: where the repository keeps the trained judges, in the cache's layout (``tiny_llava/<name>-<key>``, ...)
STORE = HERE / "data" / "trained"
#: the fixtures kept there
STORED = (fleur, vlm, claims, qa, grader, susceptible)


def judge_names() -> list[str]:
    """The cache paths (``tiny_llava/<name>-<key>``, ``tiny_text/qa-<key>``) of the judges in :data:`STORED`,
    as the current code and torch version key them (nothing is trained)."""
    from grader_judge import GRADER_RECIPE
    from susceptible_judge import SUSCEPTIBLE_RECIPE

    from capreward.testing.tiny_claim_judge import CLAIM_RECIPE
    from capreward.testing.tiny_llava import FLEUR_RECIPE
    from capreward.testing.tiny_qa_judge import qa_judge_name
    from capreward.testing.tiny_vlm_judges import VLM_RECIPE

    recipes = (FLEUR_RECIPE, VLM_RECIPE, CLAIM_RECIPE, GRADER_RECIPE, SUSCEPTIBLE_RECIPE)
    return [f"tiny_llava/{r.name}-{r.key()}" for r in recipes] + [qa_judge_name()]


def stored_names(store: Path = STORE) -> list[str]:
    """The cache paths of the judges the repository keeps."""
    return sorted(f"{kind.name}/{d.name}" for kind in store.iterdir() if kind.is_dir()
                  for d in kind.iterdir() if (d / "config.json").exists()) if store.is_dir() else []


def tests_cache_root() -> Path:
    """:func:`capreward.testing.cache.cache_root`, without importing ``capreward.testing`` (seconds of torch
    and transformers imports) where nothing is missing (tests/test_stored_fixtures.py checks they agree)."""
    import os

    return Path(os.environ.get("CAPREWARD_CACHE") or Path.home() / ".cache" / "capreward")


def missing_judges(root: Path | None = None, store: Path = STORE) -> list[str]:
    """The cache paths of the judges the repository keeps that the fixture cache ``root`` (None: the cache
    the tests use) lacks."""
    root = root if root is not None else tests_cache_root()
    return [name for name in stored_names(store) if not (root / name / "config.json").exists()]


def seed_cache(root: Path | None = None, store: Path = STORE) -> list[str]:
    """Copy every judge the repository keeps into the fixture cache ``root`` (None: the cache the tests
    use) where it is missing, under the cache's lock and by an atomic rename, as training would put it.

    Returns:
        The cache paths copied."""
    root = root if root is not None else tests_cache_root()
    missing = missing_judges(root, store)
    if not missing:
        return []
    import shutil
    import tempfile

    from capreward.testing.cache import install_directory, locked

    copied = []
    for name in missing:
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with locked(target.parent / f".{target.name}.lock", what=f"copying the stored {target.name}"):
            if (target / "config.json").exists():
                continue
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            try:
                tmp.rmdir()
                shutil.copytree(store / name, tmp)
                install_directory(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            copied.append(name)
    return copied


def store(store_dir: Path = STORE) -> list[str]:
    """Train (or find in the cache) every judge of :data:`STORED` and keep exactly those in ``store_dir``;
    returns their cache paths."""
    import shutil

    from capreward.testing.cache import USED_MARKER

    kept = []
    for train in STORED:
        directory = train()
        name = f"{directory.parent.name}/{directory.name}"
        if not (store_dir / name / "config.json").exists():
            shutil.copytree(directory, store_dir / name, ignore=shutil.ignore_patterns(USED_MARKER))
        kept.append(name)
    for old in set(stored_names(store_dir)) - set(kept):
        shutil.rmtree(store_dir / old)
    import torch

    (store_dir / "torch_version.txt").write_text(f"{torch.__version__}\n")  # the version the judges' keys hold
    return kept


def main(argv: list[str]) -> int:
    import torch

    torch.set_num_threads(1)
    if argv[1:] == ["store"]:
        for name in store():
            print(f"stored {STORE / name}")
        return 0
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
