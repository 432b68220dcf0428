"""JSON Lines: reading files with errors that name the offending line, and writing lines that no text
can break."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from .text import encodable


def json_line(value: Any) -> str:
    """``value`` as one line of JSON (no newline) that always encodes as UTF-8.

    Non-ASCII text is written as it is, except in a value holding text that UTF-8 cannot encode (a
    lone surrogate such as ``"\\ud800"``, what a truncated emoji escape in scraped text decodes to):
    that value is written with ``\\uXXXX`` escapes throughout, which every JSON reader decodes back to
    the same string (so an id read back equals the manifest's). NaN/Infinity are written as Python's
    ``json`` writes them."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    return text if encodable(text) else json.dumps(value, ensure_ascii=True, allow_nan=True)


def parse_json_text(text: str | bytes, where: str, error: type[Exception] = ValueError) -> Any:
    """The JSON value of ``text`` (bytes must be UTF-8); anything that is not one is ``error`` with a
    message starting ``"<where>: "``: invalid UTF-8 (the byte's column), invalid JSON (the parser's
    reason), nesting too deep for the parser, or an integer over Python's limit on the digits of an
    int read from text (``sys.get_int_max_str_digits()``, 4300 by default)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where}: not valid UTF-8 (byte 0x{text[exc.start]:02x} at column {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:  # int('9' * 5000): "Exceeds the limit (4300 digits) for integer string conversion"
        limit = sys.get_int_max_str_digits()
        raise error(f"{where}: a number with more than {limit} digits ({exc})") from None


def json_lines(path: Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, str, Any]]:
    """``(lineno, where, value)`` for every non-blank line of ``path`` (an open-able JSONL file), with
    ``lineno`` 1-based and ``where`` = ``"<path>:<lineno>"``. A line that is not JSON (invalid UTF-8,
    invalid JSON, too deeply nested, an integer over Python's digit limit) raises ``error`` with
    ``"<where>: <what>"`` (see :func:`parse_json_text`); blank lines are skipped. A path that is not a
    regular file (a FIFO, a device, a directory: :mod:`capreward.input_files`) raises ``error`` naming it,
    before anything is read."""
    from .input_files import NotARegularFile, open_regular_stream

    try:
        f = open_regular_stream(path, "the file")
    except NotARegularFile as exc:
        raise error(str(exc)) from None
    with f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
                line = line[3:]
            yield lineno, where, parse_json_text(line, where, error)
