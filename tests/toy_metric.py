"""A new metric added the way the "Adding a metric" guide (docs/adding-a-metric.md) says: this one file
holds its spec and its scorer (its math), and nothing else in capreward names it (tests/test_new_metric.py
shows every entry point reaching it by name; tests/test_metric_plugin.py installs it as a package's entry
point). It imports capreward's public names only.

``word_overlap``: the share of the caption's words found in its references (with references), else
the share of its words that are longer than two letters; sub-scores ``words`` (the caption's word count)
and, with references, ``overlap`` (the same share, kept as a sub-score). Images only (a video row gets the
spec's refusal); an image that cannot be opened is the row's error.

Its reward, its torchmetrics Metric, its ``capreward score`` rows and its ``capreward explain`` rows are
the generic ones (:class:`~capreward.rewards.MetricReward`, :class:`~capreward.torchmetrics.RegisteredMetric`,
the job runner), which read the :class:`capreward.Scores` its scorer returns: no reward, Metric, job or
explainer code here.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from capreward import Scores
from capreward.registry import JobFlag, MetricSpec, Option, register

NAME = "word_overlap"


def words(text: str) -> list[str]:
    return [w.strip(".,;:!?").lower() for w in text.split() if w.strip(".,;:!?")]


def overlap(caption: str, references: Sequence[str]) -> float:
    """The share of ``caption``'s words found in any of ``references`` (0 for a caption without words)."""
    ws = words(caption)
    pool = {w for r in references for w in words(r)}
    return sum(w in pool for w in ws) / len(ws) if ws else 0.0


def long_share(caption: str, min_letters: int) -> float:
    ws = words(caption)
    return sum(len(w) >= min_letters for w in ws) / len(ws) if ws else 0.0


class WordOverlap:
    """The scorer: ``scores(captions, images=, references=)`` -> :class:`capreward.Scores` with the
    sub-scores its spec declares (``words``; ``overlap`` with references)."""

    def __init__(self, min_letters: int = 3):
        self.min_letters = int(min_letters)

    def scores(self, captions: Sequence[str], *, images: Sequence[Any] | None = None,
               videos: Sequence[Any] | None = None, references: Sequence[Sequence[str]] | None = None,
               visual_ids: Sequence[str | None] | None = None) -> Scores:
        from capreward.media import MediaError, load_image

        if videos is not None:
            raise ValueError(f"{NAME} scores images only")
        errors: list[str | None] = []
        for k, image in enumerate(images or [None] * len(captions)):
            try:
                if image is not None:
                    load_image(image, k)  # a path, a PIL image or an array: decoded, so a broken file is an error
                errors.append(None)
            except MediaError as exc:  # the row's error
                errors.append(f"cannot open the image: {exc}")
        ov = None if references is None else [overlap(c, r) for c, r in zip(captions, references)]
        score = ov if ov is not None else [long_share(c, self.min_letters) for c in captions]
        score = [float("nan") if e else s for s, e in zip(score, errors)]
        subs: dict[str, list] = {"words": [len(words(c)) for c in captions]}
        if ov is not None:
            subs["overlap"] = ov
        return Scores(score=score, sub_scores=subs, errors=errors)

    def explanations(self, captions: Sequence[str], *, images: Sequence[Any] | None = None,
                     videos: Sequence[Any] | None = None, references: Sequence[Sequence[str]] | None = None) -> Scores:
        """:meth:`scores` with the words of each caption its references hold as the explanation."""
        out = self.scores(captions, images=images, videos=videos, references=references)
        pools = [{x for ref in refs for x in words(ref)} for refs in references] if references else [set()] * len(captions)
        found = [[w for w in words(c) if w in pool] for c, pool in zip(captions, pools)]
        out.extras["explanation"] = [f"found in the references: {', '.join(f) or 'none'}" for f in found]
        return out


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    return ("words",) + (("overlap",) if config.get("references") else ())


SPEC = register(MetricSpec(
    name=NAME,
    aliases=("word-overlap-toy",),
    title="Word overlap",
    summary="The share of the caption's words found in its references.",
    paper="(a test metric)",
    released_code=None,
    scorer=f"{__name__}:WordOverlap",
    sub_scores=sub_scores,
    value_range=(0.0, 1.0),
    visuals=("image",),
    references="optional",
    options=(Option("min_letters", 3, "without references, words of at least this many letters count"),),
    job_flags=(JobFlag("word_overlap_min_letters", ("--word-overlap-min-letters",),
                       "word_overlap: words of at least this many letters count (without references)",
                       option="min_letters", type="int", adapters=True),),
    sub_score_kinds={"words": "number"},
    explanation="The words of the caption that its references hold",
))
