"""Reading JSON Lines files with errors that name the offending line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def json_lines(path: Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, str, Any]]:
    """``(lineno, where, value)`` for every non-blank line of ``path`` (an open-able JSONL file), with
    ``lineno`` 1-based and ``where`` = ``"<path>:<lineno>"``. A line that is not JSON raises ``error``
    with ``"<where>: invalid JSON (<reason>)"``; blank lines are skipped."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{where}: invalid JSON ({exc.msg})") from None
            yield lineno, where, value
