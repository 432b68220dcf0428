"""An append-only JSONL results file that survives interruption, corruption and a full disk.

Each completed batch is appended and flushed to disk before the next one starts; a batch that cannot be
written whole (a full disk, Ctrl-C in the middle) is cut off again, so the file always ends with a whole
batch. On resume the file is checked (:func:`recover`): a torn last line (the process was killed
mid-write) is cut off, and the ids already present are skipped, so a rerun ends with every row exactly
once. Any other line that is not a result row (invalid JSON or UTF-8, no ``id``, not an object) is not
something a killed writer leaves behind, and it is never deleted silently: the resume is refused
(:class:`ResultsCorrupt`) with the file left byte for byte as it is, or, with ``quarantine=True``
(``--quarantine-bad-lines``), the bad lines are moved to ``<out>.quarantine`` and the job goes on.

Rows are written by :func:`capreward.jsonl.json_line`: text that UTF-8 cannot encode (a lone surrogate)
never stops a writer, and ids read back equal the manifest's.

Fault injection for tests: with ``CAPREWARD_JOBS_KILL_AFTER_BATCH=k`` in the environment the process
SIGKILLs itself right after writing its k-th batch; ``k+torn`` first writes half of batch k+1's text
(a torn line); ``k+int`` sends itself SIGINT (a Ctrl-C) instead. Tests use it to stop a real job at an
exact point, independent of timing.
"""

from __future__ import annotations

import errno
import json
import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Iterator

from ..jsonl import json_line, parse_json_text
from ..text import printable
from .errors import JobError
from .row_inputs import stored_inputs
from .safe_files import open_job_file, open_job_stream

#: Lines named in a refusal (the count of the others is given).
SHOWN_BAD_LINES = 3


class ResultsCorrupt(JobError):
    """A results file with a complete line that is not a result row; nothing was changed."""


class DiskError(JobError):
    """A job's file could not be written (full disk, read-only file system, no permission)."""


#: The errors of a disk (or of its permissions) that a rerun recovers from once they are fixed.
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


def quarantine_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".quarantine")


def _row_id(raw: bytes, where: str) -> tuple[str, dict]:
    """The id of the result row on line ``raw`` and the row; ValueError saying what is wrong otherwise."""
    row = parse_json_text(raw, where)
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a JSON {type(row).__name__}, not a result row (an object)")
    if row.get("id") is None or isinstance(row["id"], (dict, list, bool)):
        raise ValueError(f"{where}: a JSON object without an id, not a result row")
    return str(row["id"]), row


@dataclass
class Scan:
    """What :func:`scan` found in a results file: the ids of its rows, the bad complete lines
    ``(lineno, start, end, reason)`` (byte offsets), and its end: ``tail`` = the byte offset of an
    unterminated last line (None when the file ends with a newline) and whether that line is a whole row
    (``tail_is_row``; else it is a torn write)."""

    ids: set[str] = field(default_factory=set)
    #: id -> what the row was scored on (:func:`~capreward.jobs.row_inputs.stored_inputs`)
    inputs: dict[str, tuple] = field(default_factory=dict)
    rows: int = 0
    bad: list[tuple[int, int, int, str]] = field(default_factory=list)
    size: int = 0
    tail: int | None = None
    tail_is_row: bool = False


def scan(path: str | Path) -> Scan:
    """Read results file ``path`` (which must exist) line by line, without changing it."""
    path = Path(path)
    found = Scan()
    offset = 0
    with open_job_stream(path, "rb", "--out") as f:
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rid, row = _row_id(raw, where)
            except ValueError as exc:
                if raw.endswith(b"\n"):
                    found.bad.append((lineno, start, offset, str(exc).removeprefix(f"{where}: ")))
                else:
                    found.tail = start
                continue
            if not raw.endswith(b"\n"):
                found.tail, found.tail_is_row = start, True
            found.ids.add(rid)
            found.inputs[rid] = stored_inputs(row)
            found.rows += 1
    found.size = offset
    return found


def count_rows(path: str | Path) -> int | None:
    """The number of result rows in ``path`` (0 when it does not exist; None when it cannot be read)."""
    try:
        return scan(path).rows if os.path.lexists(path) else 0
    except OSError:
        return None


