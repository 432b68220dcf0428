"""Caller text inside judge prompts is data: it never becomes prompt structure.

Captions, references and the judge's own earlier answers are put into prompts whose structure (turns,
roles, the image slot, the end of a turn) is made of special tokens and template text. This module keeps
the two apart:

- :func:`fill_once`: fill a template's placeholders in a single pass, so no inserted text is scanned
  again (a caption "[context]" stays the text "[context]").
- :class:`Data`: marks a piece of a prompt as caller text. A local judge encodes such pieces without
  special tokens (:func:`literal_token_ids`): a caption's "</s>" is the characters ``<``, ``/``, ``s``,
  ``>``, never the end-of-turn token, and its "<image>" never an image slot.
- :func:`escape_special_tokens`: for servers, which tokenise on their side, break every special-token
  string (the common families', see :data:`SPECIAL_TOKEN_PATTERN`) with a space so that no tokenizer
  matches it. What this cannot neutralise: special tokens of a shape the pattern does not know, a server
  that normalises text before matching its special tokens in other ways than NFKC, and role markers
  written as plain text ("USER:"), which are ordinary text to every tokenizer (the injection guard,
  :mod:`capreward.judges.injection`, flags those).
- :func:`visible_text` / :func:`is_blank`: a caption that is empty once special-token strings, invisible
  format characters and control characters are removed is an empty caption.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

from ..caption_reading import is_invisible
from ..caption_reading import strip_invisible as _strip_invisible
from ..text import well_formed

#: Special-token strings of the common chat-model families, and the shapes they come in: LLaMA/LLaVA
#: ``<s>``/``</s>``/``<unk>``/``<pad>``/``<image>``, Gemma ``<start_of_turn>``/``<bos>``, ChatML, LLaMA-3 and
#: Phi ``<|...|>``, LLaMA-2 ``<<SYS>>``, Mistral ``[INST]``/``[/INST]``/``[IMG]``.
SPECIAL_TOKEN_PATTERN = re.compile(
    r"<\|[^<>|\s]{1,40}\|>"  # <|im_start|>, <|eot_id|>, <|image_pad|>
    r"|</?[A-Za-z_][A-Za-z0-9_.:-]{0,40}>"  # <s>, </s>, <image>, <start_of_turn>, <0x0A>
    r"|<</?SYS>>"
    r"|\[/?(?:INST|IMG|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS)\]"
)

#: Unicode bidirectional embedding/override/isolate controls (U+202A-U+202E, U+2066-U+2069).
BIDI_CONTROLS = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))


@dataclass(frozen=True)
class Data:
    """A piece of a prompt that is caller text (a caption, references, an earlier answer): a local
    judge encodes it without special tokens. Prompts given as parts are sequences of ``str`` (template
    text, whose special-token strings are special tokens) and :class:`Data`."""

    text: str


PromptParts = Sequence["str | Data"]


def render(parts: PromptParts) -> str:
    """The prompt text of ``parts`` (template and data pieces joined)."""
    return "".join(p.text if isinstance(p, Data) else p for p in parts)


def data_spans(parts: PromptParts) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the :class:`Data` pieces in :func:`render` ``(parts)``."""
    spans, at = [], 0
    for p in parts:
        text = p.text if isinstance(p, Data) else p
        if isinstance(p, Data) and text:
            spans.append((at, at + len(text)))
        at += len(text)
    return spans


