"""FLEUR's score smoothing: pure math on the greedy answer and the token distributions.

No model code here. The scorer hands over the greedy answer (its text, which generation step produced
each character, the generated token ids) and the logits of the steps that matter; this module

1. reads the answer as a number the way the released FLEUR code does (keep digits and dots, strip
   leading/trailing dots, ``float``), checks it lies in [0, 1], and decides where the digits are read
   (:func:`parse_fleur_answer`);
2. turns logits into full-vocabulary digit probabilities (:func:`digit_probabilities`) and combines
   them into the FLEUR score (:func:`fleur_from_digit_probs`), in plain differentiable torch.

Definitions (FLEUR, Lee et al., ACL 2024; ``../shared/DESIGN.md``): p(i, j) is the softmax over the
whole vocabulary at the greedy step that produced the j-th decimal digit.
``FLEUR = 0.1 * sum_i i * p(i, 1) + 0.01 * sum_i i * p(i, 2)``, the second term only when the answer,
printed back as ``str(float(answer))``, has two (or more) decimals, so ``"0.50"`` counts as one decimal.
An answer equal to 1.0 scores ``0.9 * p("0") + p("1")`` read at the step of the units digit.
An answer that is not a number in [0, 1] has no score (a reason is given instead), never a silent 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Sequence

import torch

#: Reading rules: which steps are read and how they are combined.
ONE_DECIMAL = "one_decimal"
TWO_DECIMALS = "two_decimals"
ONE = "one"  # the answer is 1.0: 0.9 * p("0") + p("1") at the units step

#: Weights of the linear functional applied to p(0..9) at the (first, second) read step, per rule.
_W_DECIMAL = torch.arange(10, dtype=torch.float64) * 0.1
_W_SECOND = torch.arange(10, dtype=torch.float64) * 0.01
_W_ONE = torch.tensor([0.9, 1.0] + [0.0] * 8, dtype=torch.float64)


@dataclass(frozen=True)
class FleurReading:
    """Where and how to read one greedy answer.

    ``value`` is the answer as a number in [0, 1] (the raw, unsmoothed score) or None; ``rule`` is one
    of ``ONE_DECIMAL``, ``TWO_DECIMALS``, ``ONE`` or None; ``steps`` are the generation steps (0-based
    indices into the generated tokens) whose distributions are read, in order, and ``digits`` the digit
    the greedy answer shows at each of them; ``error`` says why there is no score (then ``rule`` is None).
    """

    value: float | None
    rule: str | None
    steps: tuple[int, ...] = ()
    digits: tuple[int, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the answer can be scored."""
        return self.rule is not None


def _failed(error: str, value: float | None = None) -> FleurReading:
    return FleurReading(value=value, rule=None, error=error)


def char_steps_from_prefixes(prefix_texts: Sequence[str]) -> tuple[str, list[int]]:
    """Map every character of a decoded answer to the generation step that produced it.

    ``prefix_texts[k]`` is the decoding of the first ``k + 1`` generated tokens. Returns the full text
    (``prefix_texts[-1]``) and, for each of its characters, the smallest step ``k`` whose decoding
    already ends with that character in place. Robust to decoders that strip or merge characters
    (SentencePiece's leading space, byte fallback): a character belongs to the first prefix that agrees
    with the final text up to and including it. Empty input gives ``("", [])``.
    """
    if not prefix_texts:
        return "", []
    final = prefix_texts[-1]
    owners: list[int] = []
    for step, text in enumerate(prefix_texts):
        common = 0
        limit = min(len(text), len(final))
        while common < limit and text[common] == final[common]:
            common += 1
        while len(owners) < common:
            owners.append(step)
    while len(owners) < len(final):  # unreachable: the last prefix agrees with itself
        owners.append(len(prefix_texts) - 1)
    return final, owners


def extract_number(text: str) -> tuple[str, list[int]]:
    """The released FLEUR reading of an answer: its ASCII digits and dots, outer dots stripped.

    Returns the number string and, for each of its characters, its index in ``text``
    (e.g. ``"Score: 0.85."`` gives ``("0.85", [7, 8, 9, 10])``; ``"no idea"`` gives ``("", [])``).
    """
    kept = [(c, i) for i, c in enumerate(text) if c == "." or "0" <= c <= "9"]
    start, end = 0, len(kept)
    while start < end and kept[start][0] == ".":
        start += 1
    while end > start and kept[end - 1][0] == ".":
        end -= 1
    kept = kept[start:end]
    return "".join(c for c, _ in kept), [i for _, i in kept]


