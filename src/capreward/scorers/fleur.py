"""FLEUR and RefFLEUR (Lee et al., ACL 2024) on a local LLaVA, as batched rewards.

``FLEUR.score`` asks the judge the FLEUR prompt (RefFLEUR when references are given), decodes the
answer greedily and smooths it with the digit distributions at the steps that wrote the decimals (see
:mod:`capreward.metrics.fleur` for the exact rules). ``FLEUR.explain`` asks the follow-up question
"Why? Tell me the reason." with the score as the assistant's first answer.

Speed: the answer is a handful of tokens, so instead of one ``generate`` call per caption the scorer
runs one batched prefill and a few cached decode steps per chunk of ``batch_size`` captions. Captions of
the same image share the image and the prompt text before the caption: that prefix is computed once per
image and its key/value cache reused by all of them (a GRPO group of 8 captions pays for one image).
Scores equal those of a per-sample ``generate(..., output_logits=True)`` computation (to float
rounding) and do not depend on the batch's composition.

Decoding runs until each answer ends, up to the release's ``max_new_tokens=512``: the released code
reads the number out of the *whole* answer (every digit and dot in it), so a digit written late changes
the score and it is decided only when the answer ends. The common answer ("0.85") ends after a few
tokens as before; rows that have ended are dropped from the batch, so one long answer costs only its own
decode steps, and only the logits of digit steps are kept.

Differences from the released code, on purpose: an answer that does not parse, lies outside [0, 1] or is
not finished within ``max_new_tokens`` tokens gets NaN and a reason in ``error`` (the released script
silently reused the previous sample's score); the explanation prompt closes the first answer with a
single ``</s>`` (the released ``fleur_exp.py`` appended one by hand on top of the template's own); the
decimals are read at the steps that wrote them, where the release searches the answer for the digit's
token and, for the second decimal, takes its second occurrence when it occurs twice - which in "0.255"
is the third decimal. ``digit_search="release"`` reproduces the release's search
(:func:`~capreward.metrics.fleur.release_token_search`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast
from collections.abc import Sequence

import torch
from PIL import Image

from ..default_models import DEFAULT_LLAVA
from ..judges.local import GreedyOutput, LocalJudge
from ..judges.caller_text import Data, is_blank, render
from ..errors import SampleError
from ..judges.injection import injection_reasons
from ..judges.prompts import FLEUR_EXPLAIN_PROMPT, fleur_prompt
from ..media import MediaError, describe, load_image, media_key
from ..media.composite import video_composite
from ..metrics.fleur import (
    DIGIT_SEARCHES,
    FleurReading,
    char_steps_from_prefixes,
    check_digit_tokens,
    digit_probabilities,
    fleur_from_digit_probs,
    parse_fleur_answer,
    raw_scores,
    release_token_search,
)
from .contract import Scores, floats
from .validation import caption_list, check_references


@dataclass
class FLEURResult:
    """Per-sample FLEUR results for N candidates.

    - ``score``: (N,) float32 in [0, 1], NaN where there is no score (see ``error``).
    - ``raw_score``: (N,) the greedy answer read as a number (the paper's raw-score ablation), NaN where
      it does not read as a number in [0, 1].
    - ``raw``: the greedy answers as text; ``""`` for samples that were not run.
    - ``error``: None, or why the sample has no score.
    - ``rule``: how the answer was read: ``"one_decimal"``, ``"two_decimals"``, ``"one"`` or None.
    - ``digit_probs``: (N, 2, 10) full-vocabulary p("0".."9") at the first and second read step, NaN in
      slots that were not read.
    - ``injection``: per sample, None or why the caption looks like forged prompt structure
      (:func:`~capreward.judges.injection.injection_reason`); reported only, the score is the metric's.
    - ``pixel_values`` / ``inputs_embeds`` / ``grad_rows``: with ``requires_grad=True``, the leaf tensors
      the scores differentiate to: (U, 3, H, W) for the distinct images and (len(grad_rows), L, hidden)
      token embeddings of the teacher-forced pass over the scored rows ``grad_rows``.
    """

    score: torch.Tensor
    raw_score: torch.Tensor
    raw: list[str]
    error: list[str | None]
    rule: list[str | None]
    digit_probs: torch.Tensor
    pixel_values: torch.Tensor | None = None
    inputs_embeds: torch.Tensor | None = None
    grad_rows: list[int] = field(default_factory=list)
    injection: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.raw)


@dataclass
class FLEURPlan:
    """The greedy pass over a batch: what was asked, what was answered and where it is read.

    ``prompts[n]`` are the conversation parts asked (the caption is :class:`Data`); ``prompt_ids[n]`` is
    None for samples that were not run (their ``error`` says why); ``visuals`` are the distinct images
    (composites for videos) and ``image_index[n]`` picks sample n's.
    """

    candidates: list[str]
    prompts: list[list[str | Data]]
    prompt_ids: list[list[int] | None]
    visuals: list[Image.Image]
    image_index: list[int]
    tokens: list[list[int]]
    raw: list[str]
    readings: list[FleurReading]
    error: list[str | None]
    digit_probs: torch.Tensor

    @property
    def rules(self) -> list[str | None]:
        return [r.rule for r in self.readings]

    @property
    def scored_rows(self) -> list[int]:
        return [n for n, r in enumerate(self.readings) if r.ok]


def judge_visuals(images: Sequence[Any] | None, videos: Sequence[Any] | None, n: int) -> tuple[list[Image.Image], list[int]]:
    """Distinct visuals shown to a judge (RGB images; three-frame composites for videos) and each
    sample's index into them.

    Samples share a visual when they pass the same object or the same content (``media_key``). Raises
    ``ValueError`` unless exactly one of ``images``/``videos`` has ``n`` items, and ``MediaError``
    naming a missing or unusable item.
    """
    if (images is None) == (videos is None):
        raise ValueError("give exactly one of images= or videos=")
    items = list(cast(Sequence[Any], images if images is not None else videos))  # one of them (checked)
    what = "images" if images is not None else "videos"
    if len(items) != n:
        raise ValueError(f"got {len(items)} {what} for {n} candidates; give one per candidate")
    by_object: dict[int, int] = {}
    by_key: dict[str, int] = {}
    visuals: list[Image.Image] = []
    index: list[int] = []
    for i, item in enumerate(items):
        if item is None:
            raise MediaError(describe(item, i), f"{what[:-1]} is missing (None)")
        if id(item) in by_object:
            index.append(by_object[id(item)])
            continue
        key = media_key(item)
        if key is not None and key in by_key:
            slot = by_key[key]
        else:
            visual = load_image(item, i) if images is not None else video_composite(item, i)
            slot = len(visuals)
            visuals.append(visual)
            if key is not None:
                by_key[key] = slot
        by_object[id(item)] = slot
        index.append(slot)
    return visuals, index


def fleur_scores(result: FLEURResult) -> Scores:
    """A FLEUR result (local or remote) as the contract's :class:`~capreward.scorers.contract.Scores`: the
    score, ``raw`` (the greedy answer), ``parsed`` (that answer read as a number); an unscored sample's
    error is the scorer's reason, or says its answer has no score."""
    n = len(result.raw)
    score = floats(result.score, n)
    errors = [(err or f"judge answer {raw!r} has no score") if math.isnan(s) else err
              for s, err, raw in zip(score, result.error, result.raw)]
    return Scores(score=score, sub_scores={"raw": list(result.raw), "parsed": floats(result.raw_score, n)},
                  errors=errors, result=result)


class FLEURScores:
    """The contract (:meth:`scores`) of the FLEUR scorers, local (:class:`FLEUR`) and remote
    (:class:`~capreward.scorers.fleur_remote.RemoteFLEUR`), on their ``score``."""

    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None) -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`; see :func:`fleur_scores`)."""
        return fleur_scores(self.score(list(captions), images, references, videos=videos))  # type: ignore[attr-defined]

    def _first_turns(self, candidates: list[str], images: Sequence[Any] | None, references: Any,
                     scores: Sequence[float] | torch.Tensor | None, videos: Sequence[Any] | None) -> list[str]:
        """The judge's first answer in each explanation conversation (``explain``): ``str(float(score))`` of
        ``scores`` (ValueError unless one per candidate), or without them of the scores computed first, a
        sample without a score keeping its raw answer."""
        if scores is None:
            result = self.score(candidates, images, references, videos=videos)  # type: ignore[attr-defined]
            return [r if math.isnan(s) else str(s) for s, r in zip(result.score.tolist(), result.raw)]
        values = scores.tolist() if isinstance(scores, torch.Tensor) else list(scores)
        if len(values) != len(candidates):
            raise ValueError(f"got {len(values)} scores for {len(candidates)} candidates")
        return [str(float(s)) for s in values]


class FLEUR(FLEURScores):
    """FLEUR / RefFLEUR scorer on a local LLaVA judge.

    Args:
        model: hub name or local directory (default ``llava-hf/llava-1.5-13b-hf``), a
            ``(model, processor)`` pair, or a `LocalJudge`.
        processor: the processor of a model object.
        device: None picks CUDA when available, else CPU (a passed model stays where it is unless given).
        dtype: None picks float16 on CUDA, float32 elsewhere.
        batch_size: captions per forward pass.
        max_new_tokens: budget of the greedy answer (512, the release's; decoding stops at each answer's
            end; an unfinished answer has no score).
        explain_max_new_tokens: budget of an explanation (:meth:`explain`).
        share_prefix: reuse the image+prompt prefix across captions of an image (results are the same
            either way; only speed differs).
        pad_to_square: LLaVA-1.5's padding of images to a square in the mean colour.
        max_context: longest prompt + answer allowed (default: the model's ``max_position_embeddings``).
        local_files_only: load from the local cache only.
        attn_implementation: transformers' ``attn_implementation``.
        digit_search: ``"step"`` (default) reads each decimal at the step that wrote it; ``"release"``
            searches the tokens as the released code does (see the module docstring).

    Formula: with ``p(i, j)`` the judge's probability (softmax over the whole vocabulary) of digit ``i``
    at the step of the greedy answer's ``j``-th decimal, ``FLEUR = 0.1 * sum_i i * p(i, 1) + 0.01 *
    sum_i i * p(i, 2)`` (the second term only for an answer with two decimals); for an answer "1.0",
    ``FLEUR = 0.9 * p("0") + p("1")`` read at the units step.

    Memory: a chunk holds the key/value cache of ``batch_size`` full prompts (the shared prefix is
    computed once per image but copied to every row, so that each row attends over one contiguous cache).
    For LLaVA-1.5-13B in float16 that is about 0.8 MB per token and row: ~18 GB for 32 captions of 700
    tokens; lower ``batch_size`` to trade speed for memory.

    Examples:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward import FLEUR
        >>> from capreward.testing import tiny_judge_dir
        >>> fleur = FLEUR(model=str(tiny_judge_dir()))  # a tiny LLaVA trained on FLEUR's prompt
        >>> r = fleur.score(["a red car", "a yellow box"], [red, red])
        >>> bool(r.score[0] > r.score[1]), bool(0 <= r.score.min() and r.score.max() <= 1)
        (True, True)
    """

    name = "FLEUR"

    def __init__(
        self,
        model: Any = DEFAULT_LLAVA,
        processor: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        batch_size: int = 32,
        max_new_tokens: int = 512,
        explain_max_new_tokens: int = 512,
        share_prefix: bool = True,
        pad_to_square: bool = True,
        max_context: int | None = None,
        local_files_only: bool | None = None,
        attn_implementation: str | None = None,
        digit_search: str = "step",
    ):
        if digit_search not in DIGIT_SEARCHES:
            raise ValueError(f"digit_search must be one of {DIGIT_SEARCHES}, got {digit_search!r}")
        self.digit_search = digit_search
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if isinstance(model, LocalJudge):
            self.judge = model
        else:
            self.judge = LocalJudge(
                model,
                processor,
                device=device,
                dtype=dtype,
                pad_to_square=pad_to_square,
                local_files_only=local_files_only,
                attn_implementation=attn_implementation,
            )
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.explain_max_new_tokens = explain_max_new_tokens
        self.share_prefix = share_prefix
        self.max_context = max_context if max_context is not None else self.judge.context_length
        self.digit_ids = self.judge.digit_token_ids()
        self._control_strings: list[str] | None = None

    # ------------------------------------------------------------------------------------ public API
    def score(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        references: Sequence[Sequence[str] | str] | None = None,
        *,
        videos: Sequence[Any] | None = None,
        requires_grad: bool = False,
    ) -> FLEURResult:
        """Score each candidate against its image (FLEUR) or image and references (RefFLEUR).

        Args:
            candidates: the captions.
            images: per candidate, a path, PIL image, uint8 (H, W, 3) array or float (3, H, W) tensor in
                [0, 1].
            references: per candidate, a caption or a list of captions (RefFLEUR), or None.
            videos: per candidate instead of ``images``, a path, (T, H, W, 3) uint8 frames or a list of
                frames, scored on its three-frame composite.
            requires_grad: make the scores differentiable with respect to ``result.pixel_values`` and
                ``result.inputs_embeds`` (one extra teacher-forced pass).

        Empty captions and prompts beyond the context get NaN with a reason.

        Returns:
            A `FLEURResult`: ``score`` (N,) in [0, 1], NaN with the reason in ``error`` where there is
            no score.

        Raises:
            ValueError: an unusable input, naming the item (``MediaError``, a ValueError, for a visual
                that cannot be read).
            TypeError: an input of the wrong type, naming the item.
        """
        plan = self.plan(candidates, images, references, videos=videos)
        score = fleur_from_digit_probs(torch.nan_to_num(plan.digit_probs), plan.rules).float()
        result = FLEURResult(
            score=score,
            raw_score=raw_scores(plan.readings),
            raw=plan.raw,
            error=plan.error,
            rule=plan.rules,
            digit_probs=plan.digit_probs,
            injection=injection_reasons(plan.candidates),
        )
        if requires_grad:
            pixel_values = self.judge.preprocess(plan.visuals).detach().clone().requires_grad_(True)
            rows = plan.scored_rows
            inputs = self.teacher_forcing(plan)
            embeds = None
            if rows:
                embeds = self.judge.model.get_input_embeddings()(inputs.input_ids).detach().clone().requires_grad_(True)
            result.score = self.differentiable_score(plan, pixel_values=pixel_values, inputs_embeds=embeds, inputs=inputs)
            result.pixel_values, result.inputs_embeds, result.grad_rows = pixel_values, embeds, rows
        return result

    __call__ = score

    def explain(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        references: Sequence[Sequence[str] | str] | None = None,
        scores: Sequence[float] | torch.Tensor | None = None,
        *,
        videos: Sequence[Any] | None = None,
        max_new_tokens: int | None = None,
    ) -> list[str]:
        """The judge's explanation of each score: a second turn "Why? Tell me the reason." after the
        first turn's answer is set to the score (``str(float(score))``, as the released code does).

        Args:
            candidates: the captions.
            images: as for :meth:`score`.
            references: as for :meth:`score`.
            scores: the scores to explain (None: computed first; a sample without a score keeps its
                greedy answer as the first turn).
            videos: as for :meth:`score`.
            max_new_tokens: budget of each explanation (default ``explain_max_new_tokens``).

        Returns:
            One explanation per candidate (greedy).

        Raises:
            ValueError: an empty caption, or a prompt that does not fit the context.
        """
        candidates = caption_list(candidates)
        n = len(candidates)
        for i, c in enumerate(candidates):
            if self.is_empty_caption(c):
                raise ValueError(f"candidates[{i}] is an empty caption; there is nothing to explain")
        refs = check_references(references, n)
        visuals, image_index = judge_visuals(images, videos, n)
        first = self._first_turns(candidates, images, references, scores, videos)
        prompts = []
        for i, c in enumerate(candidates):
            message = fleur_prompt(c, refs[i] if refs is not None else None)
            prompts.append(self.judge.conversation_parts([(message, first[i]), (FLEUR_EXPLAIN_PROMPT, None)]))
        budget = max_new_tokens or self.explain_max_new_tokens
        runs, errors = self._generate(
            prompts, visuals, image_index, list(range(n)), budget, keep_logits=False, fit_to_context=True
        )
        for i, err in enumerate(errors):
            if err is not None:
                raise ValueError(f"candidates[{i}]: {err}")
        return [self.judge.decode(runs[i][1]) for i in range(n)]

    @classmethod
    def for_explain(cls, settings: Any) -> FLEUR:
        """The scorer ``capreward explain`` builds (``settings``: its options)."""
        return cls(model=settings.judge_model, device=settings.device, dtype=settings.dtype,
                   batch_size=settings.batch_size, explain_max_new_tokens=settings.max_new_tokens)

    def explanations(self, captions: Sequence[str], *, images: Sequence[Any] | None = None,
                     videos: Sequence[Any] | None = None, references: Sequence[Sequence[str]] | None = None) -> Scores:
        """:meth:`scores` with ``extras["explanation"]``: the score, then the follow-up question "Why? Tell
        me the reason." (:meth:`explain`). A caption without a score gets the reason and no explanation."""
        captions = list(captions)
        out = self.scores(captions, images=images, videos=videos, references=references)
        ok = [k for k, s in enumerate(out.score) if not math.isnan(s)]
        explained: dict[int, str] = {}
        if ok:
            pick = (lambda xs: None if xs is None else [xs[k] for k in ok])  # noqa: E731
            texts = self.explain([captions[k] for k in ok], pick(images), pick(references),
                                 scores=[out.score[k] for k in ok], videos=pick(videos))
            explained = dict(zip(ok, texts))
        out.extras["explanation"] = [explained.get(k) for k in range(len(captions))]
        return out

    def prompts(self, candidates: Sequence[str], references: Sequence[Sequence[str] | str] | None = None) -> list[str]:
        """The full conversation strings the judge is asked (with the image placeholder)."""
        return [render(parts) for parts in self.prompt_parts(candidates, references)]

    def prompt_parts(
        self, candidates: Sequence[str], references: Sequence[Sequence[str] | str] | None = None
    ) -> list[list[str | Data]]:
        """The conversations of `prompts()` as parts: the user message (prompt text with the caption
        and references) is `Data`, encoded without special tokens."""
        candidates = caption_list(candidates)
        refs = check_references(references, len(candidates))
        return [
            self.judge.conversation_parts([(fleur_prompt(c, refs[i] if refs is not None else None), None)])
            for i, c in enumerate(candidates)
        ]

    def is_empty_caption(self, caption: str) -> bool:
        """True when nothing is left of ``caption`` once the judge's special-token strings (and the common
        families'), invisible characters and whitespace are removed ("<s></s>" is an empty caption)."""
        if self._control_strings is None:
            self._control_strings = self.judge.control_token_strings()
        return is_blank(caption, self._control_strings)

    # ------------------------------------------------------------------------------ the greedy pass
    def plan(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        references: Sequence[Sequence[str] | str] | None = None,
        *,
        videos: Sequence[Any] | None = None,
    ) -> FLEURPlan:
        """Run the batched greedy pass and read every answer; no gradients. Returns a `FLEURPlan`."""
        candidates = caption_list(candidates)
        n = len(candidates)
        refs = check_references(references, n)
        visuals, image_index = judge_visuals(images, videos, n)
        prompts = self.prompt_parts(candidates, refs)
        error: list[str | None] = [None] * n
        for i, c in enumerate(candidates):
            if self.is_empty_caption(c):
                error[i] = SampleError(i, "input", "", "empty caption")
        rows = [i for i in range(n) if error[i] is None]
        runs, run_errors = self._generate(prompts, visuals, image_index, rows, self.max_new_tokens, keep_logits=True, fit_to_context=True)
        prompt_ids: list[list[int] | None] = [None] * n
        tokens: list[list[int]] = [[] for _ in range(n)]
        raw = [""] * n
        readings = [FleurReading(value=None, rule=None, error=e) for e in error]
        probs = torch.full((n, 2, 10), float("nan"))
        for i in range(n):
            if run_errors[i] is not None:
                error[i] = run_errors[i]
                readings[i] = FleurReading(value=None, rule=None, error=run_errors[i])
            if i not in runs:
                continue
            ids, toks, finished, logits = runs[i]
            prompt_ids[i], tokens[i] = ids, toks
            raw[i] = self.judge.decode(toks)
            if not finished:
                limit = (
                    f"max_new_tokens={self.max_new_tokens} tokens"
                    if len(toks) >= self.max_new_tokens
                    else f"the judge's context ({len(toks)} tokens)"
                )
                reading = FleurReading(value=None, rule=None, error=f"the answer did not end within {limit}: {raw[i]!r}")
            else:
                text, char_steps = char_steps_from_prefixes(self.judge.prefix_texts(toks))
                reading = check_digit_tokens(parse_fleur_answer(text, char_steps), toks, self.digit_ids)
                if self.digit_search == "release":
                    digit_of = {t: d for d, t in enumerate(self.digit_ids)}
                    reading = release_token_search(reading, [digit_of.get(int(t)) for t in toks])
            readings[i] = reading
            error[i] = SampleError.of(reading.error, i, kind="judge_unreadable")
            if reading.ok:
                assert logits is not None  # kept (keep_logits=True)
                read = torch.stack([logits[t] for t in reading.steps])
                probs[i, : len(reading.steps)] = digit_probabilities(read, self.digit_ids).float().cpu()
        return FLEURPlan(candidates, prompts, prompt_ids, visuals, image_index, tokens, raw, readings, error, probs)

    # ------------------------------------------------------------------------- the differentiable pass
    def teacher_forcing(self, plan: FLEURPlan):
        """Inputs of the teacher-forced pass over the scored rows of ``plan`` (prompt + greedy answer up
        to the last read digit), as `TeacherForcing`."""
        rows = plan.scored_rows
        if not rows:
            return None
        return self.judge.teacher_forcing_inputs(
            [cast(list[int], plan.prompt_ids[n]) for n in rows],  # a scored row was run, so encoded
            [plan.tokens[n] for n in rows],
            [plan.readings[n].steps for n in rows],
        )

    def differentiable_score(
        self,
        plan: FLEURPlan,
        pixel_values: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        inputs: Any = None,
    ) -> torch.Tensor:
        """FLEUR of ``plan``'s answers recomputed with autograd: (N,), NaN where there is no score.

        The greedy path (which tokens were written, where digits are read) is fixed by ``plan``; the
        digit distributions are recomputed in one teacher-forced pass from ``pixel_values``
        (U, 3, H, W; default: ``plan.visuals`` preprocessed) and ``inputs_embeds`` (the token
        embeddings of `teacher_forcing()`'s inputs, passed as ``inputs`` or recomputed; default:
        looked up). Gradients flow to both and through the logits.
        """
        n = len(plan.raw)
        rows = plan.scored_rows
        with torch.enable_grad():
            if pixel_values is None:
                pixel_values = self.judge.preprocess(plan.visuals)
            out = torch.full((n,), float("nan"), dtype=torch.float32, device=pixel_values.device)
            if not rows:
                return out
            inputs = inputs if inputs is not None else self.teacher_forcing(plan)
            features = self.judge.image_features(pixel_values)
            logits = self.judge.logits_at(inputs, features, [plan.image_index[r] for r in rows], text_embeds=inputs_embeds)
            probs = digit_probabilities(logits, self.digit_ids)
            scores = fleur_from_digit_probs(probs, [plan.readings[r].rule for r in rows])
            index = torch.tensor(rows, dtype=torch.long, device=out.device)
            return out.to(scores.dtype).index_put((index,), scores)

    # ------------------------------------------------------------------------------------- plumbing

    def _generate(
        self,
        prompts: Sequence[Sequence[str | Data]],
        visuals: Sequence[Image.Image],
        image_index: Sequence[int],
        rows: Sequence[int],
        max_new_tokens: int,
        keep_logits: bool,
        fit_to_context: bool = False,
    ) -> tuple[dict[int, tuple[list[int], list[int], bool, torch.Tensor | None]], list[str | None]]:
        """Greedy answers for ``rows`` in chunks of ``batch_size``, rows of one image kept together.

        Returns {row: (prompt ids, answer tokens, finished, {step: logits (V,)} of the digit steps or
        None)} and, per prompt, None or the reason a row was not run (too long for the context). A
        prompt must leave room for ``max_new_tokens`` tokens, or with ``fit_to_context`` for at least
        ``min(max_new_tokens, 16)`` (its budget is then cut to what fits).
        """
        judge = self.judge
        errors: list[str | None] = [None] * len(prompts)
        runs: dict[int, tuple[list[int], list[int], bool, dict[int, torch.Tensor] | None]] = {}
        order = sorted(rows, key=lambda r: (image_index[r], r))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            used = sorted({image_index[r] for r in chunk})
            slot = {u: k for k, u in enumerate(used)}
            with torch.inference_mode():
                features = judge.image_features(judge.preprocess([visuals[u] for u in used]))
            keep, budgets = [], []
            for r in chunk:
                try:
                    p = judge.encode_prompts([prompts[r]], int(features.shape[1]), names=[f"the prompt of candidates[{r}]"])[0]
                except ValueError as exc:  # a prompt the judge cannot run: this row only, named as the caller's
                    errors[r] = SampleError(r, "input", "", str(exc))
                    continue
                room = self.max_context - len(p)
                needed = min(max_new_tokens, 16) if fit_to_context else max_new_tokens
                if room < needed:
                    errors[r] = SampleError(r, "limit", "", (
                        f"the prompt has {len(p)} tokens; with max_new_tokens={needed} it exceeds the "
                        f"judge's context of {self.max_context} tokens (caption too long)"
                    ))
                else:
                    keep.append((r, p))
                    budgets.append(min(max_new_tokens, room))
            if not keep:
                continue
            state = judge.start(
                [p for _, p in keep],
                features,
                [slot[image_index[r]] for r, _ in keep],
                share_prefix=self.share_prefix,
                reserve=min(max(budgets), 16),  # the cache grows when an answer runs longer
            )
            out: GreedyOutput = judge.greedy(state, budgets, keep_logits=keep_logits, keep_tokens=self.digit_ids)
            for k, (r, p) in enumerate(keep):
                logits = out.logits[k] if out.logits is not None else None
                runs[r] = (p, out.tokens[k], out.finished[k], logits)
        return runs, errors
