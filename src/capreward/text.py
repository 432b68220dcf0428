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


#: Characters of a value an error message echoes (:func:`capped`).
ECHO_CHARS = 80


def capped(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for an error message, at most about ``limit`` characters: a longer str (a 1 MB
    "metric name") is shown by its first ``limit`` characters and its length, so an echo never costs
    more than the message. Other values by their ``repr``, cut the same way.

    >>> capped("emscor")
    "'emscor'"
    >>> capped("x" * 1_000_000).endswith("xxx'... (1000000 characters)")
    True
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    import reprlib

    short = reprlib.Repr()  # containers cut to a few entries before anything is written out
    short.maxstring = short.maxother = limit
    text = short.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