def parse_fleur_answer(text: str, char_steps: Sequence[int] | None = None) -> FleurReading:
    """Decide whether and where the greedy answer ``text`` is read.

    ``char_steps[i]`` is the generation step that produced ``text[i]`` (see
    :func:`char_steps_from_prefixes`); without it every character is its own step. Returns a
    :class:`FleurReading`: for 1.0 the units digit's step (rule ``ONE``); below 1.0 the step of the first
    decimal digit and, when ``str(float(number))`` has two or more decimals, of the second; an answer
    written without a decimal point (``"0"``) is read at its units digit, as the released code does.
    No number, a malformed one (``"0.8.5"``) or one outside [0, 1] gives a reading with ``error`` set.
    """
    steps_of = list(char_steps) if char_steps is not None else list(range(len(text)))
    if len(steps_of) != len(text):
        raise ValueError(f"char_steps has {len(steps_of)} entries for a text of {len(text)} characters")
    number, positions = extract_number(text)
    shown = text.strip()
    if not number:
        return _failed(f"answer {shown!r} contains no number")
    try:
        value = float(number)
    except ValueError:
        return _failed(f"answer {shown!r} does not read as a number (digits and dots: {number!r})")
    if not 0.0 <= value <= 1.0:
        return _failed(f"answer {shown!r} reads as {value}, outside [0, 1]", value=value)
    if value == 1.0:
        dot = number.find(".")
        units = (dot if dot >= 0 else len(number)) - 1
        return FleurReading(value=value, rule=ONE, steps=(steps_of[positions[units]],), digits=(1,))
    printed = str(value)
    if "." not in printed or "e" in printed:
        return _failed(f"answer {shown!r} reads as {printed}, whose decimal digits cannot be located", value)
    decimals = printed.split(".", 1)[1]
    wanted = decimals[:2]
    dot = number.find(".")
    if dot < 0:  # "0": the released code reads the step of the only "0" token, the units digit
        read = [len(number) - 1]
        wanted = wanted[:1]
    else:
        read = [dot + 1 + j for j in range(len(wanted))]
        written = number[dot + 1 : dot + 1 + len(wanted)]
        if written != wanted:
            return _failed(
                f"answer {shown!r} prints as {printed}; its decimals {written!r} do not match {wanted!r}", value
            )
    steps = tuple(steps_of[positions[p]] for p in read)
    if len(set(steps)) != len(steps):
        return _failed(f"answer {shown!r}: two decimal digits come from one token; FLEUR needs one token per digit", value)
    rule = TWO_DECIMALS if len(steps) == 2 else ONE_DECIMAL
    return FleurReading(value=value, rule=rule, steps=steps, digits=tuple(int(c) for c in wanted))


def check_digit_tokens(reading: FleurReading, tokens: Sequence[int], digit_ids: Sequence[int]) -> FleurReading:
    """Confirm that each read step generated exactly the digit's own token; else a failed reading.

    ``tokens`` are the generated token ids, ``digit_ids[d]`` the id of the token for digit ``d``.
    Returns ``reading`` unchanged when it checks out (or already failed).
    """
    if not reading.ok:
        return reading
    for step, digit in zip(reading.steps, reading.digits):
        if step >= len(tokens) or int(tokens[step]) != int(digit_ids[digit]):
            got = int(tokens[step]) if step < len(tokens) else None
            return replace(
                reading,
                rule=None,
                steps=(),
                digits=(),
                error=f"digit {digit} at step {step} is token {got}, not the digit token {int(digit_ids[digit])}",
            )
    return reading


#: How the steps of the decimals are found: ``"step"`` (ours, default) reads the steps that wrote them;
#: ``"release"`` searches the generated tokens for the digit's token as the released ``fleur.py`` does.
DIGIT_SEARCHES = ("step", "release")


