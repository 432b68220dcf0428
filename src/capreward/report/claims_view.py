"""The claim reward's flag view in ``capreward report``: each claim of a caption, verified or not, with its
span in the caption highlighted.

``capreward score --metrics claims`` writes, per row, ``claims/claims``: the caption's claims as
``{"text", "start", "end", "p"}`` (``p``: the judge's probability that the claim holds; ``null`` when the
claim has no verdict; ``start``/``end``: the claim's span ``[start, end)`` in the caption, -1 when the
judge's splitter wrote a fact that is not in the caption). A claim is *verified* at ``p >= 0.5`` (the
threshold of :attr:`capreward.scorers.claims.ClaimVerdict.verified`).

:func:`claims_section` shows the caption with every claim's span marked (verified: green; not verified:
red, underlined; no verdict: grey) and the list of claims with their verdicts. A span that does not
point at the claim's text (a caption read before splitting: invisible characters removed) is looked up
in the caption instead; a claim found nowhere is listed without a mark.

Example::

    >>> row = {"caption": "a red ball. a blue cat.",
    ...        "claims/claims": [{"text": "a red ball", "start": 0, "end": 10, "p": 0.9},
    ...                          {"text": "a blue cat", "start": 12, "end": 22, "p": 0.2}]}
    >>> [(v.text, v.verdict) for v in claim_verdicts(row)]
    [('a red ball', 'verified'), ('a blue cat', 'not verified')]
    >>> 'class="claim unverified"' in claims_section(row)
    True
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from ..names import sub_score

#: The probability at which a claim counts as verified (ClaimVerdict.verified).
VERIFIED_AT = 0.5

FIELD = sub_score("claims", "claims")

STYLE = """
.claims { margin: 0.4em 0; }
.claim { padding: 1px 2px; border-radius: 3px; }
.claim.verified { background: #d5f5d5; }
.claim.unverified { background: #fbd3d3; text-decoration: underline wavy #d00; }
.claim.unread { background: #e4e4e4; }
.claims li.unverified { color: #b00; }
.claims li .p { font-family: monospace; color: #555; }
"""


@dataclass(frozen=True)
class ShownClaim:
    """One claim as the report shows it: ``text``, its span ``[start, end)`` in the caption (-1: none
    found) and ``p`` (None: no verdict)."""

    text: str
    start: int
    end: int
    p: float | None

    @property
    def verdict(self) -> str:
        """``"verified"``, ``"not verified"`` or ``"no verdict"``."""
        if self.p is None:
            return "no verdict"
        return "verified" if self.p >= VERIFIED_AT else "not verified"

    @property
    def css(self) -> str:
        return {"verified": "verified", "not verified": "unverified"}.get(self.verdict, "unread")


def verdicts_problem(value: Any) -> str | None:
    """Why ``value`` (a row's ``claims/claims``) is not the list ``capreward score`` writes, or None."""
    if not isinstance(value, list):
        return f"'{FIELD}' is a {type(value).__name__}, not a list of claims"
    for k, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            return f"'{FIELD}[{k}]' is not a claim object with a 'text'"
        for key in ("start", "end"):
            if not isinstance(item.get(key), int) or isinstance(item.get(key), bool):
                return f"'{FIELD}[{k}].{key}' is not an integer"
        p = item.get("p")
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1):
            return f"'{FIELD}[{k}].p' is not a probability"
    return None


class _Spans:
    """Finds each claim's span in one caption, in time linear in the caption and the claims.

    The caption is lowered once; ``taken`` marks the characters of spans already given (a bytearray, so
    an overlap test is one C-speed ``find``); each claim text keeps a cursor past the occurrences already
    found taken (spans are only ever added, so a taken occurrence stays taken), and the search for a
    claim starts where the previous claim ended (the claims are listed in caption order), going back to
    the caption's start only when nothing free follows. So listing the same claim 800 times, or 800
    claims whose spans are stale, costs one pass over the caption per distinct text, not one pass per
    claim per earlier claim (85 s for 800 claims before)."""

    def __init__(self, caption: str):
        lower = caption.lower()
        # a letter whose lower case is longer ("İ") would shift every index after it: compare as given
        self.caption, self.lower = caption, (lower if len(lower) == len(caption) else caption)
        self.taken = bytearray(len(caption))
        self.cursor: dict[str, int] = {}
        self.after = 0  # where the previous claim's span ended

    def _first_free(self, needle: str, start: int, stop: int | None = None) -> int:
        """The position of the first free occurrence of ``needle`` starting in [start, stop), or -1."""
        at, n = start, len(needle)
        end = len(self.lower) if stop is None else min(len(self.lower), stop + n - 1)
        while (at := self.lower.find(needle, at, end)) >= 0:
            if self.taken.find(1, at, at + n) < 0:
                return at
            at += 1
        return -1

    def locate(self, text: str, start: int, end: int) -> tuple[int, int]:
        """The claim's span: as written when it points at the claim's text, else the first free
        occurrence of the text (case ignored) from the previous claim's end, else from the start,
        else (-1, -1)."""
        caption = self.caption
        if 0 <= start < end <= len(caption) and caption[start:end].lower() == text.lower():
            self._take(start, end)
            return start, end
        needle = text.lower() if self.lower is not caption else text
        if not needle:
            return -1, -1
        cursor = self.cursor.get(needle, 0)  # every occurrence starting before it is taken
        at = self._first_free(needle, self.after) if self.after > cursor else -1
        if at < 0:  # nothing free after the previous claim: from the cursor (up to there)
            at = self._first_free(needle, cursor, self.after if self.after > cursor else None)
            self.cursor[needle] = len(caption) + 1 if at < 0 else at + 1
        if at < 0:
            return -1, -1
        self._take(at, at + len(needle))
        return at, at + len(needle)

    def _take(self, start: int, end: int) -> None:
        self.taken[start:end] = b"\x01" * (end - start)
        self.after = end


def claim_verdicts(row: dict) -> list[ShownClaim] | None:
    """The claims of ``row`` with spans checked against its caption; None when the row has none."""
    value = row.get(FIELD, row.get("claims.claims"))
    if value is None or verdicts_problem(value) is not None:
        return None
    caption = given if isinstance(given := row.get("caption"), str) else ""
    spans = _Spans(caption)
    out: list[ShownClaim] = []
    for item in value:
        start, end = spans.locate(item["text"], item["start"], item["end"])
        p = item.get("p")
        out.append(ShownClaim(item["text"], start, end, None if p is None or math.isnan(p) else float(p)))
    return out


def has_unverified(row: dict) -> bool:
    """Whether a claim of ``row`` is not verified (or has no verdict): the row is flagged."""
    return any(c.verdict != "verified" for c in claim_verdicts(row) or [])


def marked_caption(caption: str, claims: list[ShownClaim]) -> str:
    """``caption`` as HTML with each claim's span wrapped in ``<mark class="claim ...">`` (overlapping
    spans: the first wins; the rest of the caption escaped as text)."""
    spans = sorted((c for c in claims if c.start >= 0), key=lambda c: (c.start, c.end))
    parts, at = [], 0
    for k, c in enumerate(spans):
        if c.start < at:
            continue
        p = "no verdict" if c.p is None else f"p = {c.p:.3f}"
        parts.append(html.escape(caption[at : c.start]))
        parts.append(f'<mark class="claim {c.css}" data-claim="{k}" title="{html.escape(c.verdict)}: {p}">'
                     f"{html.escape(caption[c.start : c.end])}</mark>")
        at = c.end
    parts.append(html.escape(caption[at:]))
    return "".join(parts)


def claims_section(row: dict) -> str:
    """The flag view of ``row``'s claims: the caption with marked spans and the list of verdicts; ``""``
    when the row has no ``claims/claims``."""
    claims = claim_verdicts(row)
    if not claims:
        return ""
    caption = given if isinstance(given := row.get("caption"), str) else ""
    n_ok = sum(c.verdict == "verified" for c in claims)
    items = "".join(
        f'<li class="{c.css}">{html.escape(c.verdict)} <span class="p">'
        f'{"" if c.p is None else f"p = {c.p:.3f}"}</span>: {html.escape(c.text)}'
        f'{"" if c.start >= 0 else " <em>(not in the caption)</em>"}</li>'
        for c in claims)
    return (f'<div class="claims"><div class="caption claims-caption">{marked_caption(caption, claims)}</div>'
            f"<details><summary>claims: {n_ok} of {len(claims)} verified</summary><ul>{items}</ul></details></div>")