def fill_once(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every occurrence of each key of ``values`` replaced by its value, in one pass
    over the template: inserted values are never scanned again, so a value holding another placeholder
    stays as written. Longer keys win where keys overlap."""
    if not values:
        return template
    keys = sorted(values, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(k) for k in keys))
    return pattern.sub(lambda m: values[m.group(0)], template)


def fill_parts(template: str, values: Mapping[str, str]) -> list[str | Data]:
    """As :func:`fill_once`, but the result as parts: template text as ``str``, each inserted value as
    :class:`Data`."""
    keys = sorted(values, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(k) for k in keys))
    parts: list[str | Data] = []
    at = 0
    for m in pattern.finditer(template):
        parts.append(template[at : m.start()])
        parts.append(Data(values[m.group(0)]))
        at = m.end()
    parts.append(template[at:])
    return [p for p in parts if not (isinstance(p, str) and p == "")]


# ---------------------------------------------------------------------------------- text level
def _is_invisible(ch: str) -> bool:
    """What :func:`capreward.caption_reading.is_invisible` names: format and control characters (other
    than tab/newline/CR), every default-ignorable code point (the tag block, variation selectors, Hangul
    fillers, U+034F) and U+2800."""
    return is_invisible(ch)


#: The ASCII characters that are not printable, other than tab, newline and carriage return.
_ASCII_INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def strip_invisible(text: str) -> str:
    """``text`` without invisible characters: format characters (zero-width spaces and joiners, bidi
    controls, BOM), control characters other than tab, newline and carriage return (NUL, ESC, ...), the
    other default-ignorable code points (the tag block U+E0000-U+E0FFF, variation selectors, Hangul
    fillers, U+034F) and U+2800. What is sent to a judge never holds them (:func:`escape_special_tokens`,
    :func:`encode_parts`): a person does not read them, so a caption cannot write to the judge with them."""
    if text.isascii() and (text.isprintable() or _ASCII_INVISIBLE.search(text) is None):
        return text
    return _strip_invisible(text)  # one regular-expression pass: linear in the text


def special_token_matches(text: str, extra: Iterable[str] = ()) -> list[str]:
    """The special-token strings in ``text`` (and in its NFKC form, which a server's normaliser may
    produce): the common families' (:data:`SPECIAL_TOKEN_PATTERN`) and ``extra`` ones, in order found."""
    extra = [e for e in extra if e]
    found = [m for form in dict.fromkeys((text, unicodedata.normalize("NFKC", text))) for m in _matches(form, extra)]
    return list(dict.fromkeys(found))


def _matches(text: str, extra: Sequence[str]) -> list[str]:
    return [m.group(0) for m in SPECIAL_TOKEN_PATTERN.finditer(text)] + [e for e in extra if e in text]


def visible_text(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` without special-token strings (common families' and ``extra``), format and control
    characters, and outer whitespace. Removal repeats until nothing is left to remove, so pieces
    joined by a removal ("<s<s>>") are removed too."""
    extra = sorted((e for e in extra if e), key=len, reverse=True)
    out = strip_invisible(text)
    while True:
        before = out
        out = SPECIAL_TOKEN_PATTERN.sub("", out)
        for e in extra:
            out = out.replace(e, "")
        if out == before:
            return out.strip()


def is_blank(text: str, extra: Iterable[str] = ()) -> bool:
    """True when nothing visible is left of ``text`` once special-token strings, format and control
    characters are removed (an "empty caption")."""
    return not visible_text(text, extra)


def escape_special_tokens(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every special-token string (the common families' shapes and ``extra``) broken by a
    space after its first character ("</s>" -> "< /s>"), so that no tokenizer can match it as a special
    token; other text is unchanged. When the NFKC form of ``text`` holds special-token strings that the
    text itself does not (full-width "＜/s＞"), the NFKC form is escaped instead. Repeats until no
    special-token string is left. Invisible characters (:func:`strip_invisible`) are removed first."""
    extra = [e for e in extra if len(e) > 1]
    text = strip_invisible(text)
    nfkc = unicodedata.normalize("NFKC", text)
    if nfkc != text and len(_matches(nfkc, extra)) > len(_matches(text, extra)):
        text = nfkc
    for _ in range(len(text) + 1):
        cuts = {m.start() + 1 for m in SPECIAL_TOKEN_PATTERN.finditer(text)}
        for e in extra:
            start = text.find(e)
            while start >= 0:
                cuts.add(start + 1)
                start = text.find(e, start + 1)
        if not cuts:
            return text
        pieces, prev = [], 0
        for cut in sorted(cuts):
            pieces.append(text[prev:cut])
            prev = cut
        pieces.append(text[prev:])
        text = " ".join(pieces)
    return text  # pragma: no cover - every round adds a space inside each match, so the loop ends


# --------------------------------------------------------------------------------- token level
def control_token_ids(tokenizer: Any, extra: Iterable[int] = ()) -> set[int]:
    """Ids a tokenizer treats as structure: its special tokens and every added token (LLaVA's
    ``<image>``, ``<pad>``), plus ``extra``."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids |= {int(i) for i in decoder}
    ids |= {int(i) for i in extra}
    return ids


def control_token_strings(tokenizer: Any, extra: Iterable[int] = ()) -> list[str]:
    """The text of every :func:`control_token_ids` token (what a caption must not be able to write)."""
    ids = sorted(control_token_ids(tokenizer, extra))
    texts = tokenizer.convert_ids_to_tokens(ids)
    return [t for t in texts if isinstance(t, str) and t]


def literal_token_ids(tokenizer: Any, text: str, control: set[int]) -> list[int]:
    """Token ids that spell ``text`` character by character with no control token: each character's
    own vocabulary entry, else its UTF-8 bytes as byte-fallback tokens (``<0x3C>``), else what the
    tokenizer makes of the character alone with special-token splitting; a character with none of these
    is left out."""
    vocab = tokenizer.get_vocab()
    out: list[int] = []
    for ch in text:
        tid = vocab.get(ch)
        if tid is not None and tid not in control:
            out.append(int(tid))
            continue
        fallback = [vocab.get(f"<0x{b:02X}>") for b in ch.encode("utf-8")]
        if fallback and all(f is not None and f not in control for f in fallback):
            out.extend(int(f) for f in fallback)
            continue
        ids = tokenizer(ch, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if ids and not any(int(i) in control for i in ids):
            out.extend(int(i) for i in ids)
    return out


def encode_parts(tokenizer: Any, parts: PromptParts, control: set[int], add_special_tokens: bool = True) -> list[int]:
    """Token ids of ``parts``: the rendered prompt encoded as a whole (so clean prompts get exactly the
    ids of encoding the text), then every control token that overlaps a :class:`Data` piece re-spelled
    as its literal characters (:func:`literal_token_ids`). Template text keeps its special tokens; the
    :class:`Data` pieces lose their invisible characters (:func:`strip_invisible`)."""
    parts = [Data(strip_invisible(p.text)) if isinstance(p, Data) else p for p in parts]
    text = well_formed(render(parts))  # lone surrogates as U+FFFD: the same length, the same spans
    spans = data_spans(parts)
    if not spans:
        return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
    encoded = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return _respell(tokenizer, text, encoded["input_ids"], encoded["offset_mapping"], spans, control)


def encode_parts_many(
    tokenizer: Any, prompts: Sequence[PromptParts], control: set[int], add_special_tokens: bool = True
) -> list[list[int]]:
    """:func:`encode_parts` of each prompt (the same ids), the rendered prompts encoded in one tokenizer
    call: a batch of short prompts (one claim each) costs one call instead of one per prompt."""
    cleaned = [[Data(strip_invisible(p.text)) if isinstance(p, Data) else p for p in parts] for parts in prompts]
    texts = [well_formed(render(parts)) for parts in cleaned]
    spans = [data_spans(parts) for parts in cleaned]
    out: list[list[int]] = [[] for _ in texts]
    plain = [i for i, s in enumerate(spans) if not s]  # all template: no offsets needed (slow tokenizers too)
    if plain:
        ids = tokenizer([texts[i] for i in plain], add_special_tokens=add_special_tokens)["input_ids"]
        for i, row in zip(plain, ids):
            out[i] = list(row)
    data = [i for i, s in enumerate(spans) if s]
    if data:
        encoded = tokenizer([texts[i] for i in data], add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        for i, row, offsets in zip(data, encoded["input_ids"], encoded["offset_mapping"]):
            out[i] = _respell(tokenizer, texts[i], row, offsets, spans[i], control)
    return out


def _respell(tokenizer: Any, text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]],
             spans: list[tuple[int, int]], control: set[int]) -> list[int]:
    """``ids`` with every control token that overlaps a data span re-spelled as its literal characters."""
    out: list[int] = []
    for tid, (start, end) in zip(ids, offsets):
        # the span test only for control tokens (rare): it was most of the cost of encoding a prompt
        if int(tid) in control and end > start and any(start < e and end > s for s, e in spans):
            out.extend(literal_token_ids(tokenizer, text[start:end], control))
        else:
            out.append(int(tid))
    return out
