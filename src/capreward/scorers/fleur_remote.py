"""FLEUR and RefFLEUR on any chat backend (an OpenAI-compatible server, or a local one), from top-logprobs.

A server does not hand out logits, only each generated token's top-k alternatives with their
log-probabilities (OpenAI and vLLM: k <= 20). :class:`RemoteFLEUR` asks the FLEUR prompt
(:func:`~capreward.judges.prompts.fleur_prompt`) greedily with ``top_logprobs=k``, reads the answer with
the same rules as the local scorer (:mod:`capreward.metrics.fleur`: which steps hold the decimals, the
"1.0" rule, unreadable answers get NaN and a reason) and takes p("0".."9") at those steps from the
alternatives. The digits are looked up as the greedy token's leading whitespace plus the digit, so a
tokenizer that writes ``" 8"`` is read at ``" 8"``, ``" 0"``, ...

Exactness (:func:`read_step`):

- When every digit the rule weighs (decimals: 1..9; "1.0": 0 and 1) is among the alternatives, the
  probabilities are the full-vocabulary ones, not renormalised, and the score equals the local FLEUR
  score (to float rounding; checked in the tests through a real server).
- Otherwise (k too small for the vocabulary) the score would be an expectation over part of the digits:
  by default (``tolerance=1e-6``) such a sample gets **NaN with the reason** unless its bound (below) is
  at most ``tolerance``; with ``tolerance=None`` the listed digits' probabilities are renormalised to sum
  to 1 (G-VEval's convention for top-k alternatives) and the unlisted ones count 0, an approximation
  kept for servers that cannot list every digit. ``result.bound[n]`` is a worst-case bound on its
  distance to the exact score, from
  the fact that an unlisted token is no more likely than the least likely listed one (top-k lists are
  sorted): at each read step with weights w, listed digit mass P and listed weighted mass Z, the
  renormalisation adds ``Z (1/P - 1)`` and the unlisted digits remove at most
  ``max(w unlisted) * M``, M = min(1 - listed mass, unlisted digits * least listed probability); the
  bound sums ``max`` of the two over the read steps. ``bound`` is 0 where the score is exact.

The answer must write one digit per token (as LLaMA/LLaVA tokenizers do); a tokenizer that writes
"85" as one token gives NaN with that reason (FLEUR is defined per digit).

Faithfulness to the release (``Yebin46/FLEUR``), which runs LLaVA-1.5 itself:

- the image is padded to a square in the processor's mean colour before it is sent
  (``tuple(int(x * 255) for x in image_mean)``, CLIP's mean by default, as LLaVA-1.5's ``expand2square``),
  so the server's resize and crop see the released input (``pad_to_square=False`` sends it as is);
- the prompt: the release renders LLaVA v1's conversation (system sentence, ``"USER: <image>\\n... ASSISTANT:"``).
  A server renders the chat with its own template, which we cannot control through the OpenAI API: vLLM's
  template for ``llava-hf/llava-1.5-*-hf`` has no system sentence, so by default the prompt differs from
  the release's by that sentence. With ``llava_v1_template=True`` each request carries
  :data:`~capreward.judges.prompts.LLAVA_V1_CHAT_TEMPLATE` in vLLM's ``chat_template`` field, and the
  server renders exactly the released prompt (vLLM's chat API is the one that takes images; its
  completions API takes no image, so the raw prompt goes through the template). OpenAI rejects the field.
- ``max_tokens`` 512 and greedy decoding, as released; an answer is read once it has ended.
- the release's token search for the decimals (``digit_search="release"``) as in the local scorer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from collections.abc import Sequence

import torch
from PIL import Image

from ..judges.caller_text import is_blank
from ..judges.images import mean_background, pad_to_square
from ..errors import SampleError, kind_of
from ..judges.injection import injection_reasons
from ..judges.prompts import FLEUR_EXPLAIN_PROMPT, LLAVA_V1_CHAT_TEMPLATE, fleur_prompt
from ..judges.protocol import (
    ChatRequest,
    ChatResponse,
    JudgeBackend,
    NextTokenQuery,
    NextTokenScorer,
    TokenLogprob,
    answer_problem,
    assistant_turn,
    scores_next_tokens,
    user_turn,
)
from ..metrics.fleur import (
    DIGIT_SEARCHES,
    ONE,
    ONE_DECIMAL,
    TWO_DECIMALS,
    FleurReading,
    char_steps_from_prefixes,
    fleur_from_digit_probs,
    parse_fleur_answer,
    raw_scores,
    release_token_search,
)
from ..metrics.logprobs import listed_probabilities
from .fleur import FLEURResult, FLEURScores, judge_visuals
from .remote_numbers import check_tolerance
from .validation import caption_list, check_references

DIGITS = tuple(str(d) for d in range(10))
#: CLIP's image mean (LLaVA-1.5's vision tower), whose truncated 0-255 values pad images: (122, 116, 104).
CLIP_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)


def rule_weights(rule: str) -> torch.Tensor:
    """(2, 10) float64: the weight FLEUR gives p(d) at the first and second read step under ``rule``
    (read off :func:`~capreward.metrics.fleur.fleur_from_digit_probs`, so both scorers share one
    definition)."""
    basis = torch.zeros(20, 2, 10, dtype=torch.float64)
    basis.view(20, 20)[torch.arange(20), torch.arange(20)] = 1.0
    return fleur_from_digit_probs(basis, [rule] * 20).view(2, 10)


_WEIGHTS = {rule: rule_weights(rule) for rule in (ONE_DECIMAL, TWO_DECIMALS, ONE)}


# ------------------------------------------------------------------------------------- pure math
def read_answer(tokens: Sequence[TokenLogprob]) -> FleurReading:
    """Where FLEUR reads a greedy answer given as generated tokens (their texts): the local scorer's
    rules (:func:`~capreward.metrics.fleur.parse_fleur_answer`), plus the check that each read step's
    token is the digit alone (whitespace before it allowed). Returns a :class:`FleurReading`."""
    if not tokens:
        return FleurReading(value=None, rule=None, error="the answer has no tokens (the backend reported no logprobs)")
    prefixes, text = [], ""
    for t in tokens:
        text += t.token
        prefixes.append(text)
    text, char_steps = char_steps_from_prefixes(prefixes)
    reading = parse_fleur_answer(text, char_steps)
    if not reading.ok:
        return reading
    for step, digit in zip(reading.steps, reading.digits):
        token = tokens[step].token
        if token.strip() != str(digit) or token[:-1].strip():
            return FleurReading(
                value=reading.value,
                rule=None,
                error=f"digit {digit} at step {step} comes in the token {token!r}; FLEUR needs one token per digit",
            )
    return reading


@dataclass(frozen=True)
class StepRead:
    """p("0".."9") at one read step: ``probs`` (10,) float64 as used in the score (renormalised when
    not ``exact``), NaN for digits not among the alternatives; ``exact``: every weighted digit was
    listed; ``bound``: worst-case |contribution - exact contribution| (0 when exact)."""

    probs: torch.Tensor
    exact: bool
    bound: float
    listed: int


def read_step(token: TokenLogprob, weights: torch.Tensor) -> StepRead:
    """The digit probabilities at a read step from the token's top alternatives (see the module
    docstring for the exact and renormalised cases and the bound). ``weights`` (10,) are the rule's
    weights at this step. Raises ValueError when no digit is listed at all, and
    :class:`~capreward.metrics.logprobs.MalformedAnswer` (a ValueError) when the alternatives are no
    distribution's (:func:`~capreward.metrics.logprobs.listed_probabilities`)."""
    lead = token.token[:-1]  # the whitespace written before the digit
    top = dict(listed_probabilities(token.top.items(), f"the alternatives of the token {token.token!r}"))
    listed = {d: top[lead + s] for d, s in enumerate(DIGITS) if lead + s in top}
    if not listed:
        raise ValueError(f"no digit among the {len(token.top)} alternatives of the token {token.token!r}")
    probs = torch.full((10,), float("nan"), dtype=torch.float64)
    for d, p in listed.items():
        probs[d] = p
    missing = [d for d in range(10) if d not in listed]
    if all(weights[d] == 0 for d in missing):
        return StepRead(probs, True, 0.0, len(listed))
    mass = sum(listed.values())
    weighted = sum(float(weights[d]) * p for d, p in listed.items())
    all_listed = list(top.values())
    unlisted = min(max(0.0, 1.0 - sum(all_listed)), len(missing) * min(all_listed))
    added = weighted * (1.0 / mass - 1.0)
    removed = max(float(weights[d]) for d in missing) * unlisted
    return StepRead(probs / mass, False, max(added, removed), len(listed))