def _refusal(path: Path, found: Scan) -> str:
    shown = "; ".join(f"line {lineno}: {reason}" for lineno, _, _, reason in found.bad[:SHOWN_BAD_LINES])
    more = len(found.bad) - SHOWN_BAD_LINES
    first = found.bad[0][0]
    return (
        f"{path}:{first}: not a result row ({shown}{f'; and {more} more bad lines' if more > 0 else ''}). Only the last "
        f"line of a results file may be torn by an interrupted write, so this is not one: the file is left as it "
        f"is. Fix or remove the bad lines, or rerun with --quarantine-bad-lines to move them to "
        f"{quarantine_path(path)} and resume"
    )


def _durable_write(path: Path, chunks: Iterable[bytes], mode: str, what: str) -> None:
    with open_job_stream(path, mode, what) as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def _quarantine(path: Path, found: Scan) -> None:
    """Append the bad lines to ``<path>.quarantine`` (as they are), then replace ``path`` atomically by
    its other lines (a torn tail left out). Killed in between, the bad lines are in both files and the
    next run moves them again: no row is ever lost."""
    with open_job_stream(path, "rb", "--out") as f:
        def piece(start: int, end: int) -> bytes:
            f.seek(start)
            return f.read(end - start)

        _durable_write(quarantine_path(path), (piece(s, e) for _, s, e, _ in found.bad), "ab", "the quarantine file")
        keep_end = found.size if found.tail is None or found.tail_is_row else found.tail
        ranges, at = [], 0
        for _, s, e, _ in found.bad:
            ranges.append((at, s))
            at = e
        ranges.append((at, keep_end))
        tmp = path.with_name(path.name + ".tmp")
        chunks = (piece(s, e) for s, e in ranges if e > s)
        tail = [b"\n"] if found.tail is not None and found.tail_is_row else []
        _durable_write(tmp, (*chunks, *tail), "wb", "the temporary file")
    os.replace(tmp, path)


def recover(path: str | Path, quarantine: bool = False) -> set[str]:
    """Ids of the rows in results file ``path``; see :func:`recover_scan`."""
    return recover_scan(path, quarantine).ids


def recover_scan(path: str | Path, quarantine: bool = False) -> Scan:
    """The :class:`Scan` of the rows in results file ``path`` (empty if there is no file), after repairing its end:
    a torn last line (a killed write) is cut off, a whole last row without its newline gets one.

    A complete line that is not a result row raises :class:`ResultsCorrupt` naming it, with the file
    unchanged; with ``quarantine`` such lines are moved to ``<path>.quarantine`` instead."""
    path = Path(path)
    if not os.path.lexists(path):
        return Scan()
    found = scan(path)
    if found.bad:
        if not quarantine:
            raise ResultsCorrupt(_refusal(path, found))
        _quarantine(path, found)
        return found
    if found.tail is not None:
        with open_job_stream(path, "r+b", "--out") as f:
            if found.tail_is_row:
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            else:
                f.truncate(found.tail)
            f.flush()
            os.fsync(f.fileno())
    return found


KILL_AFTER_BATCH_ENV = "CAPREWARD_JOBS_KILL_AFTER_BATCH"


def kill_point() -> tuple[int, str] | None:
    """(k, how) from ``$CAPREWARD_JOBS_KILL_AFTER_BATCH`` ("k", "k+torn" or "k+int"; how is "kill",
    "torn" or "int"), or None when unset."""
    value = os.environ.get(KILL_AFTER_BATCH_ENV)
    if not value:
        return None
    k, _, how = value.partition("+")
    return int(k), how if how in ("torn", "int") else "kill"


