"""G-VEval: a chat VLM reasons about a caption, then writes "The final score is $N$".

Tong et al., "G-VEval: A Versatile Metric for Evaluating Image and Video Captions Using GPT-4o" (2024).
Modes ``ref-free`` (image or video only), ``ref-only`` (references; the visual is attached when given, as
the released code does), ``combined``; an overall score, or with ``accr=True`` the four ACCR dimensions
(accuracy α, completeness β, conciseness ψ, relevance δ; the release has ACCR prompts for video only).
Videos are shown as the three-frame 1536x512 composite (:func:`capreward.media.composite.video_composite`).

The score is the expected value over 0..100 at the number after the first "$" (ACCR: after each Greek
letter): on a local judge the exact distribution from a tree of cached decode steps; on a server the
top alternatives of the token after the marker that are exactly "0".."100", renormalised (the released
code's rule, with its default of 5 alternatives). When no distribution can be read, the number written
in the answer is used (``source`` says which); with neither the score is NaN with the reason in ``error``.

Differences from the released code: the release samples at temperature 1; we default to greedy
decoding (``temperature=0``) so scores are reproducible (pass ``temperature=1.0`` for the published
setting). The release drops samples whose request failed, shifting every later result; here a failed
sample keeps its place with score NaN and the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..judges.protocol import ChatRequest, JudgeBackend, user_turn
from ..judges.vlm_prompts import GVEVAL_MODES, gveval_prompt, gveval_template
from ..media import MediaError, load_image
from ..media.composite import video_composite
from ..metrics.gveval import ACCR_MARKERS, OVERALL_MARKER, expected_score, parse_marked_score
from .vlm_common import score_distributions

log = logging.getLogger(__name__)


@dataclass
class GVEvalResult:
    """Per-sample G-VEval results for N candidates.

    - ``score``: (N,) float64 in [0, 100]; with ACCR the mean of the four dimensions; NaN where there is
      no score (``error`` says why).
    - ``parsed``: (N,) the integer written after the marker (ACCR: the mean of the four), NaN if none.
    - ``source``: per sample ``"expected"`` (distribution), ``"parsed"`` (written number) or None.
    - ``raw``: the judge's answers (reasoning and score) as text.
    - ``error``: None, or why the sample has no score.
    - ``accuracy`` / ``completeness`` / ``conciseness`` / ``relevance``: with ACCR, (N,) each; else None.
    """

    score: np.ndarray
    parsed: np.ndarray
    source: list[str | None]
    raw: list[str]
    error: list[str | None]
    accuracy: np.ndarray | None = None
    completeness: np.ndarray | None = None
    conciseness: np.ndarray | None = None
    relevance: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.raw)


class GVEval:
    """G-VEval on any chat judge backend.

    ``mode``: "ref-free", "ref-only" or "combined"; ``accr``: the four ACCR scores (video only).
    ``expected``: read the expected score from the token distribution (the paper's score); False uses the
    written number only. ``max_tokens``: budget for reasoning plus score; ``temperature``: 0 is greedy;
    ``top_logprobs``: alternatives asked of non-local backends (the release uses 5; vLLM allows 20).
    """

    def __init__(
        self,
        backend: JudgeBackend,
        mode: str = "ref-free",
        accr: bool = False,
        *,
        expected: bool = True,
        max_tokens: int = 512,
        temperature: float = 0.0,
        top_logprobs: int = 5,
    ):
        if mode not in GVEVAL_MODES:
            raise ValueError(f"mode must be one of {GVEVAL_MODES}, got {mode!r}")
        self.backend = backend
        self.mode = mode
        self.accr = bool(accr)
        self.expected = expected
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_logprobs = top_logprobs

    @property
    def markers(self) -> dict[str, str]:
        """Score name -> the marker its number follows."""
        return dict(ACCR_MARKERS) if self.accr else {"score": OVERALL_MARKER}

    def _visuals(self, n: int, images, videos) -> tuple[str, list[Any], list[str | None]]:
        if images is not None and videos is not None:
            raise ValueError("pass images or videos, not both")
        items = images if images is not None else videos
        visual = "vid" if videos is not None else "img"
        if items is None:
            if self.mode != "ref-only":
                raise ValueError(f"G-VEval mode {self.mode!r} needs images or videos")
            return visual, [None] * n, [None] * n
        if len(items) != n:
            raise ValueError(f"{n} candidates but {len(items)} {'videos' if videos is not None else 'images'}")
        pictures: list[Any] = []
        errors: list[str | None] = []
        for i, item in enumerate(items):
            try:
                pictures.append(video_composite(item, i) if visual == "vid" else load_image(item, i))
                errors.append(None)
            except MediaError as exc:
                pictures.append(None)
                errors.append(str(exc))
        return visual, pictures, errors

    def requests(
        self, candidates: Sequence[str], images=None, videos=None, references=None
    ) -> tuple[list[ChatRequest | None], list[str | None]]:
        """The chat request of each sample (None where its visual could not be loaded) and the errors."""
        candidates = list(candidates)
        n = len(candidates)
        for i, c in enumerate(candidates):
            if not isinstance(c, str):
                raise TypeError(f"candidate {i} is {type(c).__name__}, not a string")
        if self.mode != "ref-free":
            if references is None or len(references) != n:
                raise ValueError(f"G-VEval mode {self.mode!r} needs one list of references per candidate")
            for i, refs in enumerate(references):
                if isinstance(refs, str) or not refs:
                    raise ValueError(f"references[{i}] must be a non-empty list of strings")
        visual, pictures, errors = self._visuals(n, images, videos)
        for i, c in enumerate(candidates):  # a judge would rate an empty caption: give no score instead
            if not c.strip() and errors[i] is None:
                errors[i] = f"candidate {i} is an empty caption"
        template = gveval_template(visual, self.mode, self.accr)
        top = self.top_logprobs if self.expected else 0
        out: list[ChatRequest | None] = []
        for i in range(n):
            if errors[i] is not None:
                out.append(None)
                continue
            refs = references[i] if self.mode != "ref-free" else None
            text = gveval_prompt(template, candidates[i], refs)
            images_i = [pictures[i]] if pictures[i] is not None else []
            out.append(
                ChatRequest(
                    turns=(user_turn(text, images_i),),
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                    top_logprobs=top,
                )
            )
        return out, errors

    def score(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        videos: Sequence[Any] | None = None,
        references: Sequence[Sequence[str]] | None = None,
    ) -> GVEvalResult:
        """Score each ``candidates[n]`` with ``images[n]`` or ``videos[n]`` and/or ``references[n]``."""
        requests, errors = self.requests(candidates, images, videos, references)
        n = len(requests)
        rows = [i for i, r in enumerate(requests) if r is not None]
        sent = [requests[i] for i in rows]
        responses = self.backend.generate(sent) if sent else []
        if len(responses) != len(sent):
            raise RuntimeError(f"the backend answered {len(responses)} of {len(sent)} requests")
        raw = [""] * n
        dims = {name: np.full(n, np.nan) for name in self.markers}
        parsed_dims = {name: np.full(n, np.nan) for name in self.markers}
        sources: list[str | None] = [None] * n
        ok_rows, ok_requests, ok_responses = [], [], []
        for i, response in zip(rows, responses):
            if not response.ok:
                errors[i] = f"judge request failed: {response.error}"
                continue
            raw[i] = response.text
            ok_rows.append(i)
            ok_requests.append(requests[i])
            ok_responses.append(response)
        for name, marker in self.markers.items():
            for i in ok_rows:
                value = parse_marked_score(raw[i], marker)
                if value is not None:
                    parsed_dims[name][i] = value
            probs: list = [None] * len(ok_rows)
            reasons: list = ["expected score not requested"] * len(ok_rows)
            if self.expected and ok_rows:
                probs, reasons = score_distributions(self.backend, ok_requests, ok_responses, [marker] * len(ok_rows))
            for i, p, why in zip(ok_rows, probs, reasons):
                if p is not None:
                    dims[name][i] = expected_score(p)
                    sources[i] = sources[i] or "expected"
                elif not np.isnan(parsed_dims[name][i]):
                    dims[name][i] = parsed_dims[name][i]
                    sources[i] = "parsed"
                    if self.expected:
                        log.info("G-VEval sample %d (%s): no distribution (%s); using the written number", i, name, why)
                else:
                    errors[i] = errors[i] or f"no {name if name == 'score' else name + ' score'}: {why if self.expected else f'no integer after {marker!r}'}"
        stacked = np.stack([dims[k] for k in self.markers])
        score = stacked.mean(axis=0)
        parsed = np.stack([parsed_dims[k] for k in self.markers]).mean(axis=0)
        for i in range(n):
            if np.isnan(score[i]):
                sources[i] = None
                if errors[i] is None:  # pragma: no cover - every NaN path sets an error above
                    errors[i] = "no score"
                log.info("G-VEval sample %d: %s", i, errors[i])
        result = GVEvalResult(score=score, parsed=parsed, source=sources, raw=raw, error=errors)
        if self.accr:
            for name in ACCR_MARKERS:
                setattr(result, name, dims[name])
        return result
