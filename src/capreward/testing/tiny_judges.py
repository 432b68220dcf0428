"""The tiny trained judge each built-in judge metric runs on offline (the GRPO recipe's ``--tiny``): a
metric's spec names no test model, so the table lives with the tiny models."""

from __future__ import annotations

import importlib
from typing import Any
from collections.abc import Callable

#: metric -> ``"module:builder"`` of its tiny trained chat judge (``(model, processor)``).
TINY_JUDGES = {"fleur": "tiny_llava:tiny_fleur_judge", "visce2": "tiny_vlm_judges:tiny_vlm_judge",
               "gveval": "tiny_vlm_judges:tiny_vlm_judge", "claims": "tiny_claim_judge:tiny_claim_judge"}


def tiny_judge_for(metric: str) -> Callable[[], Any] | None:
    """The builder of ``metric``'s tiny trained chat judge (imported now), or None when it has none.

    Args:
        metric: a metric's canonical name.

    Returns:
        A callable giving ``(model, processor)``, or None.
    """
    if metric not in TINY_JUDGES:
        return None
    module, _, name = TINY_JUDGES[metric].partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)