class ResultsWriter:
    """Appends result rows to a JSONL file, durably, one whole batch at a time.

    A batch that cannot be written whole (an ``OSError`` such as a full disk, or ``KeyboardInterrupt``)
    is cut off again before the error propagates (best effort: if even that fails, the next run's
    :func:`recover` cuts the torn line), so the file holds only whole batches; an ``OSError`` is raised
    with this file's path as its ``filename``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = open_job_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "--out")
        self._batches = 0
        self._kill = kill_point()

    def write(self, rows: Iterable[dict]) -> None:
        data = "".join(json_line(r) + "\n" for r in rows).encode("utf-8")
        if self._kill is not None and self._kill[1] == "torn" and self._batches == self._kill[0]:
            os.write(self._fd, data[: len(data) // 2])
            os.fsync(self._fd)
            os.kill(os.getpid(), signal.SIGKILL)
        self._durable(data)
        self._batches += 1
        if self._kill is not None and self._kill[1] != "torn" and self._batches == self._kill[0]:
            os.kill(os.getpid(), signal.SIGINT if self._kill[1] == "int" else signal.SIGKILL)

    def _durable(self, data: bytes) -> None:
        start = os.fstat(self._fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except BaseException as exc:
            if view:  # part of the batch is missing (a batch written whole stays, even if fsync failed)
                try:
                    os.ftruncate(self._fd, start)
                except OSError:
                    pass  # the next run's recover() cuts the torn line
            if isinstance(exc, OSError) and exc.filename is None:
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ADVICE = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space (disk quota exceeded)",
    errno.EFBIG: "the file is larger than this file system allows: score into a new --out",
    errno.EROFS: "make the file system writable",
    errno.EACCES: "give this user write permission",
    errno.EPERM: "make it writable (permissions, or an immutable attribute: lsattr / chattr -i)",
}


@contextmanager
def disk_errors(out: str | Path, *others: str | Path | None) -> Iterator[None]:
    """Within the block, a disk error (:data:`DISK_ERRNOS`) on one of a job's own files (``out`` and the
    files beside it named ``<out>.*``, or ``others`` such as the CSV) becomes one :class:`DiskError` line
    naming the file, the reason, what to do, and how many rows are safe in ``out`` (counted after the
    failed batch was cut off); the same command resumes. Errors on other files (a manifest or a model
    that cannot be read) pass through."""
    try:
        yield
    except OSError as exc:
        name = os.fspath(out) if exc.filename is None else os.fspath(exc.filename)
        ours = (name.startswith(os.fspath(out)) or os.fspath(out).startswith(name.rstrip(os.sep) + os.sep)
                or name in {os.fspath(o) for o in others if o})  # the out file, <out>.*, its folders, others
        if exc.errno not in DISK_ERRNOS or not ours:
            raise
        safe = count_rows(out)
        rows = "an unknown number of rows (it cannot be read)" if safe is None else f"{safe} row{'s' * (safe != 1)}"
        raise DiskError(
            f"cannot write {printable(name)}: {exc.strerror}; {rows} are safe in {printable(os.fspath(out))}; "
            f"{ADVICE.get(exc.errno, 'fix it')}, then run the same command again to resume"
        ) from None


def read_results(path: str | Path) -> list[dict]:
    """Every row of a results JSONL file; a line that is not JSON raises :class:`ResultsCorrupt` naming it."""
    from ..jsonl import json_lines

    return [row for _, _, row in json_lines(Path(path), ResultsCorrupt)]


def headline_columns() -> tuple[str, ...]:
    """Headline scores, in the CSV's order (right after id and caption): every metric's name and legacy
    top-level fields (``ref_clip_s``), in the registry's order."""
    from .. import registry

    return registry.result_fields()


def __getattr__(name: str):
    if name == "HEADLINE_COLUMNS":  # the tuple this module exported before the registry
        return headline_columns()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def csv_columns(rows: list[dict]) -> list[str]:
    """The CSV's columns: id, caption, the headline scores, the visual, references and errors, the other
    fields sorted by name, and the bulky JSON fields (lists, dicts such as ``alignment``) last."""
    keys = {k for r in rows for k in r}
    first = [k for k in ("id", "caption", *headline_columns(), "image", "video", "references", "errors") if k in keys]
    bulky = {k for r in rows for k, v in r.items() if isinstance(v, (list, dict)) and k not in first}
    last = sorted(bulky - {"alignment"}) + (["alignment"] if "alignment" in bulky else [])
    return first + sorted(keys - set(first) - bulky) + last


def write_csv(rows: list[dict], path: str | Path) -> None:
    """Rows (flat dicts) as CSV, columns in :func:`csv_columns`'s order; lists and dicts as JSON. Text UTF-8
    cannot encode (a lone surrogate) is written as its ``\\udXXX`` escape."""
    import csv

    columns = csv_columns(rows)
    with open_job_stream(path, "w", "--csv", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()})
