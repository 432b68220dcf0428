"""Session fixtures for the LLaVA-judge tests: the trained tiny FLEUR judge and scorers on it.

Import the fixtures into a test module (``from fixtures_llava import ...``). The judge is trained once
(about a minute or two on 2 CPU cores) and cached under ``$CAPREWARD_CACHE`` (default
``~/.cache/capreward``); later runs load it in about a second.
"""

from __future__ import annotations

import random

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The toy judge's ops are tiny: extra threads only add synchronisation, and on a loaded 2-core
    machine they make each op many times slower. Restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_judge_path():
    from capreward.testing import FLEUR_RECIPE, tiny_judge_dir

    return tiny_judge_dir(FLEUR_RECIPE)


@pytest.fixture(scope="session")
def tiny_judge(tiny_judge_path):
    """``(model, processor)`` of the trained tiny FLEUR judge, float32 on CPU."""
    from capreward.judges import load_llava

    return load_llava(tiny_judge_path, dtype=torch.float32, device=torch.device("cpu"), local_files_only=True)


@pytest.fixture(scope="session")
def fleur(tiny_judge):
    from capreward import FLEUR

    return FLEUR(tiny_judge)


@pytest.fixture(scope="session")
def colour_images():
    """One fixed synthetic image per colour of the toy task (not square: padding matters)."""
    from capreward.testing import FLEUR_COLOURS, fleur_task_image

    return {c: fleur_task_image(c, random.Random(f"fixture-{c}")) for c in FLEUR_COLOURS}


@pytest.fixture(scope="session")
def vlm_judge():
    """:class:`LocalChatJudge` over the trained tiny VLM judge (VisCE² and G-VEval answer formats),
    trained once and cached on disk like the FLEUR judge."""
    from capreward.judges import LocalChatJudge
    from capreward.testing.tiny_vlm_judges import tiny_vlm_judge

    return LocalChatJudge(tiny_vlm_judge(), batch_size=8)
