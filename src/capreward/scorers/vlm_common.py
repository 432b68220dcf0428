"""Helpers shared by the chat-judge scorers (VisCE², G-VEval): reading score distributions from a
backend's answer, whichever backend it is.

- A local backend (:class:`~capreward.judges.local_chat.LocalChatJudge`) gives the exact distribution
  over 0..100 at the score position from a tree of cached decode steps.
- Any other backend (an OpenAI-compatible server) gives the top alternatives of each generated token:
  :mod:`capreward.scorers.remote_numbers` reads how the response writes the number - one token (the
  released rule: the renormalised alternatives of the token after the marker) or digit by digit (an
  exact digit tree from assistant-prefilled requests) - and gives None with the reason otherwise.
"""

from __future__ import annotations

import logging
from typing import Any
from collections.abc import Sequence

import numpy as np

from ..judges.protocol import ChatRequest, ChatResponse, answer_problem
from ..metrics.gveval import alternatives_after_marker, score_token_distribution
from .remote_numbers import DEFAULT_TOLERANCE, TREE_TOP_LOGPROBS, remote_distributions

log = logging.getLogger(__name__)


def is_exact_backend(backend: Any) -> bool:
    """Whether ``backend`` can compute exact integer distributions (a local judge)."""
    return callable(getattr(backend, "integer_distributions", None)) and callable(getattr(backend, "number_prefix", None))


def exact_distributions(
    backend: Any, requests: Sequence[ChatRequest], responses: Sequence[ChatResponse], markers: Sequence[str | None]
) -> tuple[list[np.ndarray | None], list[str | None]]:
    """For each (request, response, marker): the exact (101,) distribution of the number written after
    ``marker`` (None: the first number of the answer), or None and a reason."""
    probs: list[np.ndarray | None] = [None] * len(requests)
    reasons: list[str | None] = [None] * len(requests)
    todo, prefixes = [], []
    for i, (_request, response, marker) in enumerate(zip(requests, responses, markers)):
        ids = getattr(response, "token_ids", None)
        if not response.ok or ids is None:
            reasons[i] = response.error or "the local backend returned no token ids"
            continue
        prefix = backend.number_prefix(ids, marker)
        if prefix is None:
            reasons[i] = f"no number after {marker!r} in the answer" if marker else "no number in the answer"
            continue
        todo.append(i)
        prefixes.append(prefix)
    if todo:
        table = backend.integer_distributions([requests[i] for i in todo], prefixes)
        for row, i in enumerate(todo):
            if table[row].sum() > 0:
                probs[i] = table[row]
            else:
                reasons[i] = "the judge puts no probability on any integer 0..100 at the score position"
    return probs, reasons


def alternative_distributions(
    responses: Sequence[ChatResponse], markers: Sequence[str | None]
) -> tuple[list[np.ndarray | None], list[str | None]]:
    """For each response: the renormalised top-alternative distribution at the score token, or None and
    a reason. With a marker, the token after the first token containing it (G-VEval's released rule);
    without, the first token holding a digit, alternatives compared after stripping whitespace."""
    probs: list[np.ndarray | None] = []
    reasons: list[str | None] = []
    for response, marker in zip(responses, markers):
        if not response.ok:
            probs.append(None)
            reasons.append(response.error)
            continue
        problem = answer_problem(response)
        if problem is not None:
            probs.append(None)
            reasons.append(f"malformed answer: {problem}")
            continue
        texts = [t.token for t in response.tokens]
        tops = [t.ranked or t.top for t in response.tokens]  # listed order: a later duplicate wins, as released
        if not texts:
            probs.append(None)
            reasons.append("the backend returned no token log-probabilities")
            continue
        if marker is not None:
            p, why = alternatives_after_marker(texts, tops, marker)
        else:
            at = next((j for j, t in enumerate(texts) if any(c.isdigit() for c in t)), None)
            if at is None:
                p, why = None, "no number in the answer"
            else:
                p, why = score_token_distribution(tops[at])
        probs.append(p)
        reasons.append(why)
    return probs, reasons


def score_distributions(
    backend: Any,
    requests: Sequence[ChatRequest],
    responses: Sequence[ChatResponse],
    markers: Sequence[str | None],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    tree_top_logprobs: int = TREE_TOP_LOGPROBS,
    groups: Sequence[Any] | None = None,
) -> tuple[list[np.ndarray | None], list[str | None]]:
    """Exact distributions on a local backend; on any other backend the distribution the response's
    tokenisation allows (:func:`~capreward.scorers.remote_numbers.remote_distributions`: the released rule
    for whole-number tokens, a digit tree for numbers written digit by digit - exact in one request per
    group on a backend that scores next tokens, else within ``tolerance`` score points - never an
    expectation over part of a number), or None and the reason. ``groups[i]``: the request group of
    response i (its caption: one request per caption)."""
    if is_exact_backend(backend):
        return exact_distributions(backend, requests, responses, markers)
    reads = remote_distributions(backend, requests, responses, markers, top_logprobs=tree_top_logprobs,
                                 tolerance=tolerance, groups=groups)
    return [r.probs for r in reads], [None if r.probs is not None else r.error for r in reads]
