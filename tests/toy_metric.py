"""A new metric added the way the registry says one is added: this one file holds its spec and its scorer
(its math), and nothing else in capreward names it (tests/test_new_metric.py shows every entry point
reaching it by name).

``word_overlap``: the share of the caption's words found in its references (with references), else
the share of its words that are longer than two letters; sub-scores ``words`` (the caption's word count)
and, with references, ``overlap`` (the same share, kept as a sub-score). Images only (a video row gets the
spec's refusal); an image that cannot be opened is the row's error.

Its reward and its torchmetrics Metric are the generic ones
(:class:`~capreward.rewards.MetricReward`, :class:`~capreward.torchmetrics.RegisteredMetric`), which
read the scorer's ``score`` and its sub-scores as the spec names them: no reward or Metric code here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

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


@dataclass
class WordOverlapResult:
    score: list[float]
    words: list[int]
    overlap: list[float] | None
    error: list[str | None]


class WordOverlap:
    """The scorer: ``score(candidates, images=, references=)`` -> :class:`WordOverlapResult`."""

    def __init__(self, min_letters: int = 3):
        self.min_letters = int(min_letters)

    def score(self, candidates: Sequence[str], images: Sequence[Any] | None = None, videos: Sequence[Any] | None = None,
              references: Sequence[Sequence[str]] | None = None) -> WordOverlapResult:
        from capreward.media import MediaError, load_image

        if videos is not None:
            raise ValueError(f"{NAME} scores images only")
        errors: list[str | None] = []
        for k, image in enumerate(images or [None] * len(candidates)):
            try:
                if image is not None:
                    load_image(image, k)  # a path, a PIL image or an array: decoded, so a broken file is an error
                errors.append(None)
            except MediaError as exc:  # the row's error
                errors.append(f"cannot open the image: {exc}")
        ov = None if references is None else [overlap(c, r) for c, r in zip(candidates, references)]
        score = ov if ov is not None else [long_share(c, self.min_letters) for c in candidates]
        score = [float("nan") if e else s for s, e in zip(score, errors)]
        return WordOverlapResult(score=score, words=[len(words(c)) for c in candidates], overlap=ov, error=errors)


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
    explainer=f"{__name__}:explainer",
))


def explainer(spec, args):
    """The words of the caption that its references hold."""
    scorer = spec.load()()

    def run(rows):
        out = []
        for r in rows:
            refs = r.references if args.references else None
            res = scorer.score([r.caption], images=[r.path], references=None if refs is None else [refs])
            found = [w for w in words(r.caption) if refs and w in {x for ref in refs for x in words(ref)}]
            out.append({spec.name: res.score[0], f"{spec.name}/raw": " ".join(found),
                        "explanation": f"found in the references: {', '.join(found) or 'none'}"})
        return out

    return run
