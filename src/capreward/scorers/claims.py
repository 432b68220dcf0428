"""Claim-level caption scoring: every claim of a caption verified against the visual, every reference
claim checked for coverage.

What it follows: **DCScore** (Ye et al., "Painting with Words: Elevating Detailed Image Captioning with
Benchmark and Alignment Learning", ICLR 2025) decomposes a caption into *primitive information units*,
checks each against the image for precision (the hallucination side) and matches the reference units
for recall (the coverage side), and reports an F-score; **FaithScore** (Jing et al., 2023) verifies the
*atomic facts* of a caption with a VLM and averages the verdicts. :class:`ClaimScorer` does the same
with one judge and one question per unit:

- **split**: the caption into atomic claims (default :func:`~capreward.scorers.claims_split.split_claims`,
  rule-based; ``splitter="judge"`` asks the judge to rewrite the caption as facts), deduplicated and
  bounded (``max_claims``);
- **verify**: each claim against the visual: the judge's probability of "yes" to
  :data:`~capreward.scorers.claims_prompts.VERIFY_TEMPLATE`, read at the first answer token (exact from
  the logits on a local judge; from the listed log-probabilities on a server);
- **cover**: each reference claim (split from the references, or from the judge's own inventory of the
  visual with ``inventory=True``) against what the caption's **verified** claims state (a claim the judge
  rejects conveys no fact): the probability of "yes" to
  :data:`~capreward.scorers.claims_prompts.COVERAGE_TEMPLATE` given those claims as one description
  (``coverage="judge"``), or the share of its content words stated by the best-matching verified claim
  (``coverage="lexical"``); 0 when no claim is verified;
- precision = 1 - the priced doubt of the claims not verified (:func:`claim_precision`), recall = mean
  coverage over the reference claims, score = F-beta of the two (``beta``; precision alone when there is
  no reference claim).

Where it differs from DCScore and FaithScore: the units come from a rule-based splitter by default
(theirs are written by GPT-4; a judge splitter is an option), verdicts are probabilities rather than
sampled yes/no answers (so the reward is smooth and deterministic), recall is asked per reference unit
against the caption's verified claims only (DCScore asks GPT-4 to match unit lists), and the scorer
counts claims past ``max_claims`` as unverified (so a caption cannot hide claims past the bound; raise
the bound for dense captions). CCCaption's completeness/correctness split is the same pair: ``recall`` / ``precision``.

Batched over a GRPO group: the distinct (visual, claim) pairs of all captions are verified in one
batched pass on a local judge: one visual prefix (system text, image, question up to the claim) is run
once per visual and chunk and its key/value cache shared by every claim
(:meth:`~capreward.judges.local.LocalJudge.start`); verdicts are cached by content (visual pixels,
judge, prompt version, claim text; hashed), so claims repeated across a group or across steps are asked
once. Caption text is data: on a local judge every message is encoded without special tokens, on a
server it is escaped (:mod:`~capreward.judges.caller_text`); a claim can never become an instruction.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, cast
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import SampleError, kind_of
from ..judges.caller_text import is_blank
from ..judges.injection import injection_reasons
from ..judges.local_chat import LocalChatJudge
from ..judges.protocol import (
    ChatRequest, ChatResponse, JudgeBackend, NextTokenQuery, NextTokenScorer, answer_problem, scores_next_tokens, user_turn,
)
from ..media import media_key
from ..metrics.logprobs import MalformedAnswer, listed_probabilities
from ..media.keys import hash_bytes
from .claims_prompts import CLAIMS_PROMPT_VERSION, INVENTORY_PROMPT, coverage_prompt, split_prompt, verify_prompt
from .claims_split import Claim, claims_of_references, lexical_coverage, split_claims
from .contract import Scores, floats
from .fleur import judge_visuals
from .validation import caption_list, check_references

log = logging.getLogger(__name__)

#: Verdicts kept in memory by default (a verdict is one float).
DEFAULT_CACHE_SIZE = 65536
SPLITTERS = ("rules", "judge")
COVERAGES = ("judge", "lexical")


# ------------------------------------------------------------------------------------- yes/no reading
def answer_token_ids(tokenizer: Any, word: str) -> list[int]:
    """Ids of every vocabulary token that reads as ``word`` (case and surrounding spaces ignored): the
    first token of each way the judge can start that answer."""
    out = []
    for piece, i in tokenizer.get_vocab().items():
        bare = piece.replace("▁", "").replace("Ġ", "").strip().lower()
        if bare != word:
            continue
        if tokenizer.decode([i]).strip().lower() == word:
            out.append(int(i))
    if not out:
        raise ValueError(f"the judge's tokenizer has no token that reads as {word!r}")
    return sorted(out)


@dataclass(frozen=True)
class YesNo:
    """A read yes/no answer: ``p_yes`` and ``p_no`` (probabilities of the first answer token), or
    ``error`` when there is no reading (failed request, no alternatives)."""

    p_yes: float = math.nan
    p_no: float = math.nan
    error: str | None = None

    def probability(self, normalise: bool, min_mass: float) -> tuple[float, str | None]:
        """P(yes) (normalised over yes+no when ``normalise``), or 0 with the reason when the judge put
        less than ``min_mass`` on the two answers."""
        if self.error is not None:
            return math.nan, self.error
        mass = self.p_yes + self.p_no
        if mass < min_mass:
            return 0.0, f"the judge put {mass:.3g} on yes/no (below min_mass={min_mass:g}): counted as no"
        return (self.p_yes / mass if normalise else self.p_yes), None


def _word(text: str) -> str:
    return text.strip().strip(".,!:;\"'").lower()


def read_alternatives(response: ChatResponse) -> YesNo:
    """Yes/no probabilities from a server's first answer token: the summed probabilities of the listed
    alternatives that read as "yes" and as "no". A malformed answer
    (:func:`~capreward.judges.protocol.answer_problem`) has no reading, and the reason."""
    if not response.ok:
        return YesNo(error=SampleError.of(response.error, kind=kind_of(response.error, "judge_unavailable")))
    if not response.tokens:
        return YesNo(error=SampleError(None, "judge_unreadable", "", "the backend returned no token log-probabilities"))
    first = response.tokens[0]
    listed: Sequence[tuple[str, float]] = first.ranked or tuple(first.top.items()) or ((first.token, first.logprob),)
    problem = answer_problem(response)
    try:
        if problem is not None:
            raise MalformedAnswer(problem)
        listed = listed_probabilities(listed, "the first answer token's alternatives")
    except MalformedAnswer as exc:
        return YesNo(error=SampleError(None, "judge_unreadable", "", f"malformed answer: {exc}"))
    seen: set[str] = set()
    p = {"yes": 0.0, "no": 0.0}
    for text, prob in listed:
        if text in seen:  # one token listed twice: count it once
            continue
        seen.add(text)
        w = _word(text)
        if w in p:
            p[w] += prob
    if p["yes"] == 0.0 and p["no"] == 0.0:
        return YesNo(error=SampleError(None, "judge_unreadable", "",
                                       "neither yes nor no is among the listed alternatives of the first answer token"))
    return YesNo(p["yes"], p["no"])


class YesNoReader:
    """Reads P(yes)/P(no) of the first answer token for many requests on one backend.

    On a :class:`~capreward.judges.local_chat.LocalChatJudge` the probabilities are exact (a softmax
    over the full vocabulary at the answer's first position, no decoding), and ``batch_size`` requests
    run in one prefill whose common prefix (system text, image, question up to the caller text) is
    computed once per distinct image. On any other backend each request asks for one token with
    ``top_logprobs`` alternatives (:func:`read_alternatives`).
    """

    def __init__(self, backend: JudgeBackend, *, batch_size: int = 64, top_logprobs: int = 20):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.backend = backend
        self.batch_size = int(batch_size)
        self.top_logprobs = int(top_logprobs)
        self._ids: tuple[list[int], list[int]] | None = None

    @property
    def exact(self) -> bool:
        return isinstance(self.backend, LocalChatJudge)

    @property
    def scores_next_tokens(self) -> bool:
        """A remote backend that scores chosen next tokens (:class:`~capreward.judges.protocol.NextTokenScorer`):
        P(yes)/P(no) read exactly, one request per group."""
        return not self.exact and scores_next_tokens(self.backend)

    def request(self, text: str, image: Any) -> ChatRequest:
        return ChatRequest(turns=(user_turn(text, [image]),), max_tokens=1, temperature=0.0,
                           top_logprobs=0 if self.exact else self.top_logprobs)

    def read(self, requests: Sequence[ChatRequest], groups: Sequence[Any] | None = None) -> list[YesNo]:
        """One :class:`YesNo` per request, in order. ``groups[i]``: the request group of request i on a
        backend that scores next tokens (the requests of one group go to the server together)."""
        requests = list(requests)
        if not requests:
            return []
        if self.scores_next_tokens:
            return self._read_next_tokens(requests, groups)
        if not self.exact:
            responses = self.backend.generate(requests)
            if len(responses) != len(requests):
                raise RuntimeError(f"the backend answered {len(responses)} of {len(requests)} requests")
            return [read_alternatives(r) for r in responses]
        return self._read_local(requests)

    def _read_next_tokens(self, requests: list[ChatRequest], groups: Sequence[Any] | None) -> list[YesNo]:
        """P(yes), P(no) of the first answer token from the backend's exact next-token scores: the summed
        probabilities of the tokens that read as "yes" and as "no" (the ids the local reading sums)."""
        backend = cast(NextTokenScorer, self.backend)  # self.scores_next_tokens said so
        if self._ids is None:
            self._ids = (answer_token_ids(backend.tokenizer, "yes"), answer_token_ids(backend.tokenizer, "no"))
        yes, no = self._ids
        ids = tuple(yes) + tuple(no)
        groups = list(groups) if groups is not None else [None] * len(requests)
        answers = backend.next_token_logprobs([NextTokenQuery(r, "", ids, g) for r, g in zip(requests, groups)])
        out = []
        for answer in answers:
            if not answer.ok:
                out.append(YesNo(error=SampleError(None, kind_of(answer.error, "judge_unavailable"), "", cast(str, answer.error))))
                continue
            p = answer.probabilities()
            out.append(YesNo(sum(p[: len(yes)]), sum(p[len(yes):])))
        return out

    @torch.inference_mode()
    def _read_local(self, requests: list[ChatRequest]) -> list[YesNo]:
        """Every request encoded in one pass and each distinct visual's features computed once; then the
        valid rows run ``batch_size`` at a time, each chunk's shared prefix once per visual. A judge in an
        in-process engine (:class:`~capreward.judges.engines.EngineJudge`) reads the same tokens there."""
        backend = cast(LocalChatJudge, self.backend)  # the exact reading runs on a local chat judge
        judge = backend.judge
        if self._ids is None:
            self._ids = (answer_token_ids(judge.tokenizer, "yes"), answer_token_ids(judge.tokenizer, "no"))
        yes, no = self._ids
        if callable(getattr(backend, "token_distributions", None)):
            return self._read_engine(backend, requests, yes, no)
        prompt_ids, features, image_index, errors = backend._prepare(requests)
        out = [YesNo(error=e) for e in errors]
        rows = [i for i, p in enumerate(prompt_ids) if p is not None]
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            state = judge.start([prompt_ids[i] for i in chunk], features, [image_index[i] for i in chunk], reserve=1)
            probs = torch.softmax(state.logits.double(), dim=-1)
            device = probs.device
            p_yes = probs.index_select(1, torch.tensor(yes, device=device)).sum(1).tolist()
            p_no = probs.index_select(1, torch.tensor(no, device=device)).sum(1).tolist()
            for r, i in enumerate(chunk):
                out[i] = YesNo(p_yes[r], p_no[r])
            del state, probs
        return out


    def _read_engine(self, backend: Any, requests: list[ChatRequest], yes: list[int], no: list[int]) -> list[YesNo]:
        """P(yes) and P(no) of each request from the engine's log-probabilities of those tokens (all requests
        in one engine call); a request the engine cannot run is an error reading."""
        try:
            table = backend.token_distributions(requests, [[] for _ in requests], yes + no)
            return [YesNo(float(row[: len(yes)].sum()), float(row[len(yes):].sum())) for row in table]
        except ValueError:  # one request cannot run: each alone, so that only it gets the error
            pass
        out = []
        for request in requests:
            try:
                table = backend.token_distributions([request], [[]], yes + no)
            except ValueError as exc:
                out.append(YesNo(error=str(exc)))
                continue
            out.append(YesNo(float(table[0, : len(yes)].sum()), float(table[0, len(yes):].sum())))
        return out


# ------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class ClaimVerdict:
    """One claim of a caption: its ``text`` and span ``[start, end)`` (in the caption as given, or as read
    when ``read``), ``p`` the probability the judge gives it (NaN: not verified, ``error`` says why; 0 for
    a claim past ``max_claims``)."""

    text: str
    start: int
    end: int
    p: float
    error: str | None = None
    read: bool = False

    @property
    def verified(self) -> bool:
        return self.p >= 0.5


@dataclass(frozen=True)
class CoverageVerdict:
    """One reference claim: ``p`` the probability that the caption states it (NaN with ``error``)."""

    claim: str
    p: float
    error: str | None = None


@dataclass
class ClaimsResult:
    """Per-sample claim scores for N candidates.

    - ``score``: (N,) F-beta of precision and recall (precision alone without reference claims); NaN
      where the sample has no score (``error``).
    - ``precision``: (N,) the precision side: with a ``claim_cost`` c (default 1),
      ``1 - min(1, c * doubt of the claims not verified)`` (:func:`claim_precision`), the same for a
      false claim alone or after many true ones; with
      ``claim_cost=None``, the mean verification probability over the caption's claims (an average: a
      long caption dilutes a false claim, and restating true claims raises it).
    - ``false_claims``: (N,) the caption's claims the judge does not verify (P(yes) < 0.5), claims past
      ``max_claims`` included (they count as unverified); NaN where the sample has no score.
    - ``recall``: (N,) mean coverage over the reference claims, each read against the caption's verified
      claims only (:func:`verified_claims`; 0 when none is verified); NaN without any reference claim.
    - ``n_claims``: (N,) distinct claims in the caption (before the bound).
    - ``claims`` / ``coverage``: per sample, the :class:`ClaimVerdict` s (spans for a flag view) and the
      :class:`CoverageVerdict` s.
    - ``error``: None or why the sample has no score (a :class:`~capreward.errors.SampleError`);
      ``injection``: per sample, None or why the caption
      looks like forged prompt structure (reported only).
    """

    score: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    n_claims: np.ndarray
    claims: list[list[ClaimVerdict]]
    coverage: list[list[CoverageVerdict]]
    error: list[SampleError | None]
    injection: list[str | None] = field(default_factory=list)
    false_claims: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.error)


#: The precision side's price of a claim the judge rejects outright (P(yes) = 0): the whole side. A
#: softer price lets a caption of one false claim keep part of its precision, which GRPO turned into a
#: hack (one run-on claim listing every colour: precision 0.5, full lexical recall; docs/claims.md).
DEFAULT_CLAIM_COST = 1.0


def claim_precision(ps: Sequence[float], total: int, claim_cost: float | None) -> float:
    """The precision side of one caption from its claims' verification probabilities ``ps`` (the first
    ``len(ps)`` of its ``total`` distinct claims; the others, past the bound, count as unverified, P = 0).

    With ``claim_cost`` c: ``1 - min(1, c * sum(1 - p for the claims not verified))``, a claim not
    verified being one with P(yes) < 0.5: each costs c times its doubt, the same whatever the caption's
    length, and a verified claim costs nothing (a long honest caption is not nibbled by the judge's
    residual doubt). None: ``sum(ps) / total`` (an average).

    Args:
        ps: the verified claims' probabilities.
        total: the caption's distinct claims (>= len(ps), > 0).
        claim_cost: the price of a false claim, or None.

    Returns:
        The precision side, in [0, 1].

    Examples:
        >>> claim_precision([1.0] * 40 + [0.0], 41, None)      # one false claim in 41: an average
        0.975609756097561
        >>> claim_precision([1.0] * 40 + [0.0], 41, 1.0), claim_precision([0.0], 1, 1.0)   # priced: no dilution
        (0.0, 0.0)
        >>> claim_precision([0.9, 0.8, 0.4], 3, 0.5)                # one doubtful claim: 0.5 x 0.6
        0.7
    """
    if claim_cost is None:
        return sum(ps) / total
    doubt = sum(1.0 - p for p in ps if p < 0.5) + (total - len(ps))
    return 1.0 - min(1.0, claim_cost * doubt)


def verified_claims(verdicts: Sequence[ClaimVerdict]) -> list[str]:
    """The texts of the claims the judge verified (P(yes) >= 0.5, :attr:`ClaimVerdict.verified`): what the
    caption conveys for the recall side. A claim the judge rejects states no reference fact (a careful
    reader does not learn a fact from a false statement), and claims past ``max_claims`` have no verdict.

    Examples:
        >>> verified_claims([ClaimVerdict("the background is red", 0, 21, 0.99),
        ...                  ClaimVerdict("the background is yellow is red patch green patch", 23, 72, 0.0)])
        ['the background is red']
    """
    return [v.text for v in verdicts if v.verified]


def verified_description(claims: Sequence[str]) -> str:
    """The verified claims written as one description, one sentence each: what the judge reads for
    judge-read coverage (``coverage="judge"``) in place of the caption.

    Examples:
        >>> verified_description(["the background is red", "there is a green patch"])
        'the background is red. there is a green patch.'
    """
    return "".join(f"{c}. " for c in claims).rstrip()


def f_beta(precision: float, recall: float, beta: float) -> float:
    """(1 + β²)·P·R / (β²·P + R); 0 when both are 0; NaN when either is NaN."""
    if math.isnan(precision) or math.isnan(recall):
        return math.nan
    denominator = beta * beta * precision + recall
    return 0.0 if denominator == 0 else (1 + beta * beta) * precision * recall / denominator


class _Cache:
    """Verdicts (floats) and texts by a hashed key, the ``max_entries`` most recently used."""

    def __init__(self, max_entries: int):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
            raise ValueError(f"cache size must be a non-negative int, got {max_entries!r}")
        self.max_entries = max_entries
        self.memory: OrderedDict[str, Any] = OrderedDict()

    @staticmethod
    def key(*parts: str) -> str:
        # JSON then a hash: no text can make two different tuples share a key
        return hash_bytes(json.dumps(parts).encode())

    def get(self, key: str) -> Any:
        if key in self.memory:
            self.memory.move_to_end(key)
            return self.memory[key]
        return None

    def put(self, key: str, value: Any) -> None:
        self.memory[key] = value
        self.memory.move_to_end(key)
        while len(self.memory) > self.max_entries:
            self.memory.popitem(last=False)

    def __len__(self) -> int:
        return len(self.memory)


_LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")


def parse_fact_list(text: str, max_claims: int) -> list[str]:
    """Facts from a judge's list answer: one per line (bullets and numbers dropped), each further split
    by the rule-based splitter, deduplicated, at most ``max_claims``."""
    lines = [_LIST_ITEM.sub("", line) for line in text.splitlines()]
    return claims_of_references([line for line in lines if line.strip()], max_claims)


class ClaimScorer:
    """Claim precision, reference-claim recall and their F-beta on any chat judge backend.

    Args:
        backend: a :class:`~capreward.judges.protocol.JudgeBackend` (a
            :class:`~capreward.judges.local_chat.LocalChatJudge` gives exact probabilities; a remote
            server its listed log-probabilities).
        beta: weight of recall in the F-score (1: the harmonic mean).
        max_claims: claims verified per caption (claims past it count as unverified, 0).
        max_reference_claims: reference claims checked per sample.
        inventory: without references, use the judge's own inventory of the visual
            (:data:`~capreward.scorers.claims_prompts.INVENTORY_PROMPT`, generated once per visual and
            cached) as the reference claims; False: precision only.
        splitter: ``"rules"`` (default, :func:`~capreward.scorers.claims_split.split_claims`) or
            ``"judge"`` (the judge rewrites the caption as facts; spans are found in the caption when
            the fact is written in it, else -1).
        coverage: how a reference claim's coverage is read, in either case from the caption's verified
            claims only (P(yes) >= 0.5; a claim the judge rejects states no reference fact, and a caption
            with no verified claim has recall 0): ``"judge"`` (default: the judge's P(yes) to
            :data:`~capreward.scorers.claims_prompts.COVERAGE_TEMPLATE`, the description being the
            verified claims, :func:`verified_description`) or ``"lexical"`` (no judge call: the share of
            its content words stated by the best-matching verified claim,
            :func:`~capreward.scorers.claims_split.lexical_coverage`, CAPTURE's exact-match stage).
        normalise: P(yes) normalised over yes+no (default) or the raw P(yes) (VQAScore's reading).
        claim_cost: the precision side's price of each claim the judge does not verify (P(yes) < 0.5),
            in (0, 1], times its doubt 1 - P(yes): precision ``1 - min(1, claim_cost * doubt)``
            (:func:`claim_precision`; default 1: a claim rejected outright takes the whole side), so a
            false claim costs the same after any number of true ones and restating a true claim earns
            nothing. None: the mean P(yes) over the claims (an average).
        min_mass: a claim whose yes+no probability is below this counts as not verified (0).
        batch_size: requests per local prefill.
        top_logprobs: alternatives asked of a server.
        cache_size: verdicts kept in memory (0: none).
        inventory_max_tokens: the generation budget of the inventory.
        split_max_tokens: the generation budget of the judge splitter.

    Raises:
        ValueError: a bad option.

    Examples:
        >>> from capreward.judges import LocalChatJudge
        >>> from capreward.scorers.claims import ClaimScorer
        >>> from capreward.testing.tiny_claim_judge import claim_image, tiny_claim_judge
        >>> scorer = ClaimScorer(LocalChatJudge(tiny_claim_judge()))
        >>> image = claim_image("red", "green")
        >>> r = scorer.score(["the background is red. there is a blue patch."], images=[image])
        >>> [round(c.p) for c in r.claims[0]]
        [1, 0]
    """

    name = "claims"

    def __init__(
        self,
        backend: JudgeBackend,
        *,
        beta: float = 1.0,
        max_claims: int = 32,
        max_reference_claims: int = 32,
        inventory: bool = False,
        splitter: str = "rules",
        coverage: str = "judge",
        normalise: bool = True,
        min_mass: float = 0.05,
        batch_size: int = 64,
        top_logprobs: int = 20,
        cache_size: int = DEFAULT_CACHE_SIZE,
        inventory_max_tokens: int = 256,
        split_max_tokens: int = 256,
        claim_cost: float | None = DEFAULT_CLAIM_COST,
    ):
        if not beta > 0:
            raise ValueError(f"beta must be positive, got {beta}")
        for what, v in (("max_claims", max_claims), ("max_reference_claims", max_reference_claims)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{what} must be a positive int, got {v!r}")
        if splitter not in SPLITTERS:
            raise ValueError(f"splitter must be one of {SPLITTERS}, got {splitter!r}")
        if coverage not in COVERAGES:
            raise ValueError(f"coverage must be one of {COVERAGES}, got {coverage!r}")
        if not 0 <= min_mass < 1:
            raise ValueError(f"min_mass must be in [0, 1), got {min_mass}")
        if claim_cost is not None and (isinstance(claim_cost, bool) or not isinstance(claim_cost, (int, float))
                                       or not 0.0 < float(claim_cost) <= 1.0):
            raise ValueError(f"claim_cost must be a number in (0, 1] or None, got {claim_cost!r}")
        self.claim_cost = None if claim_cost is None else float(claim_cost)
        self.backend = backend
        self.beta = float(beta)
        self.max_claims = max_claims
        self.max_reference_claims = max_reference_claims
        self.inventory = bool(inventory)
        self.splitter = splitter
        self.coverage = coverage
        self.normalise = bool(normalise)
        self.min_mass = float(min_mass)
        self.reader = YesNoReader(backend, batch_size=batch_size, top_logprobs=top_logprobs)
        self.cache = _Cache(cache_size)
        self.inventory_max_tokens = int(inventory_max_tokens)
        self.split_max_tokens = int(split_max_tokens)
        self.judge_calls = 0  # yes/no requests sent (cache misses), for logs and benchmarks

    # ------------------------------------------------------------------------------------- splitting
    def split(self, captions: Sequence[str]) -> list[tuple[list[Claim], int]]:
        """The claims of each caption and its count of distinct claims (see :meth:`score`)."""
        if self.splitter == "rules":
            return [split_claims(c, self.max_claims) for c in captions]
        return self._judge_split(captions)

    def _judge_split(self, captions: Sequence[str]) -> list[tuple[list[Claim], int]]:
        from ..caption_reading import read_caption

        out: list[tuple[list[Claim], int] | None] = [None] * len(captions)
        todo: dict[str, list[int]] = {}
        for i, caption in enumerate(captions):
            key = self.cache.key("split", self.backend.name, CLAIMS_PROMPT_VERSION, caption)
            facts = self.cache.get(key)
            if facts is None:
                todo.setdefault(key, []).append(i)
            else:
                out[i] = self._facts_as_claims(caption, facts)
        if todo:
            # a text-only question: a blank image keeps it valid for judges that need one
            from PIL import Image

            blank = Image.new("RGB", (8, 8), (128, 128, 128))
            keys = list(todo)
            requests = [
                ChatRequest(turns=(user_turn(split_prompt(read_caption(captions[todo[k][0]]).text), [blank]),),
                            max_tokens=self.split_max_tokens)
                for k in keys
            ]
            for key, response in zip(keys, self.backend.generate(requests)):
                facts = parse_fact_list(response.text, 10 * self.max_claims) if response.ok else []
                if response.ok:
                    self.cache.put(key, facts)
                for i in todo[key]:
                    out[i] = self._facts_as_claims(captions[i], facts)
        return out  # type: ignore[return-value]

    def _facts_as_claims(self, caption: str, facts: list[str]) -> tuple[list[Claim], int]:
        lower = caption.lower()
        claims = []
        for fact in facts:
            at = lower.find(fact.lower())
            claims.append(Claim(fact, at, at + len(fact)) if at >= 0 else Claim(fact, -1, -1))
        return claims[: self.max_claims], len(claims)

    # ----------------------------------------------------------------------------------------- verdicts
    def _ask(self, kind: str, items: list[tuple[Any, Any, str | None, str]]) -> dict[Any, tuple[float, str | None]]:
        """Probabilities for ``items`` [(cache key, visual, caption or None, claim)], asked once per key
        (cached ones are not asked), ordered by visual so that chunks share their visual prefix."""
        found: dict[Any, tuple[float, str | None]] = {}
        todo: dict[Any, tuple[Any, str | None, str]] = {}
        for key, visual, caption, claim in items:
            if key in found or key in todo:
                continue
            cached = self.cache.get(key) if isinstance(key, str) else None
            if cached is not None:
                found[key] = cached
            else:
                todo[key] = (visual, caption, claim)
        if todo:
            # grouped by visual in the order each visual first comes (not by id(): an address order would
            # change the batches, and so the padding and the last bits, from one process to the next)
            first: dict[int, int] = {}
            for k in todo:
                first.setdefault(id(todo[k][0]), len(first))
            keys = sorted(todo, key=lambda k: first[id(todo[k][0])])
            requests = [
                self.reader.request(verify_prompt(c) if kind == "verify" else coverage_prompt(cast(str, cap), c), v)
                for v, cap, c in (todo[k] for k in keys)
            ]
            self.judge_calls += len(requests)
            groups = [id(todo[k][0]) for k in keys]  # one request per visual on a backend that scores next tokens
            for key, reading in zip(keys, self.reader.read(requests, groups)):
                value = reading.probability(self.normalise, self.min_mass)
                found[key] = value
                if reading.error is None and isinstance(key, str):
                    self.cache.put(key, value)
        return found

    def inventories(self, visuals: Sequence[Any], visual_keys: Sequence[str | None]) -> list[tuple[list[str] | None, str | None]]:
        """The judge's inventory claims of each visual (generated once per visual, cached)."""
        out: list[tuple[list[str] | None, str | None]] = [(None, None)] * len(visuals)
        todo: dict[str, list[int]] = {}
        for u, vk in enumerate(visual_keys):
            key = self.cache.key("inventory", self.backend.name, CLAIMS_PROMPT_VERSION, str(vk), str(self.inventory_max_tokens))
            got = self.cache.get(key) if vk is not None else None
            if got is not None:
                out[u] = (got, None)
            else:
                todo.setdefault(key if vk is not None else f"object:{u}", []).append(u)
        if todo:
            keys = list(todo)
            requests = [ChatRequest(turns=(user_turn(INVENTORY_PROMPT, [visuals[todo[k][0]]]),),
                                    max_tokens=self.inventory_max_tokens) for k in keys]
            for key, response in zip(keys, self.backend.generate(requests)):
                if not response.ok:
                    for u in todo[key]:
                        out[u] = (None, SampleError(None, kind_of(response.error, "judge_unavailable"), "",
                                                    f"inventory failed: {response.error}"))
                    continue
                facts = parse_fact_list(response.text, self.max_reference_claims)
                if not key.startswith("object:"):
                    self.cache.put(key, facts)
                for u in todo[key]:
                    out[u] = (facts, None if facts else SampleError(None, "judge_unreadable", "",
                                                                    "the judge's inventory holds no claim"))
        return out

    # ---------------------------------------------------------------------------------------- scoring
    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None) -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`): the F-score (precision alone without
        reference claims), ``precision``, ``recall`` (with references or the inventory), ``n_claims`` and
        ``claims`` (per claim its text, span and P(yes)). Each verdict is logged at DEBUG."""
        ids = list(visual_ids) if images is not None and visual_ids is not None and all(visual_ids) else None
        res = self.score(list(captions), images, videos=videos, references=references, image_ids=ids)
        n = len(res.error)
        for i, verdicts in enumerate(res.claims):
            for v in verdicts:
                log.debug("claims sample %d: [%d, %d) %r p=%.3f", i, v.start, v.end, v.text, v.p)
        subs: dict[str, list] = {"precision": floats(res.precision, n)}
        if references is not None or self.inventory:
            subs["recall"] = floats(res.recall, n)
        subs["n_claims"] = [int(c) for c in res.n_claims]
        subs["false_claims"] = floats(res.false_claims, n) if res.false_claims is not None else [math.nan] * n
        subs["claims"] = [[{"text": v.text, "start": v.start, "end": v.end, "p": None if math.isnan(v.p) else float(v.p)}
                           for v in verdicts] for verdicts in res.claims]
        no_recall = [None if not math.isnan(r) else SampleError(i, "input", "", "no reference claims for the recall side")
                     for i, r in enumerate(floats(res.recall, n))]
        return Scores(score=floats(res.score, n), sub_scores=subs, errors=list(res.error), reasons={"recall": no_recall},
                      result=res)

    def score(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        *,
        videos: Sequence[Any] | None = None,
        references: Sequence[Sequence[str]] | None = None,
        image_ids: Sequence[str] | None = None,
    ) -> ClaimsResult:
        """Score each ``candidates[n]`` against ``images[n]`` (or ``videos[n]``, judged on the three-frame
        composite) and, when given, ``references[n]``.

        Args:
            candidates: the captions.
            images: one image per caption (a path, PIL image or array), or None with ``videos``.
            videos: one video per caption, judged on its three-frame composite.
            references: per caption, reference captions whose claims give the recall (None: precision
                only, or the judge's inventory with ``inventory=True``).
            image_ids: per caption, an id narrowing the visual's cache key.

        Returns:
            A :class:`ClaimsResult`: the F-beta score, precision, recall and claim count per caption, each
            claim's verdict with its span, each reference claim's coverage, and per-sample errors.

        Raises:
            TypeError / ValueError: malformed inputs (naming the item); MediaError: an unreadable visual.
        """
        candidates = caption_list(candidates)
        n = len(candidates)
        refs = check_references(references, n)
        if image_ids is not None and len(image_ids) != n:
            raise ValueError(f"{n} candidates but {len(image_ids)} image ids")
        visuals, index = judge_visuals(images, videos, n) if n else ([], [])
        keys: list[str | None] = [None] * len(visuals)
        for i, u in enumerate(index):
            if keys[u] is None:
                vk = media_key(visuals[u], image_ids[i] if image_ids is not None else None)
                keys[u] = vk
        errors: list[SampleError | None] = [None] * n
        for i, caption in enumerate(candidates):
            if is_blank(caption):
                errors[i] = SampleError(i, "input", "", "empty caption")
        split = self.split([caption if errors[i] is None else "" for i, caption in enumerate(candidates)])
        for i, (_claims, total) in enumerate(split):
            if errors[i] is None and total == 0:
                errors[i] = SampleError(i, "input", "", "the caption holds no claim")

        def vkey(kind: str, u: int, *texts: str) -> Any:
            """The cache key (a hash) of a verdict; a tuple, never cached, for a visual without a key."""
            key = keys[u]
            if key is None:
                return ("uncached", kind, u, *texts)
            return self.cache.key(kind, self.backend.name, CLAIMS_PROMPT_VERSION, key, *texts)

        # verify every distinct (visual, claim) of the group in one pass
        items: list[tuple[Any, Any, str | None, str]] = []
        for i in range(n):
            if errors[i] is None:
                u = index[i]
                for c in split[i][0]:
                    items.append((vkey("verify", u, c.text), visuals[u], None, c.text))
        verdicts = self._ask("verify", items)

        # reference claims: from the references, or from the judge's inventory of the visual
        ref_claims: list[list[str] | None] = [None] * n
        if refs is not None:
            ref_claims = [claims_of_references(r, self.max_reference_claims) for r in refs]
        elif self.inventory:
            used = sorted({index[i] for i in range(n) if errors[i] is None})
            inv = self.inventories([visuals[u] for u in used], [keys[u] for u in used])
            by_visual = dict(zip(used, inv))
            for i in range(n):
                if errors[i] is None:
                    facts, why = by_visual[index[i]]
                    if facts is None:
                        errors[i] = SampleError.of(why, i)
                    else:
                        ref_claims[i] = facts

        # the precision side, from the verdicts
        score, precision, recall = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        false_claims = np.full(n, np.nan)
        n_claims = np.zeros(n, dtype=np.int64)
        claim_out: list[list[ClaimVerdict]] = [[] for _ in range(n)]
        cover_out: list[list[CoverageVerdict]] = [[] for _ in range(n)]
        for i in range(n):
            claims, total = split[i]
            n_claims[i] = total
            if errors[i] is not None:
                continue
            for c in claims:
                p, why = verdicts[vkey("verify", index[i], c.text)]
                claim_out[i].append(ClaimVerdict(c.text, c.start, c.end, p, why, c.read))
            failed = next((v.error for v in claim_out[i] if math.isnan(v.p)), None)
            if failed is not None:
                errors[i] = SampleError(i, kind_of(failed, "judge_unreadable"), "", f"claim not verified: {failed}")
                continue
            ps = [v.p for v in claim_out[i]]
            false_claims[i] = sum(p < 0.5 for p in ps) + (total - len(ps))  # claims past max_claims: unverified
            precision[i] = claim_precision(ps, total, self.claim_cost)

        # the recall side: each reference claim read against what the caption's verified claims state
        stated = [verified_claims(claim_out[i]) for i in range(n)]
        covered = self._coverage(index, visuals, vkey, ref_claims, stated, errors)
        for i in range(n):
            if errors[i] is not None:
                continue
            if not ref_claims[i]:
                score[i] = precision[i]
                continue
            for r in ref_claims[i] or ():
                p, why = covered[i, r]
                cover_out[i].append(CoverageVerdict(r, p, why))
            failed = next((v.error for v in cover_out[i] if math.isnan(v.p)), None)
            if failed is not None:
                errors[i] = SampleError(i, kind_of(failed, "judge_unreadable"), "", f"reference claim not checked: {failed}")
                precision[i] = math.nan
                continue
            recall[i] = sum(v.p for v in cover_out[i]) / len(cover_out[i])
            score[i] = f_beta(precision[i], recall[i], self.beta)
        for i, e in enumerate(errors):
            if e is not None:
                log.info("claims sample %d: %s", i, e)
        return ClaimsResult(score, precision, recall, n_claims, claim_out, cover_out, errors, injection_reasons(candidates),
                            false_claims)

    def _coverage(self, index: Sequence[int], visuals: Sequence[Any], vkey: Any, ref_claims: Sequence[list[str] | None],
                  stated: Sequence[list[str]], errors: Sequence[SampleError | None]) -> dict[tuple[int, str], tuple[float, str | None]]:
        """``{(sample, reference claim): (p, error)}``: how far the sample's verified claims ``stated[i]``
        state each of its reference claims. ``coverage="lexical"``: the best-matching verified claim's
        share of the reference claim's content words; ``"judge"``: the judge's P(yes) that the verified
        claims, written as one description (:func:`verified_description`), state it. No verified claim:
        0 for every reference claim, no judge call."""
        out: dict[tuple[int, str], tuple[float, str | None]] = {}
        asked: list[tuple[int, str, Any]] = []
        items: list[tuple[Any, Any, str | None, str]] = []
        for i in range(len(errors)):
            if errors[i] is not None or not ref_claims[i]:
                continue
            description = verified_description(stated[i])  # what the judge reads for every reference claim
            for r in ref_claims[i] or ():
                if not stated[i]:
                    out[i, r] = (0.0, None)
                elif self.coverage == "lexical":
                    out[i, r] = (lexical_coverage(r, stated[i]), None)
                else:
                    key = vkey("cover", index[i], description, r)
                    asked.append((i, r, key))
                    items.append((key, visuals[index[i]], description, r))
        if items:
            found = self._ask("cover", items)
            for i, r, key in asked:
                out[i, r] = found[key]
        return out
