"""Text that UTF-8 cannot encode: Python strings may hold lone surrogates (``"\\ud800"``, what a truncated
emoji escape in scraped JSON decodes to). Writers escape them (:func:`printable`); models read each as
U+FFFD, the replacement character (:func:`well_formed`), as CLIP's own text cleaning (ftfy) does."""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> bool:
    """Whether UTF-8 can encode ``text`` (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def well_formed(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (unchanged when it has none): what a
    tokenizer is given."""
    return text if encodable(text) else _SURROGATE.sub("\ufffd", text)


def printable(text: str) -> str:
    """``text`` with every lone surrogate written as its ``\\udXXX`` escape, for writers of plain text
    (CSV, HTML, messages) that must not fail on it."""
    return text if encodable(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")
