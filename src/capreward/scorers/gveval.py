"""G-VEval: a chat VLM reasons about a caption, then writes "The final score is $N$".

Tong et al., "G-VEval: A Versatile Metric for Evaluating Image and Video Captions Using GPT-4o" (2024).
Modes ``ref-free`` (image or video only), ``ref-only`` (references; the visual is attached when given, as
the released code does), ``combined``; an overall score, or with ``accr=True`` the four ACCR dimensions
(accuracy α, completeness β, conciseness ψ, relevance δ; the release has ACCR prompts for video only).
Videos are shown as the three-frame 1536x512 composite (:func:`capreward.media.composite.video_composite`),
as the release sends them to GPT-4o; to a local judge that takes video (Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision: see
``video_input``) the same three frames go as a video, through the family's own video processor.

The score is the expected value over 0..100 at the number after the first "$" (ACCR: after each Greek
letter): on a local judge the exact distribution from a tree of cached decode steps; on a server whose
tokenizer writes a score as one token (GPT-4o), the top alternatives of the token after the marker that
are exactly "0".."100", renormalised (the released code's rule, with its default of 5 alternatives; when
a text is listed twice the later entry wins, as in the release); on a server whose tokenizer writes
numbers digit by digit (LLaMA, Qwen2/2.5/3), the exact distribution from a digit tree of
assistant-prefilled requests, or NaN with the reason (:mod:`capreward.scorers.remote_numbers`; which case
applies is read from the response's tokens). An answer whose score cannot be read is asked again up to ``requery`` times (the release
makes three attempts), then gets NaN with the reason in ``error`` (``fallback="parsed"`` uses the number
written in the answer instead; ``source`` says which).

The request follows the released ``scorer.py``: prompt text first, then the image with ``detail: "low"``
(video composites ``"high"``), no ``max_tokens``, the ref-only prompt without a visual as a system
message, and :class:`~capreward.judges.remote.OpenAIJudge`'s default model ``gpt-4o-2024-05-13``.

Differences from the released code, on purpose: the release samples at temperature 1; we default to
greedy decoding (``temperature=0``) so scores are reproducible (pass ``temperature=1.0`` for the
published setting). The release drops samples whose request failed or stayed unreadable, shifting every
later result; here such a sample keeps its place with score NaN and the reason. The release sends the
image file's bytes labelled ``image/jpeg``; we send the decoded pixels as PNG (lossless).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Sequence

import numpy as np

from ..errors import SampleError, kind_of
from ..judges.caller_text import is_blank
from ..judges.injection import injection_reasons
from ..judges.protocol import ChatRequest, JudgeBackend, system_turn, user_turn
from ..judges.vlm_prompts import GVEVAL_MODES, gveval_prompt, gveval_template
from ..media import MediaError, load_image
from ..media.composite import COMPOSITE_FRAMES, video_composite
from ..media.videos import frames_to_pil, load_video
from ..metrics.gveval import ACCR_MARKERS, OVERALL_MARKER, answer_regex, expected_score, parse_marked_score
from .remote_numbers import DEFAULT_TOLERANCE, TREE_TOP_LOGPROBS, check_tolerance
from .bad_items import references_problem
from .contract import Scores, floats
from .vlm_common import is_exact_backend, score_distributions

log = logging.getLogger(__name__)

#: How a video reaches the judge (`GVEval`'s ``video_input``).
VIDEO_INPUTS = ("auto", "composite", "frames")


class FrameClip(tuple):
    """A video's frames (RGB PIL images) to send as a video."""


def takes_video(backend: Any) -> bool:
    """Whether ``backend`` takes videos natively (a `LocalChatJudge` on a family that takes video)."""
    family = getattr(getattr(backend, "judge", None), "family", None)
    return bool(getattr(family, "takes_video", False)) and is_exact_backend(backend)


def backend_name(backend: Any) -> str:
    family = getattr(getattr(backend, "judge", None), "family", None)
    if family is not None:
        return f"the {family.name} judge"
    return f"{type(backend).__name__} ({getattr(backend, 'name', '?')})"


