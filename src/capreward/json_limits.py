"""Bounds on decoded JSON from clients, each refusal naming the field (``labels[3].visual_id``).

:func:`loads` decodes a request body (or a label sent as a JSON string) and :func:`check` walks a
decoded value; both raise :class:`JSONLimitError` naming where the value breaks a bound
(``labels[0].visual_id is an integer of 5000 digits, out of range (at most 64-bit signed)``):

- numbers out of range: an integer outside the signed 64-bit range (Python would otherwise parse any
  length, slowly, and refuse more than 4300 digits with a bare ValueError), a number like ``1e999``
  that overflows to infinity;
- nesting deeper than ``max_depth`` (bodies nested past Python's recursion limit included: the path
  is found by a scan of the text's brackets, as the decoder itself gives up);
- a string longer than ``max_string_chars``, an array longer than ``max_array_length``.

``NaN``/``Infinity`` literals decode as before (and are refused where a field wants a string).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .errors import CaprewardError

INT64 = 2**63


@dataclass(frozen=True)
class JSONLimits:
    """``max_depth``: containers nested in one another (the body object is depth 1);
    ``max_string_chars``: characters of one string (keys included); ``max_array_length``: entries of
    one array."""

    max_depth: int = 32
    max_string_chars: int = 1 << 18
    max_array_length: int = 4096


class JSONLimitError(CaprewardError, ValueError):
    """A decoded value breaks a bound; ``where`` is the field's path and the message names it."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{_shorten(where) or 'the body'} {problem}")
        self.where = where


_SEGMENT = re.compile(r'\[(?:"(?:[^"\\]|\\.)*"|[^\]]*)\]|\.?[^.\[]+')


def _shorten(where: str, keep: int = 6) -> str:
    """A path of at most ``keep`` segments (``labels[0][0][0]...``): a deep one is mostly ``[0]``."""
    segments = _SEGMENT.findall(where)
    return where if len(segments) <= keep + 1 else "".join(segments[:keep]) + "..."


class _OutOfRange:
    """What the decoder puts in place of a number out of range (reported by :func:`check`)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def problem(self) -> str:
        digits = sum(c.isdigit() for c in self.text)
        if re.fullmatch(r"-?\d+", self.text):
            return f"is an integer of {digits} digits, out of range (at most 64-bit signed)"
        shown = self.text if len(self.text) <= 40 else self.text[:40] + "..."
        return f"is the number {shown}, out of range"


def _parse_int(text: str) -> int | _OutOfRange:
    if len(text) > 20:  # more digits than any 64-bit integer: never converted (quadratic in length)
        return _OutOfRange(text)
    value = int(text)
    return value if -INT64 <= value < INT64 else _OutOfRange(text)


def _parse_float(text: str) -> float | _OutOfRange:
    value = float(text)
    return value if math.isfinite(value) else _OutOfRange(text)


_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float)


def _key(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
        return name
    shown = json.dumps(name[:40] + ("..." if len(name) > 40 else ""))
    return f"[{shown}]"


def _join(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    part = _key(key)
    return f"{where}{part}" if part.startswith("[") or not where else f"{where}.{part}"


def check(value: Any, limits: JSONLimits = JSONLimits(), where: str = "", depth: int = 0) -> None:
    """Raise :class:`JSONLimitError` naming the first field of ``value`` (decoded JSON, or the same
    shapes built in Python) that breaks ``limits``; ``where`` is ``value``'s own path, ``depth`` the
    containers it is already inside."""
    stack = [(value, where, depth)]
    while stack:
        item, path, level = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if level + 1 > limits.max_depth:
                raise JSONLimitError(path, f"is nested too deeply (more than {limits.max_depth} levels)")
            if isinstance(item, dict):
                children = list(item.items())
                for key, _ in children:
                    if isinstance(key, str) and len(key) > limits.max_string_chars:
                        raise JSONLimitError(path, f"has a key of {len(key)} characters, over the limit of "
                                                   f"{limits.max_string_chars}")
            else:
                if len(item) > limits.max_array_length:
                    raise JSONLimitError(path, f"has {len(item)} entries, over the limit of {limits.max_array_length}")
                children = list(enumerate(item))
            stack.extend((child, _join(path, key), level + 1) for key, child in reversed(children))
        elif isinstance(item, str):
            if len(item) > limits.max_string_chars:
                raise JSONLimitError(path, f"is a string of {len(item)} characters, over the limit of "
                                           f"{limits.max_string_chars}")
        elif isinstance(item, _OutOfRange):
            raise JSONLimitError(path, item.problem())
        elif isinstance(item, int) and not isinstance(item, bool) and not -INT64 <= item < INT64:
            raise JSONLimitError(path, f"is an integer of {item.bit_length()} bits, out of range (at most 64-bit signed)")


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]', re.DOTALL)


def path_past_depth(text: str, max_depth: int) -> str | None:
    """The path of the first container nested deeper than ``max_depth`` in JSON ``text``, found from
    its brackets alone (for bodies too deep to decode); None when there is none."""
    stack: list[list[Any]] = []  # per open container: [is_object, key or index, expecting a key]
    last_string: str | None = None
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            if len(stack) + 1 > max_depth:
                where = ""
                for _, key, _ in stack:
                    where = _join(where, key if key is not None else "?")
                return where
            stack.append([token == "{", 0 if token == "[" else None, token == "{"])
        elif token in "]}":
            if stack:
                stack.pop()
        elif token == ":":
            if stack and stack[-1][0] and last_string is not None:
                stack[-1][1] = last_string
                stack[-1][2] = False
        elif token == ",":
            if stack:
                if stack[-1][0]:
                    stack[-1][2] = True
                else:
                    stack[-1][1] += 1
        else:  # a string: a key when the enclosing object expects one
            last_string = None
            if stack and stack[-1][0] and stack[-1][2]:
                try:
                    last_string = json.loads(token)
                except ValueError:
                    last_string = token[1:-1]
    return None


def loads(data: bytes | str, limits: JSONLimits = JSONLimits(), where: str = "", checked: bool = True) -> Any:
    """Decode JSON ``data`` (bytes in UTF-8, -16 or -32, as :func:`json.loads` detects) and, with
    ``checked``, :func:`check` it (without: a caller checks it later; numbers out of range stay
    placeholders that :func:`check` reports). Raises :class:`JSONLimitError` naming the field that
    breaks a bound, :class:`json.JSONDecodeError` or :class:`UnicodeDecodeError` for what is not JSON."""
    text = data.decode(json.detect_encoding(data), "surrogatepass") if isinstance(data, (bytes, bytearray)) else data
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        deep = path_past_depth(text, limits.max_depth)
        raise JSONLimitError(_join_prefix(where, deep), f"is nested too deeply (more than {limits.max_depth} levels)") from None
    if checked:
        check(value, limits, where)
    return value


def _join_prefix(where: str, inner: str | None) -> str:
    if not inner:
        return where
    if not where or inner.startswith("["):
        return f"{where}{inner}"
    return f"{where}.{inner}"


__all__ = ["JSONLimitError", "JSONLimits", "check", "loads", "path_past_depth"]
