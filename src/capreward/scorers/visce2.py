"""VisCE²: a VLM writes a visual context for each image, then rates each caption 0-100 given it.

Maeda et al., "Vision Language Model-based Caption Evaluation Method Leveraging Visual Context
Extraction" (2024). Stage 1 asks the judge for the image's objects, their features and relationships
(:data:`~capreward.judges.vlm_prompts.VISCE2_CONTEXT_PROMPT`), once per distinct image; the answer is
cached in memory and, with ``cache_dir``, on disk, keyed by the image's pixels, the backend's model name
, :data:`~capreward.judges.vlm_prompts.VISCE2_PROMPT_VERSION` and the stage-1 generation settings.
Stage 2 asks for the rating (the released head's prompt, or the named earlier variant ``"visce"``); the
score is the first ASCII integer of the answer, 0 (with the reason in ``error``) when there is none, and
returned as is, flagged in ``error``, when it is above 100 - as the released code reads it. With
``expected=True`` the expected score Σ n·p(n) over 0..100 is also read at the first number: exactly on a
local judge; on a server, from the renormalised alternatives when its tokenizer writes the number as one
token, from an exact digit tree of assistant-prefilled requests when it writes digits one by one, else NaN
with the reason (:mod:`capreward.scorers.remote_numbers`).

Generation: the release samples (``do_sample=True``, temperature 0.2) with ``max_new_tokens=1024`` in both
stages. We keep its 1024-token budgets but decode greedily by default, so a reward is deterministic;
:meth:`VisCE2.released` (or ``temperature=0.2``) gives the release's sampled settings.

Works with any :class:`~capreward.judges.protocol.JudgeBackend`. A failed request never shifts other
samples: its sample gets score NaN and the backend's reason.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

from ..errors import SampleError, kind_of
from ..judges.caller_text import is_blank
from ..judges.injection import injection_reasons
from ..judges.protocol import ChatRequest, JudgeBackend, user_turn
from ..judges.vlm_prompts import VISCE2_CONTEXT_PROMPT, VISCE2_PROMPT_VERSION, VISCE2_RATING_VARIANTS, visce2_prompt
from ..media import MediaError, load_image, media_key
from ..media.keys import hash_bytes
from ..metrics.gveval import expected_score
from ..metrics.visce2 import ANSWER_REGEX, first_integer, parse_visce2_answer
from .contract import Scores, floats
from .remote_numbers import DEFAULT_TOLERANCE, TREE_TOP_LOGPROBS, check_tolerance
from .vlm_common import score_distributions

log = logging.getLogger(__name__)


@dataclass
class VisCE2Result:
    """Per-sample VisCE² results for N candidates.

    - ``score``: (N,) float64: the first integer of the answer, normally in [0, 100]; 0 when the answer
      has none; the integer as written when it is above 100 (the release's behaviour; ``error`` flags
      both); NaN when the sample could not be run (bad image, backend failure).
    - ``context``: the visual context used for each sample ("" when there is none).
    - ``raw``: the rating answers as text ("" when not run).
    - ``error``: None, or why the score is 0, NaN or above 100.
    - ``expected``: with ``expected=True``, (N,) expected scores in [0, 100] from the token distribution
      (NaN where unavailable; ``expected_error`` says why); else None.
    - ``injection``: per sample, None or why the caption looks like forged prompt structure
      (:func:`~capreward.judges.injection.injection_reason`); reported only, the score is the metric's.
    """

    score: np.ndarray
    context: list[str]
    raw: list[str]
    error: list[str | None]
    expected: np.ndarray | None = None
    expected_error: list[str | None] | None = None
    injection: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.raw)


#: Visual contexts kept in memory by default (a context is a few hundred to a few thousand characters).
DEFAULT_CONTEXT_CACHE_SIZE = 1024


class ContextCache:
    """Visual contexts by key: the ``max_entries`` most recently used in memory (least recently used
    evicted first; 0 keeps none), and optionally all of them as JSON files under ``directory`` (the disk
    cache is not bounded: it is the operator's folder)."""

    def __init__(self, directory: str | os.PathLike | None = None, max_entries: int = DEFAULT_CONTEXT_CACHE_SIZE):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
            raise ValueError(f"context cache size must be a non-negative int, got {max_entries!r}")
        self.max_entries = max_entries
        self.memory: OrderedDict[str, str] = OrderedDict()
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return len(self.memory)

    def _remember(self, key: str, context: str) -> None:
        self.memory[key] = context
        self.memory.move_to_end(key)
        while len(self.memory) > self.max_entries:
            self.memory.popitem(last=False)

    def _path(self, key: str) -> Path:
        return self.directory / f"{hash_bytes(key.encode())}.json"  # type: ignore[operator]

    def get(self, key: str) -> str | None:
        if key in self.memory:
            self.memory.move_to_end(key)
            return self.memory[key]
        if self.directory is not None:
            path = self._path(key)
            if path.exists():
                try:
                    entry = json.loads(path.read_text())
                except (OSError, ValueError) as exc:
                    log.warning("ignoring unreadable visual-context cache file %s: %s", path, exc)
                    return None
                if entry.get("key") == key:
                    self._remember(key, entry["context"])
                    return entry["context"]
        return None

    def put(self, key: str, context: str) -> None:
        self._remember(key, context)
        if self.directory is not None:
            path = self._path(key)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": key, "context": context}))
            os.replace(tmp, path)


class VisCE2:
    """VisCE² on any chat judge backend.

    Args:
        backend: a `JudgeBackend` (a `LocalChatJudge`, a remote server backend, ...).
        expected: also compute the expected score from the token distribution.
        cache_dir: keep every visual context on disk too.
        context_cache_size: visual contexts kept in memory (the most recently used; default
            `DEFAULT_CONTEXT_CACHE_SIZE`, 0 for none), so a long run does not grow without bound.
        context_max_tokens: generation budget of the visual context (1024, the release's
            ``max_new_tokens``, so a five-object context is not cut off; generation stops at the end of
            the answer, so short answers cost no more).
        max_tokens: generation budget of the rating (1024, as released).
        temperature: 0 (default) decodes greedily, deterministic for rewards; the release samples at 0.2
            (see `released()`).
        prompt: the rating prompt variant, ``"visce_2"`` (the released head's, default) or ``"visce"``
            (the earlier commit's; `VISCE2_RATING_VARIANTS`).
        top_logprobs: alternatives asked of non-local backends for the expected score (vLLM and OpenAI
            allow up to 20).
        tolerance: on a server whose tokenizer writes numbers digit by digit, the expected score comes
            from an exact digit tree of assistant-prefilled requests (`capreward.scorers.remote_numbers`);
            one whose bound (score points) is above ``tolerance`` is NaN with the reason.
        tree_top_logprobs: the alternatives each node of the tree asks (20; a node is exact when all ten
            digits are listed, so serve more with vLLM's ``--max-logprobs`` and raise this and
            `OpenAIJudge`'s ``top_logprobs_cap`` together).
        structured: constrain the rating to start with an integer 0..100 as its first number (vLLM's
            ``structured_outputs={"regex": ...}``, `ANSWER_REGEX`); local judges ignore it.

    Formula: the score is the first integer of the rating answer (normally in [0, 100]); the expected
    score is ``sum_k k * p(k)`` over the judge's distribution of that integer.

    Examples:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward import VisCE2
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_vlm_judge
        >>> visce2 = VisCE2(backend=LocalChatJudge(tiny_vlm_judge()))  # OpenAIJudge(url, model) for a server
        >>> r = visce2.score(["a red square", "a blue square"], [red, red])
        >>> [bool(0 <= s <= 100) for s in r.score], r.error
        ([True, True], [None, None])
    """

    #: The released generation settings (``src/models/llava_v15.py`` at the head): sampled at
    #: temperature 0.2, 1024 new tokens in both stages.
    RELEASE_SETTINGS = {"temperature": 0.2, "context_max_tokens": 1024, "max_tokens": 1024}

    def __init__(
        self,
        backend: JudgeBackend,
        *,
        expected: bool = False,
        cache_dir: str | os.PathLike | None = None,
        context_cache_size: int = DEFAULT_CONTEXT_CACHE_SIZE,
        context_max_tokens: int = 1024,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        prompt: str = "visce_2",
        top_logprobs: int = 20,
        tolerance: float = DEFAULT_TOLERANCE,
        tree_top_logprobs: int = TREE_TOP_LOGPROBS,
        structured: bool = False,
    ):
        if prompt not in VISCE2_RATING_VARIANTS:
            raise ValueError(f"prompt must be one of {sorted(VISCE2_RATING_VARIANTS)}, got {prompt!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {temperature}")
        self.backend = backend
        self.temperature = float(temperature)
        self.prompt = prompt
        self.expected = expected
        self.cache = ContextCache(cache_dir, max_entries=context_cache_size)
        self.context_max_tokens = context_max_tokens
        self.max_tokens = max_tokens
        self.top_logprobs = top_logprobs
        self.tolerance = check_tolerance(tolerance)
        if tree_top_logprobs < 10:
            raise ValueError(f"tree_top_logprobs must be at least 10 (the digits), got {tree_top_logprobs}")
        self.tree_top_logprobs = int(tree_top_logprobs)
        self.structured = bool(structured)

    @classmethod
    def released(cls, backend: JudgeBackend, **kwargs: Any) -> VisCE2:
        """VisCE² with the release's generation settings (`RELEASE_SETTINGS`: sampled at
        temperature 0.2, 1024 new tokens per stage); scores then vary from call to call, as the release's
        do. Other options go in ``kwargs``."""
        return cls(backend, **{**cls.RELEASE_SETTINGS, **kwargs})

    def context_key(self, image_key: str) -> str:
        """The cache key of an image's visual context: pixels, model name, prompt version and the
        stage-1 generation settings (a context cut at a smaller budget is not reused)."""
        settings = f"max{self.context_max_tokens}-t{self.temperature:g}"
        return f"{image_key}|{self.backend.name}|{VISCE2_PROMPT_VERSION}|{settings}"

    def contexts(self, images: Sequence[Any], image_ids: Sequence[str] | None = None) -> tuple[list[str | None], list[str | None]]:
        """Visual contexts for ``images`` (one per item, generated once per distinct image).

        Args:
            images: the images.
            image_ids: cache ids of the images (None: keyed by content).

        Returns:
            ``(contexts, errors)``: a context None where its image or request failed, and then its
            :class:`~capreward.errors.SampleError`.
        """
        contexts, errors, _ = self._contexts(images, image_ids)
        return contexts, errors

    def _contexts(self, images: Sequence[Any], image_ids: Sequence[str] | None):
        contexts: list[str | None] = [None] * len(images)
        errors: list[str | None] = [None] * len(images)
        pil: dict[str, Any] = {}
        keys: list[str | None] = []
        for i, item in enumerate(images):
            try:
                image = load_image(item, i)
            except MediaError as exc:
                errors[i] = SampleError.from_exception(exc, i)
                keys.append(None)
                continue
            explicit = image_ids[i] if image_ids is not None else None
            key = self.context_key(media_key(image, explicit) or f"object:{id(item)}")
            pil.setdefault(key, image)
            keys.append(key)
        found: dict[str, str] = {}  # this call's contexts (the cache may evict some before the end of the call)
        for k in dict.fromkeys(k for k in keys if k is not None):
            if (context := self.cache.get(k)) is not None:
                found[k] = context
        missing = [k for k in dict.fromkeys(k for k in keys if k is not None) if k not in found]
        if missing:
            requests = [
                ChatRequest(
                    turns=(user_turn(VISCE2_CONTEXT_PROMPT, [pil[k]]),),
                    max_tokens=self.context_max_tokens,
                    temperature=self.temperature,
                )
                for k in missing
            ]
            failed: dict[str, SampleError] = {}
            for key, response in zip(missing, self.backend.generate(requests)):
                if response.ok:
                    if response.finish_reason == "length":
                        log.warning("VisCE² visual context cut at context_max_tokens=%d tokens", self.context_max_tokens)
                    self.cache.put(key, response.text)
                    found[key] = response.text
                else:
                    failed[key] = SampleError(None, kind_of(response.error, "judge_unavailable"), "",
                                              f"visual context failed: {response.error}")
                    log.warning("VisCE² visual context failed: %s", response.error)
        else:
            failed = {}
        for i, context_key in enumerate(keys):
            if context_key is None:
                continue
            if context_key in failed:
                errors[i] = failed[context_key].renamed(i)
            else:
                contexts[i] = found[context_key]
        row_images = [pil[k] if k is not None else None for k in keys]
        return contexts, errors, row_images

    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None) -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`; images only, no references): the
        score in [0, 100] (a first integer above 100, which :meth:`score` keeps as the release does, has no
        score here: NaN with the scorer's reason), ``raw``, ``context``, ``parsed`` (the integer the answer
        wrote, NaN when none) and, with ``expected=True``, ``expected`` (its reasons where it is NaN)."""
        if videos is not None or images is None:
            raise ValueError("VisCE² scores images only")
        ids = list(visual_ids) if visual_ids is not None and all(visual_ids) else None
        res = self.score(list(captions), images, image_ids=ids)
        n = len(res.raw)
        score = [v if 0 <= v <= 100 else math.nan for v in floats(res.score, n)]
        parsed = [float(found[0]) if r and (found := first_integer(r)) is not None else math.nan for r in res.raw]
        subs: dict[str, list] = {"raw": list(res.raw), "context": list(res.context), "parsed": parsed}
        reasons: dict[str, list] = {}
        if res.expected is not None:
            subs["expected"] = floats(res.expected, n)
            reasons["expected"] = [e or r for e, r in zip(res.expected_error or [None] * n, res.error)]
        return Scores(score=score, sub_scores=subs, errors=list(res.error), reasons=reasons, result=res)

    def score(self, candidates: Sequence[str], images: Sequence[Any], *, image_ids: Sequence[str] | None = None) -> VisCE2Result:
        """Score each ``candidates[n]`` against ``images[n]``.

        Args:
            candidates: the captions.
            images: one image per candidate (paths, PIL images, arrays or tensors).
            image_ids: cache ids of the images' visual contexts (None: keyed by content).

        Returns:
            A `VisCE2Result`: ``score`` (N,) (the first integer of the answer, normally in [0, 100]),
            ``context``, ``raw``, ``error`` (why a score is 0, NaN or above 100) and, with
            ``expected=True``, ``expected``.

        Raises:
            ValueError: the numbers of candidates and images differ.
        """
        candidates = list(candidates)
        if len(images) != len(candidates):
            raise ValueError(f"{len(candidates)} candidates but {len(images)} images")
        if image_ids is not None and len(image_ids) != len(candidates):
            raise ValueError(f"{len(candidates)} candidates but {len(image_ids)} image ids")
        for i, c in enumerate(candidates):
            if not isinstance(c, str):
                raise TypeError(f"candidate {i} is {type(c).__name__}, not a string")
        n = len(candidates)
        contexts, errors, row_images = self._contexts(images, image_ids)
        for i, c in enumerate(candidates):  # a judge would rate an empty caption: give no score instead
            if is_blank(c) and errors[i] is None:  # blank once special-token strings are removed too
                contexts[i], errors[i] = None, SampleError(i, "input", "", "empty caption")
        scores = np.full(n, np.nan)
        raw = [""] * n
        rows = [i for i in range(n) if contexts[i] is not None]
        top = self.top_logprobs if self.expected else 0
        requests = [
            ChatRequest(
                turns=(user_turn(visce2_prompt(candidates[i], contexts[i], self.prompt), [row_images[i]]),),
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                top_logprobs=top,
                structured_outputs={"regex": ANSWER_REGEX} if self.structured else None,
            )
            for i in rows
        ]
        responses = self.backend.generate(requests) if requests else []
        if len(responses) != len(requests):
            raise RuntimeError(f"the backend answered {len(responses)} of {len(requests)} requests")
        for i, response in zip(rows, responses):
            if not response.ok:
                errors[i] = SampleError(i, kind_of(response.error, "judge_unavailable"), "", f"rating failed: {response.error}")
                continue
            raw[i] = response.text
            scores[i], errors[i] = parse_visce2_answer(response.text)
            errors[i] = SampleError.of(errors[i], i, kind="judge_unreadable")
        expected = expected_error = None
        if self.expected:
            expected = np.full(n, np.nan)
            expected_error = [e if contexts[i] is None else None for i, e in enumerate(errors)]
            probs, reasons = score_distributions(self.backend, requests, responses, [None] * len(rows),
                                                 tolerance=self.tolerance, tree_top_logprobs=self.tree_top_logprobs,
                                                 groups=list(rows))
            for i, response, p, why in zip(rows, responses, probs, reasons):
                if p is None:
                    kind = kind_of(response.error, "judge_unavailable") if not response.ok else "judge_unreadable"
                    expected_error[i] = SampleError.of(why, i, kind=kind)
                else:
                    expected[i] = expected_score(p)
        for i, e in enumerate(errors):
            if e is not None:
                log.info("VisCE² sample %d: %s", i, e)
        return VisCE2Result(
            score=scores,
            context=[c or "" for c in contexts],
            raw=raw,
            error=errors,
            expected=expected,
            expected_error=expected_error,
            injection=injection_reasons(candidates),
        )
