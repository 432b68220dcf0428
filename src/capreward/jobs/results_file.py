"""An append-only JSONL results file that survives interruption.

Each completed batch is appended and flushed to disk before the next one starts. On resume the
file is read back, a torn last line (the process was killed mid-write) is cut off, and the ids
already present are skipped, so a rerun ends with every row exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable


def recover(path: str | Path) -> set[str]:
    """Ids of the complete rows in ``path`` (cutting off a torn last line); empty if no file."""
    path = Path(path)
    if not path.exists():
        return set()
    done: set[str] = set()
    good_bytes = 0
    with path.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            done.add(str(row["id"]))
            good_bytes += len(raw)
    if good_bytes != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_bytes)
    return done


class ResultsWriter:
    """Appends result rows to a JSONL file, durably, one batch at a time."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, rows: Iterable[dict]) -> None:
        text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=True) + "\n" for r in rows)
        self._file.write(text)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_results(path: str | Path) -> list[dict]:
    """Every row of a results JSONL file."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_csv(rows: list[dict], path: str | Path) -> None:
    """Rows (flat dicts) as CSV; columns are the union of keys, ``id`` first."""
    import csv

    columns = ["id"] + sorted({k for r in rows for k in r} - {"id"})
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()})