# ------------------------------------------------------------------------------------------ scorer
@dataclass
class RemoteFLEURResult(FLEURResult):
    """:class:`~capreward.scorers.fleur.FLEURResult` plus how exact each score is.

    - ``exact``: per sample, True when every weighted digit was among the alternatives at every read
      step (the score then equals the local FLEUR score); False where renormalised or not scored.
    - ``bound``: (N,) worst-case |score - exact FLEUR score|; 0 where exact, NaN where no score.
    - ``responses``: the backend's raw :class:`~capreward.judges.protocol.ChatResponse` per sample (None
      where no request was sent).
    """

    exact: list[bool] = field(default_factory=list)
    bound: torch.Tensor | None = None
    responses: list[ChatResponse | None] = field(default_factory=list)


class RemoteFLEUR(FLEURScores):
    """FLEUR / RefFLEUR on a `JudgeBackend` (e.g.
    `OpenAIJudge`).

    Args:
        backend: the judge (a `JudgeBackend`).
        top_logprobs: alternatives asked per token (20, the most OpenAI and vLLM give).
        max_tokens: budget of the greedy answer (512, the release's; None sends no limit; an unfinished
            answer has no score).
        explain_max_tokens: budget of an explanation (:meth:`explain`).
        pad_to_square: pad images to a square in ``image_mean`` before sending them, as LLaVA-1.5 does.
        image_mean: the padding colour (CLIP's mean, LLaVA-1.5's).
        llava_v1_template: send the LLaVA v1 chat template with each request (vLLM's ``chat_template``
            field) so the server renders the released prompt exactly.
        digit_search: ``"step"`` or ``"release"`` (see `capreward.scorers.fleur`).
        tolerance: the largest worst-case distance to the exact FLEUR score a sample may carry when some
            weighted digits are not among the alternatives (default 1e-6: exact or NaN with the reason);
            None keeps the renormalised approximation whatever its bound.

    Examples:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward import FLEUR, RemoteFLEUR
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.testing import tiny_judge_dir
        >>> backend = LocalChatJudge(str(tiny_judge_dir()))  # any JudgeBackend; OpenAIJudge(url, model) for a server
        >>> r = RemoteFLEUR(backend, max_tokens=None).score(["a red car", "a yellow box"], [red, red])
        >>> bool(r.score[0] > r.score[1]), r.exact       # every weighted digit was among the top-20 alternatives
        (True, [True, True])
    """

    name = "FLEUR"

    def __init__(
        self,
        backend: JudgeBackend,
        *,
        top_logprobs: int = 20,
        max_tokens: int | None = 512,
        explain_max_tokens: int = 256,
        pad_to_square: bool = True,
        image_mean: Sequence[float] = CLIP_IMAGE_MEAN,
        llava_v1_template: bool = False,
        digit_search: str = "step",
        tolerance: float | None = 1e-6,
    ):
        if not 1 <= top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [1, 20], got {top_logprobs}")
        if digit_search not in DIGIT_SEARCHES:
            raise ValueError(f"digit_search must be one of {DIGIT_SEARCHES}, got {digit_search!r}")
        self.pad_to_square = bool(pad_to_square)
        self.background = mean_background(image_mean)
        self.chat_template = LLAVA_V1_CHAT_TEMPLATE if llava_v1_template else None
        self.digit_search = digit_search
        self.tolerance = None if tolerance is None else check_tolerance(tolerance)
        self.backend = backend
        self.top_logprobs = int(top_logprobs)
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self.explain_max_tokens = int(explain_max_tokens)

    def requests(
        self, candidates: Sequence[str], visuals: Sequence[Image.Image], references: list[list[str]] | None = None
    ) -> list[ChatRequest]:
        """The greedy FLEUR (RefFLEUR with references) request of each candidate about ``visuals[n]``."""
        return [
            ChatRequest(
                turns=(user_turn(fleur_prompt(c, references[n] if references is not None else None), [visuals[n]]),),
                max_tokens=self.max_tokens,
                temperature=0.0,
                top_logprobs=self.top_logprobs,
                chat_template=self.chat_template,
            )
            for n, c in enumerate(candidates)
        ]

    def score(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        references: Sequence[Sequence[str] | str] | None = None,
        *,
        videos: Sequence[Any] | None = None,
    ) -> RemoteFLEURResult:
        """Score each candidate against its image (or video, on its three-frame composite) and, for
        RefFLEUR, its references.

        Args:
            candidates: the captions.
            images: one image per candidate.
            references: per candidate, a caption or a list of captions (RefFLEUR), or None.
            videos: one video per candidate instead of ``images``.

        Returns:
            A `RemoteFLEURResult`: ``score`` (N,) in [0, 1], NaN with a reason in ``error`` for empty
            captions, failed requests and unreadable answers; ``exact`` and ``bound`` per sample.

        Raises:
            ValueError: an unusable input, naming the item (``MediaError``, a ValueError, for a visual
                that cannot be read).
            TypeError: an input of the wrong type, naming the item.
        """
        n, sent, requests = self._score_requests(candidates, images, references, videos)
        result = self.read(_placed(n, sent, self.backend.generate(requests)), _placed(n, sent, requests))
        result.injection = injection_reasons(caption_list(candidates))
        return result

    def _score_requests(self, candidates, images, references, videos) -> tuple[int, list[int], list[ChatRequest]]:
        """The number of candidates, the positions of the non-empty ones and their requests (in order)."""
        candidates, refs, visuals = self._inputs(candidates, images, references, videos)
        sent = [n for n, c in enumerate(candidates) if not is_blank(c)]  # "<s></s>" is an empty caption
        requests = self.requests([candidates[n] for n in sent], [visuals[n] for n in sent], [refs[n] for n in sent] if refs else None)
        return len(candidates), sent, requests

    def read(self, responses: Sequence[ChatResponse | None],
             requests: Sequence[ChatRequest | None] | None = None) -> RemoteFLEURResult:
        """The result for the backend's answers (None: an empty caption, not sent).

        Args:
            responses: per candidate, the backend's answer (None: not sent).
            requests: per candidate, the request answered; with them, on a backend that scores next
                tokens (:class:`~capreward.judges.protocol.NextTokenScorer`), every read step whose
                alternatives miss a weighted digit is read exactly: the ten digits' log-probabilities at
                that step, one request per candidate (:meth:`exact_steps`).

        Returns:
            The `RemoteFLEURResult`.
        """
        n = len(responses)
        probs = torch.full((n, 2, 10), float("nan"), dtype=torch.float64)
        bound = torch.full((n,), float("nan"), dtype=torch.float64)
        readings, raw, exact = [], [], []
        errors: list[str | None] = []
        pending: list[tuple[int, int, int]] = []  # (sample, read step j, token index) to read exactly
        for i, response in enumerate(responses):
            reading, err = self._reading(response)
            if reading.ok:
                assert response is not None  # an answer was read
                weights = _WEIGHTS[cast(str, reading.rule)]
                try:
                    steps = [read_step(response.tokens[s], weights[j]) for j, s in enumerate(reading.steps)]
                except ValueError as exc:
                    reading, err = FleurReading(value=reading.value, rule=None, error=str(exc)), SampleError(i, "judge_unreadable", "", str(exc))
                else:
                    for j, step in enumerate(steps):
                        probs[i, j] = step.probs
                        if not step.exact:
                            pending.append((i, j, reading.steps[j]))
                    bound[i] = sum(step.bound for step in steps)
            readings.append(reading)
            errors.append(SampleError.of(err, i, kind="judge_unreadable"))
            raw.append(response.text if response is not None else "")
            exact.append(bool(reading.ok and bound[i] == 0))
        if pending and requests is not None and scores_next_tokens(self.backend):
            for i, why in self.exact_steps(responses, requests, pending, probs).items():
                if why is None:
                    bound[i], exact[i] = 0.0, True
                else:
                    readings[i] = FleurReading(value=readings[i].value, rule=None, error=why)
                    errors[i] = SampleError(i, kind_of(why, "judge_unreadable"), "", why)
        rules = [r.rule for r in readings]
        score = fleur_from_digit_probs(torch.nan_to_num(probs), rules).float()
        if self.tolerance is not None:
            for i in range(n):
                if readings[i].ok and bound[i] > self.tolerance:
                    score[i] = float("nan")
                    errors[i] = SampleError(i, "judge_unreadable", "", (
                        f"digits the score weighs are missing from the top-{self.top_logprobs} alternatives: "
                        f"the score could be off by up to {float(bound[i]):.3g} (tolerance {self.tolerance:g}; "
                        "serve more logprobs, or tolerance=None for the renormalised approximation)"))
        return RemoteFLEURResult(
            score=score,
            raw_score=raw_scores(readings),
            raw=raw,
            error=errors,
            rule=rules,
            digit_probs=probs.float(),
            exact=exact,
            bound=bound.float(),
            responses=list(responses),
        )

    async def ascore(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        references: Sequence[Sequence[str] | str] | None = None,
        *,
        videos: Sequence[Any] | None = None,
    ) -> RemoteFLEURResult:
        """`score()`, awaitable (the requests run concurrently on a remote backend).

        Args:
            candidates: as for `score()`.
            images: as for `score()`.
            references: as for `score()`.
            videos: as for `score()`.

        Returns:
            The `RemoteFLEURResult`.
        """
        n, sent, requests = self._score_requests(candidates, images, references, videos)
        result = self.read(_placed(n, sent, await self.backend.agenerate(requests)), _placed(n, sent, requests))
        result.injection = injection_reasons(caption_list(candidates))
        return result

    def explain(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        references: Sequence[Sequence[str] | str] | None = None,
        scores: Sequence[float] | torch.Tensor | None = None,
        *,
        videos: Sequence[Any] | None = None,
    ) -> list[ChatResponse]:
        """The judge's explanation of each score: the FLEUR prompt, the score (``str(float(score))``;
        without ``scores`` they are computed first, and an unscored sample keeps its raw answer) as the
        assistant's answer, then "Why? Tell me the reason.".

        Args:
            candidates: as for `score()`.
            images: as for `score()`.
            references: as for `score()`.
            scores: the scores to explain (None: computed first).
            videos: as for `score()`.

        Returns:
            One response per candidate (its ``error`` set where the request failed)."""
        candidates, refs, visuals = self._inputs(candidates, images, references, videos)
        first = self._first_turns(candidates, images, references, scores, videos)
        requests = [
            ChatRequest(
                turns=(
                    user_turn(fleur_prompt(c, refs[n] if refs is not None else None), [visuals[n]]),
                    assistant_turn(first[n]),
                    user_turn(FLEUR_EXPLAIN_PROMPT),
                ),
                max_tokens=self.explain_max_tokens,
                chat_template=self.chat_template,
            )
            for n, c in enumerate(candidates)
        ]
        return self.backend.generate(requests)

    def exact_steps(self, responses: Sequence[ChatResponse | None], requests: Sequence[ChatRequest | None],
                    steps: Sequence[tuple[int, int, int]], probs: torch.Tensor) -> dict[int, str | None]:
        """Read read steps exactly on a backend that scores next tokens: for each ``(sample, j, token
        index)``, the log-probabilities of the ten digit tokens (after the whitespace the step's token starts
        with) once the answer before that token is written; ``probs[sample, j]`` gets them. A sample's
        steps go to the server in one request.

        Args:
            responses: the greedy answers.
            requests: the requests they answer.
            steps: what to read.
            probs: (N, 2, 10) filled in place.

        Returns:
            Per sample asked, None when every step was read, else why not.
        """
        from .remote_numbers import lead_digit_ids

        backend = cast(NextTokenScorer, self.backend)  # the caller checked scores_next_tokens
        queries, where = [], []
        out: dict[int, str | None] = {}
        for i, j, s in steps:
            tokens = cast(ChatResponse, responses[i]).tokens  # a pending step was read from its answer
            try:
                ids = lead_digit_ids(backend.tokenizer, tokens[s].token[:-1])
            except ValueError as exc:
                out[i] = f"the served tokenizer: {exc}"
                continue
            queries.append(NextTokenQuery(cast(ChatRequest, requests[i]), "".join(t.token for t in tokens[:s]), tuple(ids), group=i))
            where.append((i, j))
        answers = backend.next_token_logprobs(queries) if queries else []
        for (i, j), answer in zip(where, answers):
            if not answer.ok:
                out[i] = out.get(i) or f"judge request failed: {answer.error}"
                continue
            probs[i, j] = torch.tensor(answer.probabilities(), dtype=torch.float64)
            out.setdefault(i, None)
        return out

    # ---------------------------------------------------------------------------------- plumbing
    def _reading(self, response: ChatResponse | None) -> tuple[FleurReading, str | None]:
        if response is None:
            error = SampleError(None, "input", "", "empty caption")
        elif response.error is not None:
            error = SampleError(None, kind_of(response.error, "judge_unavailable"), "", f"judge request failed: {response.error}")
        elif response.finish_reason == "length":
            error = SampleError(None, "judge_unreadable", "",
                                f"the answer did not end within max_tokens={self.max_tokens} tokens: {response.text!r}")
        elif (problem := answer_problem(response, self.max_tokens)) is not None:
            error = SampleError(None, "judge_unreadable", "", f"malformed answer: {problem}")
        else:
            reading = read_answer(response.tokens)
            if self.digit_search == "release":
                reading = release_token_search(reading, [_digit_of(t.token) for t in response.tokens])
            return reading, reading.error
        return FleurReading(value=None, rule=None, error=error), error

    def _inputs(self, candidates, images, references, videos) -> tuple[list[str], list[list[str]] | None, list[Image.Image]]:
        candidates = caption_list(candidates)
        refs = check_references(references, len(candidates))
        visuals, index = judge_visuals(images, videos, len(candidates))
        if self.pad_to_square:
            visuals = [pad_to_square(v, self.background) for v in visuals]
        return candidates, refs, [visuals[k] for k in index]


def _digit_of(token: str) -> int | None:
    """The digit a token is (whitespace before it allowed, as LLaMA's "▁8"), else None."""
    stripped = token.strip()
    return int(stripped) if len(stripped) == 1 and stripped in DIGITS and not token[:-1].strip() else None


_T = TypeVar("_T")


def _placed(n: int, sent: list[int], answers: Sequence[_T]) -> list[_T | None]:
    """One entry per candidate: the answer to each sent request at its candidate's position, None for
    the candidates not sent. Raises RuntimeError when the backend did not answer every request."""
    if len(answers) != len(sent):
        raise RuntimeError(f"the backend answered {len(answers)} of {len(sent)} requests")
    responses: list[_T | None] = [None] * n
    for position, answer in zip(sent, answers):
        responses[position] = answer
    return responses


def load_visuals(images: Sequence[Any] | None, videos: Sequence[Any] | None, n: int) -> list[Image.Image]:
    """One RGB image per sample (three-frame composites for videos), shared between samples with the
    same object or content; see :func:`~capreward.scorers.fleur.judge_visuals` for the errors."""
    visuals, index = judge_visuals(images, videos, n)
    return [visuals[k] for k in index]
