"""The distribution over the integers 0..100 a remote judge wrote, read from its response whatever its
tokenizer (VisCE²'s and G-VEval's expected scores on an OpenAI-compatible server).

A server returns, per generated token, the top-k alternatives with their log-probabilities. Where the
score sits in the answer and how the server's tokenizer writes numbers is read from the response itself
(the tokens and their alternatives, never a model-name list), by :func:`locate_number`:

- ``"whole"``: the number is one token ("85", as GPT-4o's and LLaMA-3's tokenizers write 0..999) and its
  alternatives are whole numbers too (a multi-digit alternative is listed, or the number has several
  digits). The score is then G-VEval's released rule: the alternatives that are "0".."100",
  renormalised (:func:`~capreward.metrics.gveval.alternatives_after_marker`). Unchanged from the release.
- ``"split"``: the number is written digit by digit (LLaMA-1/2, Qwen2/2.5/3, Mistral: one digit per
  token), so the token after the marker holds only the first digit and an expectation over its
  alternatives would be one over *part* of the number ("$85$" scored 7.9). The exact distribution is
  built as a digit tree (:func:`~capreward.metrics.gveval.digit_tree_distribution`) from
  **assistant-prefilled requests**: the conversation, then the answer up to the number plus the digits of
  a node as a final assistant message that the server continues (vLLM's ``continue_final_message=True``,
  ``add_generation_prompt=False``, sent by :class:`~capreward.judges.remote.OpenAIJudge` whenever the last
  turn is an assistant turn), one token, ``top_logprobs`` alternatives: p(each digit | node) and p(end |
  node) = 1 - Σ p(digit). The root node's alternatives are the response's own.
- anything else (a number split into multi-digit chunks, digits sharing a token with text, a server that
  refuses prefilled requests): no distribution, and the reason.

Exactness of the tree: a node's digit probabilities are exact when all ten digits are among its listed
alternatives. A digit not listed is no more likely than the least likely listed token (top-k lists are
sorted), so its mass is bounded; nodes reached with a probability below a threshold are not asked at all
(their whole mass is bounded instead). The bound on the expected score (:attr:`NumberRead.bound`, score
points on 0..100) is ``100 U / (Z - U)`` for U the mass placed by these bounds and Z the distribution's
mass; a distribution is returned only when the bound is at most ``tolerance`` (default
:data:`DEFAULT_TOLERANCE`), else None with the reason. ``bound`` 0 means every probability used was read.
A backend that answers vLLM's ``prompt_logprobs`` (``OpenAIJudge(prompt_logprobs=True)``) leaves no digit
unread: each digit missing from a node's alternatives is appended to the node's prefilled text and read
as the last prompt token's log-probability (one more request per missing digit).

Prefilled text is re-tokenised by the server; the prefix sent is the concatenation of the response's
token strings up to the number (the answer text where those strings are lossy, e.g. a character written
as byte tokens), so a server whose tokenizer splits that text as it generated it (the usual
case: digits are their own tokens in these tokenizers) conditions each node exactly as the local digit
tree does (checked in the tests against the local judge's exact scores, through a real HTTP server).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, replace
from typing import Any, cast
from collections.abc import Hashable, Sequence

import numpy as np

from ..judges.protocol import (
    ChatRequest,
    ChatResponse,
    NextTokenQuery,
    TokenLogprob,
    answer_problem,
    assistant_turn,
    scores_next_tokens,
)
from ..judges.vocab import digit_token_ids
from ..metrics.gveval import (NUM_SCORES, alternatives_after_marker, digit_tree_distribution,
                              score_token_distribution)
from ..metrics.logprobs import MalformedAnswer, checked_logprob, listed_probabilities

log = logging.getLogger(__name__)

DIGITS = tuple(str(d) for d in range(10))
#: Default largest bound (score points on 0..100) an expected score read from a digit tree may carry.
DEFAULT_TOLERANCE = 1e-4
#: Alternatives asked per node of the digit tree (OpenAI's and vLLM's default limit).
TREE_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class NumberSite:
    """Where the number to read starts in a response and how it is tokenised.

    ``kind``: ``"whole"``, ``"split"`` or None (``error`` says why); ``index``: the token that starts the
    number; ``prefix``: the answer's text before that token (the concatenated token strings); ``lead``:
    the whitespace the first number token starts with (digits at the tree's root are looked up as
    ``lead + d``)."""

    kind: str | None
    index: int = -1
    prefix: str = ""
    lead: str = ""
    error: str | None = None


@dataclass(frozen=True)
class NumberRead:
    """The distribution of one response's number: ``probs`` (101,) or None (``error`` says why);
    ``method``: ``"alternatives"`` (whole-number tokens, the released renormalised rule) or ``"tree"``
    (digit tree); ``bound``: for a tree, the worst-case distance (score points) of its expected score to
    the exact one (0: exact); ``requests``: prefilled requests sent for it (prompt-logprobs ones
    included)."""

    probs: np.ndarray | None
    method: str | None
    error: str | None = None
    bound: float = float("nan")
    requests: int = 0


def _is_digits(text: str) -> bool:
    return bool(text) and all(c in "0123456789" for c in text)


def _prefix_from_text(text: str, tokens_text: str, marker: str | None, lead: str) -> str | None:
    """The answer text before the number's first token, read from the answer ``text`` (where a token's
    string is lossy: a byte-fallback piece of a character reads "\ufffd"), keeping the leading whitespace
    the tokens show and the text lacks (a server's content may drop it)."""
    if marker is not None:
        at = text.find(marker)
        if at < 0:
            return None
        match = re.match(r"\s*[0-9]", text[at + len(marker):])
        if match is None:
            return None
        digit = at + len(marker) + match.end() - 1
    else:
        digit = next((j for j, c in enumerate(text) if c in "0123456789"), -1)
        if digit < 0:
            return None
    prefix = text[:digit]
    if lead and prefix.endswith(lead):
        prefix = prefix[: len(prefix) - len(lead)]
    head = tokens_text[: len(tokens_text) - len(tokens_text.lstrip())]
    return prefix if prefix.startswith(head) else head + prefix


def locate_number(tokens: Sequence[TokenLogprob], marker: str | None, text: str | None = None) -> NumberSite:
    """The number after the first ``marker`` of the answer (None: the answer's first number), from the
    response's tokens; see the module docstring for the kinds. ``prefix`` is the concatenated token
    strings before the number, or, where those are lossy ("\ufffd", a character split into byte tokens),
    the answer ``text`` before it."""
    answer = text
    texts = [t.token for t in tokens]
    if not texts:
        return NumberSite(None, error="the backend returned no token log-probabilities")
    start = 0
    if marker is not None:
        text = ""
        k = None
        for j, piece in enumerate(texts):
            text += piece
            if marker in text:
                k = j
                break
        if k is None:
            return NumberSite(None, error=f"no {marker!r} in the answer")
        after = text[text.index(marker) + len(marker):]  # what token k holds after the marker
        if after.strip():
            if any(c.isdigit() for c in after):
                return NumberSite(None, error=f"the number after {marker!r} shares the token {texts[k]!r} with it")
            return NumberSite(None, error=f"no number after {marker!r}")
        start = k + 1
        while start < len(texts) and texts[start] and not texts[start].strip():
            start += 1  # whitespace tokens between the marker and the number
        if start >= len(texts):
            return NumberSite(None, error=f"the answer ends at {marker!r}")
        if not any(c in "0123456789" for c in texts[start]):
            return NumberSite(None, error=f"no number after {marker!r}")
    else:
        start = next((j for j, t in enumerate(texts) if any(c in "0123456789" for c in t)), -1)
        if start < 0:
            return NumberSite(None, error="no number in the answer")
    first = texts[start]
    body = first.lstrip()
    lead = first[: len(first) - len(body)]
    if not _is_digits(body):
        return NumberSite(None, index=start, error=f"the number's first token {first!r} holds text besides digits")
    run = [body]
    for piece in texts[start + 1 :]:
        if not _is_digits(piece):
            break
        run.append(piece)
    prefix = "".join(texts[:start])
    if "\ufffd" in prefix and answer is not None and "\ufffd" not in answer:
        from_text = _prefix_from_text(answer, prefix, marker, lead)
        if from_text is None:
            return NumberSite(None, index=start, error="the answer text and its tokens disagree on where the number is")
        prefix = from_text
    if len(run) == 1 and len(body) >= 2:
        kind = "whole"
    elif all(len(piece) == 1 for piece in run):
        top = tokens[start].ranked or tuple(tokens[start].top.items())
        multi = any(_is_digits(alt.strip()) and len(alt.strip()) >= 2 for alt, _ in top)
        kind = "whole" if len(run) == 1 and multi else "split"
    else:
        return NumberSite(None, index=start, error=f"the number is split into multi-digit tokens {run!r}: "
                          "neither its alternatives nor a digit tree give its distribution")
    return NumberSite(kind, index=start, prefix=prefix, lead=lead)


@dataclass(frozen=True)
class NodeRead:
    """p(each digit) (10,) at a tree node (0 for unlisted digits), ``unlisted``: a bound on the mass of
    the unlisted digits (0 when all are listed), or ``error``."""

    probs: np.ndarray
    unlisted: float
    error: str | None = None
    missing: tuple[int, ...] = ()  # the digits not listed


def read_node(alternatives: Sequence[tuple[str, float]], lead: str = "") -> NodeRead:
    """The digit probabilities at one node from its listed alternatives (text, log-probability), digits
    looked up as ``lead + d``. A listed alternative that continues the number with more than one digit,
    or with digits and text together, means the tokenizer does not write numbers one digit per token:
    an error; so are alternatives that are no distribution's
    (:func:`~capreward.metrics.logprobs.listed_probabilities`)."""
    probs = np.zeros(10, dtype=np.float64)
    seen: set[int] = set()
    listed = []
    try:
        checked = listed_probabilities(alternatives, "the alternatives")
    except MalformedAnswer as exc:
        return NodeRead(probs, 0.0, f"malformed answer: {exc}")
    for text, p in checked:
        listed.append(p)
        if not text.startswith(lead):
            continue
        rest = text[len(lead):]
        if len(rest) == 1 and rest in DIGITS:
            d = int(rest)
            if d not in seen:
                seen.add(d)
                probs[d] = p
        elif rest[:1].isdigit():
            return NodeRead(probs, 0.0, f"the alternative {text!r} continues the number with more than one digit")
    missing = 10 - len(seen)
    if not missing:
        return NodeRead(probs, 0.0)
    if not listed:
        return NodeRead(probs, 0.0, "the backend reported no alternatives")
    unlisted = min(max(0.0, 1.0 - sum(listed)), missing * min(listed))
    return NodeRead(probs, unlisted, missing=tuple(d for d in range(10) if d not in seen))


def _node_request(request: ChatRequest, text: str, top_logprobs: int) -> ChatRequest:
    """``request`` continued from the assistant text ``text`` for one token, with alternatives."""
    return replace(request, turns=tuple(request.turns) + (assistant_turn(text),), max_tokens=1, temperature=0.0,
                   top_logprobs=top_logprobs, stop=(), structured_outputs=None)


def _alternatives(response: ChatResponse) -> tuple[tuple[tuple[str, float], ...] | None, str | None]:
    if not response.ok:
        return None, f"a prefilled request failed: {response.error}"
    if not response.tokens:
        return None, "a prefilled request returned no token log-probabilities"
    token = response.tokens[0]
    return (token.ranked or tuple(token.top.items())), None


def digit_trees(
    backend: Any,
    requests: Sequence[ChatRequest],
    sites: Sequence[NumberSite],
    roots: Sequence[Sequence[tuple[str, float]]],
    *,
    top_logprobs: int = TREE_TOP_LOGPROBS,
    tolerance: float = DEFAULT_TOLERANCE,
) -> list[NumberRead]:
    """The exact (within ``tolerance``) distribution of each split number from prefilled requests.

    ``roots[i]``: the alternatives at the number's first token in response i (the root node; asked again
    with ``top_logprobs`` alternatives when they miss a digit). Every level of the tree goes to the
    backend in one ``generate`` call (10 requests per sample, then up to 90, then 1). Returns one :class:`NumberRead` per request."""
    n = len(requests)
    # nodes reached with less than this are bounded, not asked (at most ~102 of them: their share of the
    # bound stays far below the tolerance, and never above the default one's)
    prune = min(tolerance, DEFAULT_TOLERANCE) / (100.0 * 400.0)
    first = np.zeros((n, 10))
    second = np.zeros((n, 10, 10))
    end1 = np.zeros((n, 10))
    end2 = np.zeros((n, 10, 10))
    third_zero = np.zeros(n)
    end3 = np.zeros(n)
    uncertain = np.zeros(n)
    errors: list[str | None] = [None] * n
    asked = [0] * n

    def run(nodes: Sequence[tuple[int, str | None]]) -> list[NodeRead | None]:
        """Ask each (sample, digits) node (digits None: the root, before the number's first token); None
        where the sample failed."""
        live = [(i, digits) for i, digits in nodes if errors[i] is None]
        texts = [sites[i].prefix + ("" if digits is None else sites[i].lead + digits) for i, digits in live]
        sent = [_node_request(requests[i], text, top_logprobs) for (i, _), text in zip(live, texts)]
        answers = backend.generate(sent) if sent else []
        if len(answers) != len(sent):
            raise RuntimeError(f"the backend answered {len(answers)} of {len(sent)} requests")
        out: dict[tuple[int, str | None], NodeRead] = {}
        texts_of = dict(zip(live, texts))
        for (i, digits), answer in zip(live, answers):
            asked[i] += 1
            alternatives, why = _alternatives(answer)
            node = read_node(cast(Sequence[tuple[str, float]], alternatives), sites[i].lead if digits is None else "") if why is None else None
            if node is not None and node.error is not None:
                why = node.error
            if why is not None:
                where = "at the number's first digit" if digits is None else f"after {sites[i].lead + digits!r}"
                errors[i] = errors[i] or f"{where}: {why}"
                continue
            assert node is not None  # read when there was no reason not to
            out[(i, digits)] = node
        if getattr(backend, "prompt_logprobs", False):
            complete_nodes(out, texts_of)
        return [out.get(key) for key in nodes]

    def complete_nodes(out: dict, texts_of: dict) -> None:
        """A server that answers prompt log-probabilities: each digit missing from a node's alternatives
        is read exactly, as the last prompt token of a request prefilled with it."""
        asks = [(key, d) for key, node in out.items() if node.unlisted > 0 for d in node.missing]
        if not asks:
            return
        pieces = [(sites[i].lead if digits is None else "") + str(d) for ((i, digits), d) in asks]
        sent = [replace(_node_request(requests[i], texts_of[(i, digits)] + piece, 0), prompt_logprobs=1)
                for ((i, digits), _), piece in zip(asks, pieces)]
        answers = backend.generate(sent)
        if len(answers) != len(sent):
            raise RuntimeError(f"the backend answered {len(answers)} of {len(sent)} requests")
        filled: dict[tuple[int, str | None], np.ndarray] = {}
        for ((i, digits), d), piece, answer in zip(asks, pieces, answers):
            asked[i] += 1
            if errors[i] is not None:
                continue
            last = answer.prompt_logprobs[-1] if answer.ok and answer.prompt_logprobs else None
            logprob = next((lp for text, lp in last or () if text == piece), None)
            try:
                logprob = None if logprob is None else checked_logprob(logprob, f"the prompt log-probability of {piece!r}")
            except MalformedAnswer as exc:
                errors[i] = f"malformed answer: {exc}"
                continue
            if logprob is None:
                where = "at the number's first digit" if digits is None else f"after {sites[i].lead + digits!r}"
                errors[i] = (f"{where}: " + (f"a prompt-logprobs request failed: {answer.error}" if not answer.ok else
                             f"the server's prompt log-probabilities do not list {piece!r} as the last prompt token"))
                continue
            filled.setdefault((i, digits), out[(i, digits)].probs.copy())[d] = math.exp(logprob)
        for key, probs in filled.items():
            if errors[key[0]] is None:
                out[key] = NodeRead(probs, 0.0)

    ask_root: list[tuple[int, str | None]] = []
    for i in range(n):  # the response's own alternatives when they list every digit, else a prefilled request
        root = read_node(roots[i], sites[i].lead)
        if root.error is not None:
            errors[i] = f"at the number's first digit: {root.error}"
        elif root.unlisted > 0:
            ask_root.append((i, None))
        first[i], uncertain[i] = root.probs, root.unlisted
    for (i, _), node in zip(ask_root, run(ask_root)):
        if node is not None:
            first[i], uncertain[i] = node.probs, node.unlisted

    level1 = [(i, str(a)) for i in range(n) for a in range(10) if errors[i] is None]
    for (i, digits), node in zip(level1, run(level1)):
        if node is not None:
            a = int(digits)
            second[i, a], end1[i, a] = node.probs, max(0.0, 1.0 - node.probs.sum())
            uncertain[i] += first[i, a] * node.unlisted
    level2: list[tuple[int, int, int]] = []
    pruned: list[tuple[int, int, int]] = []
    for i in range(n):
        for a in range(1, 10):
            for b in range(10):
                reach = first[i, a] * second[i, a, b]
                (level2 if reach >= prune or (a, b) == (1, 0) else pruned).append((i, a, b))
    for i, a, b in pruned:
        uncertain[i] += first[i, a] * second[i, a, b]  # end2 left 0: its whole mass is unknown
    nodes2 = [(i, f"{a}{b}") for i, a, b in level2]
    for (i, a, b), node in zip(level2, run(nodes2)):
        if node is not None:
            reach = first[i, a] * second[i, a, b]
            end2[i, a, b] = max(0.0, 1.0 - node.probs.sum())
            uncertain[i] += reach * node.unlisted
            if (a, b) == (1, 0):
                third_zero[i] = node.probs[0]
    level3 = [(i, "100") for i in range(n)]
    for (i, _), node in zip(level3, run(level3)):
        if node is not None:
            end3[i] = max(0.0, 1.0 - node.probs.sum())
            uncertain[i] += first[i, 1] * second[i, 1, 0] * third_zero[i] * node.unlisted
    log.info("exact digit trees by one-token requests on %s: %d requests for %d numbers (%.1f each); a backend "
             "that scores next tokens (SGLangJudge, VLLMJudge) needs one request per caption",
             getattr(backend, "name", type(backend).__name__), sum(asked), n, sum(asked) / max(1, n))
    out = []
    for i in range(n):
        if errors[i] is not None:
            out.append(NumberRead(None, None, errors[i], requests=asked[i]))
            continue
        probs = digit_tree_distribution(first[i], end1[i], second[i], end2[i], third_zero[i], end3[i])
        total = float(probs.sum())
        bound = 0.0 if uncertain[i] == 0 else (100.0 * uncertain[i] / (total - uncertain[i]) if total > uncertain[i] else math.inf)
        if not total > 0:
            out.append(NumberRead(None, None, "the judge puts no probability on any integer 0..100 at the score position",
                                  requests=asked[i]))
        elif bound > tolerance:
            out.append(NumberRead(None, None, (
                f"the server's top-{top_logprobs} alternatives leave the expected score uncertain by up to "
                f"{bound:.3g} points (tolerance {tolerance:g}): digits are missing from the alternatives; "
                "serve more logprobs (vLLM --max-logprobs) and raise top_logprobs, or raise the tolerance"),
                bound=bound, requests=asked[i]))
        else:
            out.append(NumberRead(probs, "tree", bound=bound, requests=asked[i]))
    return out


def lead_digit_ids(tokenizer: Any, lead: str = "") -> list[int]:
    """The ids of the ten digit tokens as a number's first token writes them: the digits themselves
    (:func:`~capreward.judges.vocab.digit_token_ids`) or, after the whitespace ``lead`` that token starts
    with (a tokenizer with " 7" tokens), the tokens ``lead + d``. Raises ValueError when one is not a
    single token."""
    if not lead:
        return digit_token_ids(tokenizer)
    ids = []
    for d in DIGITS:
        got = tokenizer.encode(lead + d, add_special_tokens=False)
        if len(got) != 1:
            raise ValueError(f"the tokenizer writes {lead + d!r} as {len(got)} tokens, not one")
        ids.append(int(got[0]))
    return ids


#: The contexts of a number's exact digit tree after its prefix: the root (None), each first digit, each
#: two-digit number (no leading zero) and "100" (what p(100) needs).
TREE_NODES: tuple[str | None, ...] = (None, *DIGITS, *(f"{a}{b}" for a in range(1, 10) for b in range(10)), "100")


def exact_trees(
    backend: Any, requests: Sequence[ChatRequest], sites: Sequence[NumberSite], groups: Sequence[Hashable] | None = None
) -> list[NumberRead]:
    """The exact distribution of each split number from a backend that scores next tokens
    (:class:`~capreward.judges.protocol.NextTokenScorer`): every node of the number's digit tree
    (:data:`TREE_NODES`: the prefix, then each first digit, each two-digit number and "100", 102 contexts)
    asks the ten digit tokens' log-probabilities, and all of them go to the server together: one request
    per group (``groups[i]``; default one per number), the first request's answer already read. No top-k
    cap, no bound: ``bound`` 0 wherever the backend answered.

    Args:
        backend: the :class:`~capreward.judges.protocol.NextTokenScorer`.
        requests: per number, the conversation its answer continues.
        sites: per number, where it starts (:func:`locate_number`, kind ``"split"``).
        groups: per number, its request group (a caption's numbers in one group: one request each).

    Returns:
        One :class:`NumberRead` per number (``requests`` the count of requests its group took).
    """
    n = len(requests)
    groups = list(groups) if groups is not None else list(range(n))
    try:
        digits = digit_token_ids(backend.tokenizer)
    except ValueError as exc:
        return [NumberRead(None, None, f"the served tokenizer: {exc}") for _ in range(n)]
    queries: list[NextTokenQuery] = []
    spans: list[tuple[int, int] | None] = []
    errors: list[str | None] = [None] * n
    for i, (request, site) in enumerate(zip(requests, sites)):
        try:
            root = lead_digit_ids(backend.tokenizer, site.lead)
        except ValueError as exc:
            errors[i] = f"at the number's first digit: {exc}"
            spans.append(None)
            continue
        start = len(queries)
        for node in TREE_NODES:
            text = site.prefix + ("" if node is None else site.lead + node)
            queries.append(NextTokenQuery(request, text, tuple(root if node is None else digits), group=groups[i]))
        spans.append((start, len(queries)))
    answers = backend.next_token_logprobs(queries) if queries else []
    if len(answers) != len(queries):
        raise RuntimeError(f"the backend answered {len(answers)} of {len(queries)} queries")
    sent: dict[Hashable, int] = {}  # requests per group, as the backend splits them
    if callable(getattr(backend, "next_token_chunks", None)):
        for chunk in backend.next_token_chunks(queries):
            group = queries[chunk[0]].group
            sent[group] = sent.get(group, 0) + 1
    out = []
    for i in range(n):
        span = spans[i]
        if span is None:
            out.append(NumberRead(None, None, errors[i]))
            continue
        nodes = dict(zip(TREE_NODES, answers[span[0] : span[1]]))
        failed = next((a.error for a in nodes.values() if not a.ok), None)
        asked = sent.get(groups[i], 1)
        if failed is not None:
            out.append(NumberRead(None, None, f"a next-token request failed: {failed}", requests=asked))
            continue
        p = {node: np.array(answer.probabilities(), dtype=np.float64) for node, answer in nodes.items()}
        end = {node: max(0.0, 1.0 - float(v.sum())) for node, v in p.items()}
        first = p[None]
        second = np.zeros((10, 10))
        end2 = np.zeros((10, 10))
        for a in range(10):
            second[a] = p[str(a)]
            if a:
                for b in range(10):
                    end2[a, b] = end[f"{a}{b}"]
        end1 = np.array([end[str(a)] for a in range(10)])
        probs = digit_tree_distribution(first, end1, second, end2, p["10"][0], end["100"])
        if not float(probs.sum()) > 0:
            out.append(NumberRead(None, None, "the judge puts no probability on any integer 0..100 at the score position",
                                  requests=asked))
        else:
            out.append(NumberRead(probs, "tree", bound=0.0, requests=asked))
    return out


def remote_distributions(
    backend: Any,
    requests: Sequence[ChatRequest],
    responses: Sequence[ChatResponse],
    markers: Sequence[str | None],
    *,
    top_logprobs: int = TREE_TOP_LOGPROBS,
    tolerance: float = DEFAULT_TOLERANCE,
    groups: Sequence[Hashable] | None = None,
) -> list[NumberRead]:
    """For each (request, response, marker) of a non-local backend: the distribution of the number after
    ``marker`` (None: the answer's first number) - the released rule for whole-number tokens, a digit tree
    for numbers written digit by digit, or None with the reason. The tree is read exactly in one request
    per group (``groups[i]``, default one per response: give a caption's responses one group) on a backend
    that scores next tokens (:func:`exact_trees`), else from prefilled one-token requests
    (:func:`digit_trees`, within ``tolerance``; its request count is logged)."""
    reads: list[NumberRead | None] = [None] * len(requests)
    tree_rows, sites, roots = [], [], []
    for i, (response, marker) in enumerate(zip(responses, markers)):
        if not response.ok:
            reads[i] = NumberRead(None, None, response.error)
            continue
        problem = answer_problem(response)
        if problem is not None:
            reads[i] = NumberRead(None, None, f"malformed answer: {problem}")
            continue
        site = locate_number(response.tokens, marker, response.text)
        if site.kind is None and marker is not None and site.index < 0:
            reads[i] = _release_fallback(response, marker, site.error)
        elif site.kind is None:
            reads[i] = NumberRead(None, None, site.error)
        elif site.kind == "whole":
            tops = [t.ranked or t.top for t in response.tokens]  # listed order: a later duplicate wins, as released
            if marker is not None:
                p, why = alternatives_after_marker([t.token for t in response.tokens], tops, marker)
            else:
                p, why = score_token_distribution(tops[site.index])
            reads[i] = NumberRead(p, "alternatives" if p is not None else None, why)
        else:
            token = response.tokens[site.index]
            tree_rows.append(i)
            sites.append(site)
            roots.append(token.ranked or tuple(token.top.items()))
    if tree_rows and scores_next_tokens(backend):
        trees = exact_trees(backend, [requests[i] for i in tree_rows], sites,
                            [groups[i] if groups is not None else i for i in tree_rows])
    elif tree_rows:
        trees = digit_trees(backend, [requests[i] for i in tree_rows], sites, roots,
                            top_logprobs=top_logprobs, tolerance=tolerance)
    for i, read in zip(tree_rows, trees if tree_rows else ()):
        reads[i] = read
    return [r if r is not None else NumberRead(None, None, "no distribution") for r in reads]


def _release_fallback(response: ChatResponse, marker: str, error: str | None) -> NumberRead:
    """No number is written after ``marker``: the released rule still reads the alternatives of the token
    after it, which counts only where they are whole numbers (a multi-digit one listed); alternatives that
    are single digits only would be part of a number, so then no distribution (and the reason)."""
    texts = [t.token for t in response.tokens]
    tops = [t.ranked or t.top for t in response.tokens]
    p, why = alternatives_after_marker(texts, tops, marker)
    if p is None:
        return NumberRead(None, None, why or error)
    at = next((j for j, t in enumerate(texts) if marker in t), None)
    listed = tops[at + 1] if at is not None and at + 1 < len(tops) else ()
    pairs = listed.items() if isinstance(listed, dict) else listed
    if any(_is_digits(alt.strip()) and len(alt.strip()) >= 2 for alt, _ in pairs):
        return NumberRead(p, "alternatives")
    return NumberRead(None, None, f"{error}; its alternatives are single digits, part of a number at most")


def check_tolerance(tolerance: float) -> float:
    """``tolerance`` as a non-negative float; ValueError otherwise."""
    value = float(tolerance)
    if not value >= 0:
        raise ValueError(f"tolerance must be non-negative, got {tolerance!r}")
    return value


__all__ = [
    "DEFAULT_TOLERANCE",
    "NUM_SCORES",
    "NodeRead",
    "NumberRead",
    "NumberSite",
    "TREE_NODES",
    "check_tolerance",
    "digit_trees",
    "exact_trees",
    "lead_digit_ids",
    "locate_number",
    "read_node",
    "remote_distributions",
]
