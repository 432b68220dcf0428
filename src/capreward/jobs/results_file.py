"""An append-only JSONL results file that survives interruption.

Each completed batch is appended and flushed to disk before the next one starts. On resume the
file is read back, a torn last line (the process was killed mid-write) is cut off, and the ids
already present are skipped, so a rerun ends with every row exactly once.

Fault injection for tests: with ``CAPREWARD_JOBS_KILL_AFTER_BATCH=k`` in the environment the process
SIGKILLs itself right after writing its k-th batch; ``k+torn`` first writes half of batch k+1's text
(a torn line). Tests use it to kill a real job at an exact point, independent of timing.
"""

from __future__ import annotations

import json
import os
import signal
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


KILL_AFTER_BATCH_ENV = "CAPREWARD_JOBS_KILL_AFTER_BATCH"


def kill_point() -> tuple[int, bool] | None:
    """(k, torn) from ``$CAPREWARD_JOBS_KILL_AFTER_BATCH`` ("k" or "k+torn"), or None when unset."""
    value = os.environ.get(KILL_AFTER_BATCH_ENV)
    if not value:
        return None
    k, _, torn = value.partition("+")
    return int(k), torn == "torn"


class ResultsWriter:
    """Appends result rows to a JSONL file, durably, one batch at a time."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._batches = 0
        self._kill = kill_point()

    def write(self, rows: Iterable[dict]) -> None:
        text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=True) + "\n" for r in rows)
        if self._kill is not None and self._kill[1] and self._batches == self._kill[0]:
            self._durable(text[: len(text) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        self._durable(text)
        self._batches += 1
        if self._kill is not None and not self._kill[1] and self._batches == self._kill[0]:
            os.kill(os.getpid(), signal.SIGKILL)

    def _durable(self, text: str) -> None:
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


#: Headline scores, in the CSV's order (right after id and caption).
HEADLINE_COLUMNS = ("emscore", "clip_s", "ref_clip_s", "pac_s", "ref_pac_s", "fleur", "hallucination", "visce2",
                    "gveval")


def csv_columns(rows: list[dict]) -> list[str]:
    """The CSV's columns: id, caption, the headline scores, the visual, references and errors, the other
    fields sorted by name, and the bulky JSON fields (lists, dicts such as ``alignment``) last."""
    keys = {k for r in rows for k in r}
    first = [k for k in ("id", "caption", *HEADLINE_COLUMNS, "image", "video", "references", "errors") if k in keys]
    bulky = {k for r in rows for k, v in r.items() if isinstance(v, (list, dict)) and k not in first}
    last = sorted(bulky - {"alignment"}) + (["alignment"] if "alignment" in bulky else [])
    return first + sorted(keys - set(first) - bulky) + last


def write_csv(rows: list[dict], path: str | Path) -> None:
    """Rows (flat dicts) as CSV, columns in :func:`csv_columns`'s order; lists and dicts as JSON."""
    import csv

    columns = csv_columns(rows)
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()})