def release_token_search(reading: FleurReading, digit_of_token: Sequence[int | None]) -> FleurReading:
    """The steps the released ``fleur.py`` reads for the same answer, by searching the generated tokens.

    ``digit_of_token[t]`` is the digit the t-th generated token is (that digit's own token), else None.
    The release finds the first decimal's digit d1 among the tokens and takes its second occurrence when
    d1 is 0 and it occurs more than once (so "0.0" reads the decimal, not the units), else its first; the
    second decimal's digit d2: its second occurrence when it occurs more than once, else its only one; for
    "1.0" the occurrence of the token "1", which must be unique (the release fails otherwise).

    The second-decimal rule is an indexing accident: in "0.255" the second occurrence of "5" is the
    *third* decimal, so the release reads the wrong step; :func:`parse_fleur_answer` (our default) reads
    the step that wrote each decimal. Returns ``reading`` with the release's ``steps``, or a failed
    reading where the release's search fails (no such token; several "1" tokens).
    """
    if not reading.ok:
        return reading

    def positions(digit: int) -> list[int]:
        return [t for t, d in enumerate(digit_of_token) if d == digit]

    def failed(why: str) -> FleurReading:
        return replace(reading, rule=None, steps=(), digits=(), error=f"released token search: {why}")

    steps: list[int] = []
    for j, digit in enumerate(reading.digits):
        found = positions(digit)
        if not found:
            return failed(f"the answer has no token for the digit {digit}")
        if reading.rule == ONE:
            if len(found) > 1:
                return failed(f"the token '1' occurs {len(found)} times (the release cannot index that)")
            steps.append(found[0])
        elif j == 0:
            steps.append(found[1] if digit == 0 and len(found) > 1 else found[0])
        else:
            steps.append(found[1] if len(found) > 1 else found[0])
    return replace(reading, steps=tuple(steps))


def digit_probabilities(logits: torch.Tensor, digit_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Full-vocabulary softmax of ``logits`` (..., V) read at the ten digit tokens.

    Returns (..., 10) in float32 (float64 if the logits are): p(token "d"), each in [0, 1], summing to at
    most 1 (no renormalisation over digits). Differentiable.
    """
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    ids = torch.as_tensor(digit_ids, dtype=torch.long, device=logits.device)
    if ids.shape != (10,):
        raise ValueError(f"need exactly 10 digit token ids, got shape {tuple(ids.shape)}")
    return (logits.index_select(-1, ids) - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()


def expected_digit(probs: torch.Tensor) -> torch.Tensor:
    """``sum_i i * p(i)`` over the last dimension (size 10): in [0, 9]. Differentiable."""
    return (probs * torch.arange(10, dtype=probs.dtype, device=probs.device)).sum(-1)


def fleur_from_digit_probs(probs: torch.Tensor, rules: Sequence[str | None]) -> torch.Tensor:
    """FLEUR scores from the digit probabilities at the read steps.

    ``probs`` is (N, 2, 10): p(0..9) at the first and second read step of each answer (slots a rule
    does not read, e.g. the second one of ``ONE_DECIMAL`` and both of None, may hold anything, NaN too).
    ``rules[n]`` is ``ONE_DECIMAL``, ``TWO_DECIMALS``, ``ONE`` or None. Returns (N,) in [0, 1]:
    ``0.1 E[d1] (+ 0.01 E[d2])`` or ``0.9 p0 + p1``, NaN where the rule is None. Differentiable in
    ``probs`` (NaN rows get zero gradient).
    """
    if probs.ndim != 3 or probs.shape[1:] != (2, 10):
        raise ValueError(f"probs must have shape (N, 2, 10), got {tuple(probs.shape)}")
    if len(rules) != probs.shape[0]:
        raise ValueError(f"{len(rules)} rules for {probs.shape[0]} rows")
    known = {ONE_DECIMAL, TWO_DECIMALS, ONE, None}
    for n, rule in enumerate(rules):
        if rule not in known:
            raise ValueError(f"row {n}: unknown rule {rule!r}")
    dtype, device = probs.dtype, probs.device
    zero = torch.zeros(10, dtype=torch.float64)
    first = [(_W_ONE if r == ONE else _W_DECIMAL) for r in rules]
    second = [(_W_SECOND if r == TWO_DECIMALS else zero) for r in rules]
    weights = torch.stack([torch.stack(first), torch.stack(second)], dim=1) if rules else torch.zeros(0, 2, 10)
    weights = weights.to(dtype=dtype, device=device)
    valid = torch.tensor([r is not None for r in rules], dtype=torch.bool, device=device)
    used = torch.tensor([[r is not None, r == TWO_DECIMALS] for r in rules], dtype=torch.bool, device=device)
    used = used.reshape(-1, 2, 1)
    safe = torch.where(used, probs, torch.zeros((), dtype=dtype, device=device))  # unused slots may hold NaN
    score = (safe * weights).sum(dim=(1, 2))
    return torch.where(valid, score, torch.full((), float("nan"), dtype=dtype, device=device))


def raw_scores(readings: Sequence[FleurReading], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The paper's raw-score ablation: the greedy answer as a number, (N,), NaN where unreadable."""
    return torch.tensor([r.value if r.ok else float("nan") for r in readings], dtype=dtype)
