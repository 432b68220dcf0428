"""One caption budget, applied at every door a caption comes through.

A caption is written by a policy that looks for the cheapest reward, and every reward, guard and judge
reads it in full: reading a 1 MB caption took 10-37 s, one claims-reward call on 2.3 MB took 209 s, and
nothing bounded what TRL or veRL pass. The budget bounds what one caption may cost before anything
reads it:

- ``max_chars`` (default 16,384 characters, 16 Ki): about 2,500 English words. Human dense captions are
  far shorter (DOCCI's average is 136 words, Localized Narratives' 37, DCI's long summaries around 1,000
  words at most); a caption over the budget is not a description a reader reads.
- ``max_claims`` (default 256): the distinct claims the rule splitter finds in it
  (:func:`capreward.scorers.claims_split.split_claims`), what a claim judge is asked about. A dense caption
  of 1,000 words holds about 100; a caption of hundreds of one-word "sentences" is a way to buy judge
  calls, not a description. Counted only for captions longer than ``max_claims`` characters (a shorter
  one cannot hold more claims than characters), so ordinary captions cost nothing more.

Where it is applied, one call at each door: a reward's input collection
(:func:`capreward.rewards.inputs.collect_inputs`: the sample gets None and the reason, as an empty caption
does), a torchmetrics Metric's ``update`` (:class:`CaptionOverBudget` naming ``candidates[i]``), a
scoring job's row validation (the row's error for every metric), the reward server and the veRL adapter
(:func:`capreward.adapters.scoring.score_labelled`: the sample gets the fallback with the reason in
``errors``, never reaching the reward). The cost of the largest caption the budget accepts is measured
by ``benchmarks/bench_bounds.py``.

The budget is process-wide, like the media limits: :func:`set_caption_budget` changes it,
``with caption_budget(max_chars=...)`` changes it for a block, and the environment variables
``CAPREWARD_MAX_CAPTION_CHARS`` and ``CAPREWARD_MAX_CAPTION_CLAIMS`` set it at import (so a reward server,
a veRL worker or a Ray actor picks it up without code); ``capreward score`` and ``serve`` take
``--max-caption-chars`` and ``--max-caption-claims``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from collections.abc import Iterator, Sequence

from .errors import CaprewardError
from .media.limits import ProcessWide, check_positive_ints

DEFAULT_MAX_CHARS = 16 * 1024
DEFAULT_MAX_CLAIMS = 256

_FIELDS = (("max_chars", "CAPREWARD_MAX_CAPTION_CHARS"), ("max_claims", "CAPREWARD_MAX_CAPTION_CLAIMS"))


class CaptionOverBudget(CaprewardError, ValueError):
    """A caption over the caption budget, outside a reward (a Metric's ``update``); the message names the
    item, the budget and how to raise it.

    Examples:
        >>> from capreward.caption_budget import CaptionOverBudget, check_captions
        >>> try:
        ...     check_captions(["a red ball.", "a red ball. " * 2000], "candidates")
        ... except CaptionOverBudget as exc:
        ...     print(str(exc)[:59])
        candidates[1] has 24000 characters, over the caption budget
    """


@dataclass(frozen=True)
class CaptionBudget:
    """What one caption may be before anything reads it (a longer one is refused, never read).

    Args:
        max_chars: characters of the caption as given.
        max_claims: distinct claims the rule splitter finds in it.

    Raises:
        ValueError: a bound that is not a positive int.

    Examples:
        >>> from capreward.caption_budget import CaptionBudget
        >>> budget = CaptionBudget(max_chars=20)
        >>> budget.problem("a red ball.") is None
        True
        >>> budget.problem("a red ball on the green grass.")
        'has 30 characters, over the caption budget of 20 (CAPREWARD_MAX_CAPTION_CHARS, --max-caption-chars)'
    """

    max_chars: int = DEFAULT_MAX_CHARS
    max_claims: int = DEFAULT_MAX_CLAIMS

    def __post_init__(self) -> None:
        check_positive_ints(self, _FIELDS)

    def problem(self, caption: str) -> str | None:
        """Why ``caption`` is over the budget, or None.

        Args:
            caption: the caption as given (not a str: None, another check refuses it).

        Returns:
            ``"has N characters, over the caption budget of M (...)"``, ``"holds N claims, over ..."``,
            or None within the budget.
        """
        if not isinstance(caption, str):
            return None
        if len(caption) > self.max_chars:
            return (f"has {len(caption)} characters, over the caption budget of {self.max_chars} "
                    "(CAPREWARD_MAX_CAPTION_CHARS, --max-caption-chars)")
        if len(caption) > self.max_claims:
            from .scorers.claims_split import split_claims

            _, total = split_claims(caption, 1)
            if total > self.max_claims:
                return (f"holds {total} claims, over the caption budget of {self.max_claims} "
                        "(CAPREWARD_MAX_CAPTION_CLAIMS, --max-caption-claims)")
        return None


_budget: ProcessWide[CaptionBudget] = ProcessWide(CaptionBudget, _FIELDS)


def get_caption_budget() -> CaptionBudget:
    """The budget in force.

    Returns:
        The process-wide :class:`CaptionBudget` (from ``CAPREWARD_MAX_CAPTION_CHARS`` /
        ``CAPREWARD_MAX_CAPTION_CLAIMS``, or as :func:`set_caption_budget` left it).
    """
    return _budget.current


def set_caption_budget(max_chars: int | None = None, max_claims: int | None = None) -> CaptionBudget:
    """Change the process-wide budget.

    Args:
        max_chars: characters of one caption (None: unchanged).
        max_claims: claims of one caption (None: unchanged).

    Returns:
        The previous :class:`CaptionBudget`.

    Raises:
        ValueError: a bound that is not a positive int.
    """
    return _budget.set(max_chars=max_chars, max_claims=max_claims)


@contextlib.contextmanager
def caption_budget(max_chars: int | None = None, max_claims: int | None = None) -> Iterator[CaptionBudget]:
    """``with caption_budget(max_chars=...):`` the budget inside the block, restored after it.

    Args:
        max_chars: characters of one caption (None: unchanged).
        max_claims: claims of one caption (None: unchanged).

    Yields:
        The :class:`CaptionBudget` in force inside the block.
    """
    with _budget.within(max_chars=max_chars, max_claims=max_claims) as budget:
        yield budget


def caption_problem(caption: str) -> str | None:
    """Why ``caption`` is over the budget in force (:meth:`CaptionBudget.problem`), or None.

    Args:
        caption: the caption as given.

    Returns:
        The reason, or None.
    """
    return _budget.current.problem(caption)


def check_captions(captions: Sequence[str], what: str = "captions") -> None:
    """Raise :class:`CaptionOverBudget` naming ``what[i]`` for the first caption over the budget.

    Args:
        captions: the captions as given.
        what: how the error names the list (``"candidates"``).

    Raises:
        CaptionOverBudget: a caption is over the budget.
    """
    for i, caption in enumerate(captions):
        if (problem := caption_problem(caption)) is not None:
            raise CaptionOverBudget(f"{what}[{i}] {problem}")


#: Documented in the API reference (docs/api/caption_budget.md); ``caption_problem`` and ``check_captions``
#: are what the doors call.
__all__ = ["CaptionBudget", "CaptionOverBudget", "caption_budget", "get_caption_budget", "set_caption_budget"]