def video_frames(item: Any, index: int, frames: int | None = None) -> FrameClip:
    """The frames of ``item`` sent as a video: the composite's three (``frames`` None: the first three of
    ``int(linspace(0, T-1, 4))``) or ``int(linspace(0, T-1, frames))``. Raises MediaError naming the item."""
    if frames is None:
        array = load_video(item, frames=COMPOSITE_FRAMES + 1, index=index)[:COMPOSITE_FRAMES]
    else:
        array = load_video(item, frames=frames, index=index)
    return FrameClip(frames_to_pil(array))


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
    - ``injection``: per sample, None or why the caption looks like forged prompt structure
      (:func:`~capreward.judges.injection.injection_reason`); reported only, the score is the metric's.
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
    injection: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.raw)


class GVEval:
    """G-VEval on any chat judge backend.

    Args:
        backend: a `JudgeBackend` (a `LocalChatJudge`, an `OpenAIJudge`, ...).
        mode: ``"ref-free"``, ``"ref-only"`` or ``"combined"``.
        accr: the four ACCR scores (video only).
        expected: read the expected score from the token distribution (the paper's score); False uses
            the written number only.
        max_tokens: budget for reasoning plus score (None, the default: no limit is sent, as the release
            sends none).
        temperature: 0 is greedy (the release: 1).
        top_logprobs: alternatives asked of non-local backends (the release uses 5; vLLM allows 20).
        resolution: the ``detail`` of image parts, ``"low"`` (the release's default) or ``"high"``; video
            composites are always sent with ``"high"``, as released.
        requery: how many more times an answer whose score cannot be read is asked again (default 2:
            the release's three attempts; skipped on a local judge at temperature 0, whose answer would
            not change).
        fallback: what an answer that stays unreadable gets: ``"nan"`` (default; the release drops the
            sample, we keep its place with NaN and the reason) or ``"parsed"`` (the number written after
            the marker, when there is one).
        tolerance: on a server whose tokenizer writes numbers digit by digit, the expected score comes
            from an exact digit tree of assistant-prefilled requests (`capreward.scorers.remote_numbers`);
            a score whose bound (score points) is above ``tolerance`` gets NaN and the reason.
        tree_top_logprobs: the alternatives each node of the tree asks (20; a node is exact when all ten
            digits are listed, so serve more with vLLM's ``--max-logprobs`` and raise this and
            `OpenAIJudge`'s ``top_logprobs_cap`` together).
        structured: constrain the answer to the released format (free text, then "$N$" with N in
            0..100; ACCR: each Greek-letter score) with vLLM's ``structured_outputs={"regex": ...}``
            (`answer_regex()`), so the score slot is always readable; vLLM reports the model's own
            log-probabilities (its default ``logprobs_mode="raw_logprobs"``), so the expected score is
            unchanged by the constraint. Local judges ignore it.

    Formula: the expected score ``sum_k k * p(k)`` over the judge's distribution of the integer after
    "The final score is" (with ACCR, the mean of the four dimensions' expected scores).

    ``video_input``: how a video reaches the judge. ``"composite"``: the released three-frame 1536x512
    image (the only form for GPT-4o, any remote judge, LLaVA-1.5 and Qwen3-VL); ``"frames"``: the frames as a
    video, for a local judge that takes video (`LocalChatJudge` on Qwen2-VL, Qwen2.5-VL or LLaVA-OneVision:
    the family's video processor and video slot; Qwen2-VL's 3-D video positions); ``"auto"`` (default): frames when the
    backend takes video, else the composite. ``video_frames``: frames sent as a video (None, the default:
    the composite's three, ``int(linspace(0, T-1, 4))[:-1]``; an int k: ``int(linspace(0, T-1, k))``).
    The prompt text is the released one either way (it describes the composite).

    Examples:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward import GVEval
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> gveval = GVEval(backend=LocalChatJudge(tiny_vlm_judge()))  # ref-free; mode="combined" with references
        >>> r = gveval.score(["a red square", "a blue square"], images=[red, red])
        >>> [bool(0 <= s <= 100) for s in r.score], r.error
        ([True, True], [None, None])
    """

    def __init__(
        self,
        backend: JudgeBackend,
        mode: str = "ref-free",
        accr: bool = False,
        *,
        expected: bool = True,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_logprobs: int = 5,
        resolution: str = "low",
        requery: int = 2,
        fallback: str = "nan",
        tolerance: float = DEFAULT_TOLERANCE,
        tree_top_logprobs: int = TREE_TOP_LOGPROBS,
        structured: bool = False,
        video_input: str = "auto",
        video_frames: int | None = None,
    ):
        if mode not in GVEVAL_MODES:
            raise ValueError(f"mode must be one of {GVEVAL_MODES}, got {mode!r}")
        if resolution not in ("low", "high"):
            raise ValueError(f"resolution must be 'low' or 'high', got {resolution!r}")
        if requery < 0:
            raise ValueError(f"requery must be non-negative, got {requery}")
        if fallback not in ("nan", "parsed"):
            raise ValueError(f"fallback must be 'nan' or 'parsed', got {fallback!r}")
        self.backend = backend
        self.mode = mode
        self.accr = bool(accr)
        self.expected = expected
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_logprobs = top_logprobs
        self.resolution = resolution
        self.requery = int(requery)
        self.fallback = fallback
        self.tolerance = check_tolerance(tolerance)
        if tree_top_logprobs < 10:
            raise ValueError(f"tree_top_logprobs must be at least 10 (the digits), got {tree_top_logprobs}")
        self.tree_top_logprobs = int(tree_top_logprobs)
        self.structured = bool(structured)
        if video_input not in VIDEO_INPUTS:
            raise ValueError(f"video_input must be one of {VIDEO_INPUTS}, got {video_input!r}")
        if video_frames is not None and (isinstance(video_frames, bool) or not isinstance(video_frames, int) or video_frames < 1):
            raise ValueError(f"video_frames must be a positive int or None, got {video_frames!r}")
        if video_input == "frames" and not takes_video(backend):
            raise ValueError(
                f"video_input='frames' needs a local judge that takes video (Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision); {backend_name(backend)} "
                "does not: use 'composite' (the released form) or 'auto'"
            )
        self.video_input = video_input
        self.video_frames = video_frames

    @property
    def sends_video(self) -> bool:
        """Whether videos go to the judge as videos (frames) rather than as the composite image."""
        return self.video_input == "frames" or (self.video_input == "auto" and takes_video(self.backend))

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
                if visual == "vid" and self.sends_video:
                    pictures.append(video_frames(item, i, self.video_frames))
                    errors.append(None)
                    continue
                pictures.append(video_composite(item, i) if visual == "vid" else load_image(item, i))
                errors.append(None)
            except MediaError as exc:
                pictures.append(None)
                errors.append(SampleError.from_exception(exc, i))
        return visual, pictures, errors

    def requests(
        self, candidates: Sequence[str], images=None, videos=None, references=None
    ) -> tuple[list[ChatRequest | None], list[str | None]]:
        """The chat request of each sample (None where its visual could not be loaded) and the errors.

        As the released ``scorer.py`` builds them: the prompt text first, then the visual (an
        ``image_url`` part with ``detail`` = ``resolution`` for images, ``"high"`` for video composites);
        a prompt without a visual (ref-only) as a system message; no ``max_tokens`` unless set."""
        candidates = list(candidates)
        n = len(candidates)
        for i, c in enumerate(candidates):
            if not isinstance(c, str):
                raise TypeError(f"candidate {i} is {type(c).__name__}, not a string")
        if self.mode != "ref-free":
            if references is None or len(references) != n:
                raise ValueError(f"G-VEval mode {self.mode!r} needs one list of references per candidate")
            for i, refs in enumerate(references):  # the rule of every scorer and reward: no [], [""], non-str
                if isinstance(refs, str):
                    raise ValueError(f"references[{i}] must be a non-empty list of strings, got a str")
                problem = references_problem(refs, f"references[{i}]")
                if problem is not None:
                    raise ValueError(problem)
        visual, pictures, errors = self._visuals(n, images, videos)
        for i, c in enumerate(candidates):  # a judge would rate an empty caption: give no score instead
            if is_blank(c) and errors[i] is None:  # blank once special-token strings are removed too
                errors[i] = SampleError(i, "input", "", "empty caption")
        template = gveval_template(visual, self.mode, self.accr)
        top = self.top_logprobs if self.expected else 0
        detail = "high" if visual == "vid" else self.resolution  # the release forces "high" for video
        out: list[ChatRequest | None] = []
        for i in range(n):
            if errors[i] is not None:
                out.append(None)
                continue
            refs = references[i] if self.mode != "ref-free" else None
            text = gveval_prompt(template, candidates[i], refs)
            if isinstance(pictures[i], FrameClip):
                turn = user_turn(text, videos=[pictures[i]], text_first=True)
            elif pictures[i] is not None:
                turn = user_turn(text, [pictures[i]], text_first=True, image_detail=detail)
            else:
                turn = system_turn(text)
            out.append(
                ChatRequest(
                    turns=(turn,),
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                    top_logprobs=top,
                    structured_outputs={"regex": answer_regex(list(self.markers.values()))} if self.structured else None,
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
        """Score each ``candidates[n]`` with ``images[n]`` or ``videos[n]`` and/or ``references[n]``.

        Args:
            candidates: the captions.
            images: one image per candidate (ref-free and combined modes).
            videos: one video per candidate instead of ``images``.
            references: one list of reference captions per candidate (ref-only and combined modes).

        A sample whose score cannot be read from the answer (no marker, no number after it, no integer
        among the alternatives) is asked again, up to ``requery`` times, as the release does; then it gets
        NaN and the reason (or, with ``fallback="parsed"``, the number written in the answer).

        Returns:
            A `GVEvalResult`: ``score`` (N,) in [0, 100] (with ACCR the mean of the four dimensions),
            ``parsed``, ``source``, ``raw``, ``error``, and with ACCR ``accuracy``, ``completeness``,
            ``conciseness`` and ``relevance``.
        """
        candidates = list(candidates)
        requests, errors = self.requests(candidates, images, videos, references)
        n = len(requests)
        raw = [""] * n
        dims = {name: np.full(n, np.nan) for name in self.markers}
        parsed_dims = {name: np.full(n, np.nan) for name in self.markers}
        sources: list[str | None] = [None] * n
        pending = [i for i, r in enumerate(requests) if r is not None]
        for attempt in range(self.requery + 1):
            unreadable = self._ask(pending, requests, raw, dims, parsed_dims, sources, errors)
            if not unreadable or not self._requery_changes_answers():
                break
            if attempt < self.requery:
                log.info("G-VEval: asking again for %d unreadable answers (attempt %d)", len(unreadable), attempt + 2)
            pending = unreadable
        stacked = np.stack([dims[k] for k in self.markers])
        score = stacked.mean(axis=0)
        parsed = np.stack([parsed_dims[k] for k in self.markers]).mean(axis=0)
        for i in range(n):
            if np.isnan(score[i]):
                sources[i] = None
                if errors[i] is None:  # pragma: no cover - every NaN path sets an error above
                    errors[i] = "no score"
                log.info("G-VEval sample %d: %s", i, errors[i])
        injection = injection_reasons(candidates)
        result = GVEvalResult(score=score, parsed=parsed, source=sources, raw=raw, error=errors, injection=injection)
        if self.accr:
            for name in ACCR_MARKERS:
                setattr(result, name, dims[name])
        return result

    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None) -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`): the score in [0, 100], ``raw``,
        ``parsed`` and, with ``accr=True``, the four ACCR dimensions."""
        res = self.score(list(captions), images=images, videos=videos, references=references)
        n = len(res.raw)
        subs: dict[str, list] = {"raw": list(res.raw), "parsed": floats(res.parsed, n)}
        if self.accr:
            subs.update({name: floats(getattr(res, name), n) for name in ACCR_MARKERS})
        return Scores(score=floats(res.score, n), sub_scores=subs, errors=list(res.error), result=res)

    @classmethod
    def for_explain(cls, settings: Any) -> GVEval:
        """The scorer ``capreward explain`` builds (``settings``: its options): the local judge, in the
        combined mode with ``--references``, else reference-free."""
        from ..judges.local import LocalJudge
        from ..judges.local_chat import LocalChatJudge

        judge = LocalJudge(settings.judge_model, device=settings.device, dtype=settings.dtype)
        return cls(LocalChatJudge(judge, batch_size=settings.batch_size),
                   mode="combined" if settings.references else "ref-free", max_tokens=settings.max_new_tokens)

    def explanations(self, captions: Sequence[str], *, images: Sequence[Any] | None = None,
                     videos: Sequence[Any] | None = None, references: Sequence[Sequence[str]] | None = None) -> Scores:
        """:meth:`scores` with ``extras["explanation"]``: the judge writes its reasoning before the score;
        that reasoning (its answer) is the explanation."""
        out = self.scores(captions, images=images, videos=videos, references=references)
        out.extras["explanation"] = [r or None for r in out.sub_scores["raw"]]
        return out

    def _requery_changes_answers(self) -> bool:
        """False for a local judge decoding greedily: asking again would give the same answer."""
        return not (is_exact_backend(self.backend) and self.temperature == 0)

    def _ask(self, rows, requests, raw, dims, parsed_dims, sources, errors) -> list[int]:
        """Send the requests of ``rows``, read their scores into the output arrays (overwriting an
        earlier attempt's) and return the rows whose answer could not be read (to ask again)."""
        sent = [requests[i] for i in rows]
        responses = self.backend.generate(sent) if sent else []
        if len(responses) != len(sent):
            raise RuntimeError(f"the backend answered {len(responses)} of {len(sent)} requests")
        ok_rows, ok_requests, ok_responses = [], [], []
        for i, response in zip(rows, responses):
            for name in self.markers:
                dims[name][i] = parsed_dims[name][i] = np.nan
            sources[i] = None
            if not response.ok:
                raw[i] = ""
                errors[i] = SampleError(i, kind_of(response.error, "judge_unavailable"), "", f"judge request failed: {response.error}")
                continue
            raw[i] = response.text
            errors[i] = None
            ok_rows.append(i)
            ok_requests.append(requests[i])
            ok_responses.append(response)
        unreadable: set[int] = set()
        every: tuple[list, list] = ([], [])
        if self.expected and ok_rows:  # every marker of every answer at once: a caption's numbers in one group
            marks = list(self.markers.values())
            every = score_distributions(self.backend, ok_requests * len(marks), ok_responses * len(marks),
                                        [m for m in marks for _ in ok_rows], tolerance=self.tolerance,
                                        tree_top_logprobs=self.tree_top_logprobs, groups=ok_rows * len(marks))
        for k, (name, marker) in enumerate(self.markers.items()):
            for i in ok_rows:
                value = parse_marked_score(raw[i], marker)
                if value is not None:
                    parsed_dims[name][i] = value
            probs: list = [None] * len(ok_rows)
            reasons: list = ["expected score not requested"] * len(ok_rows)
            if self.expected and ok_rows:
                span = slice(k * len(ok_rows), (k + 1) * len(ok_rows))
                probs, reasons = every[0][span], every[1][span]
            label = name if name == "score" else name + " score"
            for i, p, why in zip(ok_rows, probs, reasons):
                if p is not None:
                    dims[name][i] = expected_score(p)
                    sources[i] = sources[i] or "expected"
                    continue
                readable_number = not np.isnan(parsed_dims[name][i])
                if not self.expected and readable_number:
                    dims[name][i] = parsed_dims[name][i]
                    sources[i] = "parsed"
                    continue
                unreadable.add(i)
                if self.expected and self.fallback == "parsed" and readable_number:
                    dims[name][i] = parsed_dims[name][i]
                    sources[i] = "parsed"
                    log.info("G-VEval sample %d (%s): no distribution (%s); using the written number", i, name, why)
                else:
                    reason = why if self.expected else f"no integer after {marker!r}"
                    errors[i] = errors[i] or SampleError(i, "judge_unreadable", "", f"no {label}: {reason}")
        return sorted(unreadable)
