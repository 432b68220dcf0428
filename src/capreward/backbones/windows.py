"""The whole caption through a bounded text context: sentence- and clause-aligned windows, and how their
embeddings combine into one caption's embeddings.

A CLIP-family text tower reads at most its context (77 positions for CLIP, 64 for SigLIP, 248 for
Long-CLIP). A caption whose text, with the metric's template (CLIP-S's ``"A photo depicts "``) and the
tower's special tokens, fits the context is one window: the caption itself, encoded exactly as the
released metrics encode it. A longer caption is split into windows (:func:`split_windows`), each of
which fits the context with the template in front of it:

1. at sentence ends (``.``, ``!``, ``?`` followed by white space; line breaks), consecutive sentences
   packed greedily while the window fits;
2. a sentence that does not fit alone is split at clause marks (``,``, ``;``, ``:`` followed by white
   space), the clauses packed the same way;
3. a clause that does not fit alone is split at white space (words packed greedily);
4. a word that does not fit alone is cut into the longest character runs that fit.

Every window is scored as a caption of its own (template, SOS and EOS included, so each reads as the
metric defines a caption) and the windows combine (:func:`combine_windows`) into the caption's:

- **pooled embedding** f_X = normalise(Σ_k n_k e_k), e_k the window's (normalised) caption embedding and
  n_k its number of caption tokens (the window's tokens other than the template and special tokens), a
  length-weighted mean, so a long sentence counts more than a short one; with one window f_X = e_1;
- **token embeddings** (EMScore's fine-grained set, and the token → frame alignment of the hallucination
  penalty): the union of the windows' token embeddings, in caption order (each window's SOS..EOS).

Nothing of the caption is dropped, so a hallucinated sentence after the context lowers the pooled
similarity (CLIP-S, EMScore's coarse part) and adds unsupported tokens (EMScore's precision, the
hallucination penalty). ``long_captions="truncate"`` on the scorers keeps the released behaviour (the
caption cut to the context, EOS kept) and reports which captions were cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

LONG_CAPTION_MODES = ("windows", "truncate")

#: Split points, coarsest first: sentence ends (and line breaks), clause marks, white space.
SPLIT_LEVELS = (
    re.compile(r"(?<=[.!?\u3002\uff01\uff1f])[\"')\]\u201d\u2019]*\s+|\n+"),
    re.compile(r"(?<=[,;:\uff0c\uff1b\uff1a])\s+"),
    re.compile(r"\s+"),
)


def check_long_captions(mode: str) -> str:
    """``mode`` if it is one of :data:`LONG_CAPTION_MODES`, else ValueError naming them."""
    if mode not in LONG_CAPTION_MODES:
        raise ValueError(f"long_captions must be one of {LONG_CAPTION_MODES}, got {mode!r}")
    return mode


def _pieces(text: str, pattern: re.Pattern) -> list[str]:
    """``text`` cut after each match of ``pattern`` (the separator stays with the piece before it)."""
    pieces, start = [], 0
    for m in pattern.finditer(text):
        if m.end() > start:
            pieces.append(text[start : m.end()])
            start = m.end()
    if start < len(text):
        pieces.append(text[start:])
    return [p for p in pieces if p.strip()]


def _largest(holds: Callable[[int], bool], n: int) -> int:
    """The largest k in [1, n] with ``holds(k)``, given ``holds(1)``, for a ``holds`` true up to some k
    and false after it: doubling then bisecting, O(log k) calls."""
    lo, hi = 1, 2
    while hi <= n and holds(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi - 1, n)  # holds(lo); not holds(hi + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _longest_fitting_prefix(text: str, fits: Callable[[str], bool]) -> int:
    """The largest n with ``fits(text[:n])`` (0 if none), found by doubling then bisecting, so that no
    call reads much more than twice a window (a caption-long "word" is never tokenised whole again)."""
    if not text or not fits(text[:1]):
        return 0
    return _largest(lambda n: fits(text[:n]), len(text))


def _pack(text: str, fits: Callable[[str], bool], level: int) -> list[str]:
    """Greedy packing of ``text``'s pieces at ``level`` (the most consecutive pieces that fit, found by
    doubling then bisecting rather than piece by piece: O(log) tokenisations per window); a piece that
    does not fit alone is packed at the next level."""
    if level == len(SPLIT_LEVELS):  # one word longer than the context: cut it into fitting runs
        out, rest = [], text.strip()
        while rest:
            n = _longest_fitting_prefix(rest, fits)
            if n == 0:
                raise ValueError("the text context cannot hold even one character after the template")
            out.append(rest[:n])
            rest = rest[n:]
        return out
    pieces = _pieces(text, SPLIT_LEVELS[level])
    windows: list[str] = []
    i = 0
    while i < len(pieces):
        if not fits(pieces[i].strip()):
            windows.extend(_pack(pieces[i], fits, level + 1))
            i += 1
            continue
        def fits_from(k: int, start: int = i) -> bool:
            return fits("".join(pieces[start : start + k]).strip())

        k = _largest(fits_from, len(pieces) - i)
        windows.append("".join(pieces[i : i + k]).strip())
        i += k
    return windows


def split_windows(caption: str, fits: Callable[[str], bool]) -> list[str]:
    """The windows of ``caption``: ``[caption]`` (unchanged) when ``fits(caption)``, else the sentence-,
    clause-, word- then character-aligned windows described in the module doc, each with
    ``fits(window)`` true, in caption order, together holding every non-space character of the caption.

    Args:
        caption: the caption text (without the metric's template).
        fits: whether a window's text, with the template and special tokens, fits the text context.

    Returns:
        The windows' texts.

    Raises:
        ValueError: when not even one character fits (a template as long as the context).

    Examples:
        >>> fits = lambda text: len(text.split()) <= 4
        >>> split_windows("a red car. a dog runs, a cat sleeps on a mat.", fits)
        ['a red car.', 'a dog runs,', 'a cat sleeps on', 'a mat.']
    """
    if fits(caption):
        return [caption]
    return _pack(caption, fits, 0)


def combine_windows(
    tokens: Sequence[torch.Tensor], pooled: Sequence[torch.Tensor], counts: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One caption's ``(tokens [sum L_k, D], pooled [D])`` from its windows' token embeddings
    ``tokens[k]`` [L_k, D], pooled embeddings ``pooled[k]`` [D] (normalised) and caption-token counts
    ``counts[k]``: the union of the token embeddings and normalise(Σ_k counts[k] · pooled[k]). One window
    is returned as it is (bit for bit)."""
    if len(tokens) == 1:
        return tokens[0], pooled[0]
    weights = torch.tensor([max(1, int(c)) for c in counts], dtype=pooled[0].dtype, device=pooled[0].device)
    mixed = (torch.stack(list(pooled)) * weights[:, None]).sum(0)
    return torch.cat(list(tokens)), F.normalize(mixed, dim=-1)
