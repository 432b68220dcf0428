"""The tiny trained judge each built-in judge metric runs on offline (the GRPO recipe's ``--tiny``).

A metric's spec names no test model (it holds facts about the metric only); the tiny models are this
package's, so the table of which one fits which metric lives here.
"""

from __future__ import annotations

from typing import Any, Callable


def _fleur() -> Any:
    from .tiny_llava import tiny_fleur_judge

    return tiny_fleur_judge()


def _vlm() -> Any:
    from .tiny_vlm_judges import tiny_vlm_judge

    return tiny_vlm_judge()


def _claims() -> Any:
    from .tiny_claim_judge import tiny_claim_judge

    return tiny_claim_judge()


#: metric -> the builder of its tiny trained chat judge (``(model, processor)``).
TINY_JUDGES: dict[str, Callable[[], Any]] = {"fleur": _fleur, "visce2": _vlm, "gveval": _vlm, "claims": _claims}


def tiny_judge_for(metric: str) -> Callable[[], Any] | None:
    """The builder of ``metric``'s tiny trained chat judge, or None when it has none.

    Args:
        metric: a metric's canonical name.

    Returns:
        A callable giving ``(model, processor)``, or None.

    Examples:
        >>> from capreward.testing.tiny_judges import tiny_judge_for
        >>> tiny_judge_for("fleur") is not None, tiny_judge_for("emscore")
        (True, None)
    """
    return TINY_JUDGES.get(metric)


__all__ = ["TINY_JUDGES", "tiny_judge_for"]
