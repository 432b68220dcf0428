"""The idf of a scoring job, fixed per results file.

``--idf`` chooses a corpus (``auto``: the manifest's references, or no idf when it has none; ``refs``;
``none``; a text file with one caption per line; or a recorded ``.idf.json``). The first run on a
results file computes the table once and records it in ``<out>.idf.json`` with its source and the
SHA-256 of its corpus; every resume reuses the recorded table, and a resume whose choice has a
different corpus is refused (:class:`IdfMismatch`) instead of mixing two idf tables in one file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from ..metrics.idf import IdfTable
from ..text import capped
from .errors import JobError
from .manifest import ManifestRow

RECORD_FORMAT = "capreward-idf/1"
#: The digest of "no idf" (every token weight 1).
NO_IDF = "none"


class IdfMismatch(JobError):
    """A resume would score rows with another idf than the rows already in the results file."""


@dataclass
class IdfChoice:
    """What ``--idf`` asks for: a corpus to compute the table from, or a recorded table, or no idf."""

    source: str  # for people: where the idf comes from
    digest: str  # SHA-256 of the sorted corpus, or NO_IDF
    corpus: list[str] | None = None
    table: IdfTable | None = None


def record_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".idf.json")


def corpus_digest(corpus: list[str]) -> str:
    """SHA-256 of the corpus as a multiset (its order does not change the idf). Text UTF-8 cannot encode
    (a lone surrogate) is hashed by its code point (``surrogatepass``), so it neither fails nor collides
    with other text; every other corpus hashes as before."""
    return hashlib.sha256(json.dumps(sorted(corpus), ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


def choose_idf(option: str, rows: list[ManifestRow], manifest: str | Path) -> IdfChoice:
    """The idf that ``--idf option`` means for ``rows`` of ``manifest``."""
    if option == "none":
        return IdfChoice("none (every token weight 1)", NO_IDF)
    if option in ("refs", "auto"):
        corpus = [ref for r in rows if r.references for ref in r.references]
        if not corpus:
            if option == "refs":
                raise JobError(f"--idf refs: {manifest} has no references")
            return IdfChoice(f"auto: {manifest} has no references, so none (every token weight 1)", NO_IDF)
        return IdfChoice(f"{option}: the {len(corpus)} references in {manifest}", corpus_digest(corpus), corpus=corpus)
    path = Path(option)
    if not path.exists():
        raise JobError(f"--idf: no such file {capped(option, 200)} (give auto, refs, none or an existing file)")
    if path.name.endswith(".idf.json"):
        record = read_record(path)
        return IdfChoice(f"{path} ({record['source']})", record["corpus_sha256"], table=table_of(record))
    data = _read(path, "--idf")
    try:
        lines = [line.strip() for line in data.decode("utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise JobError(f"--idf {option}: line {line} is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x})") from None
    corpus = [line for line in lines if line]
    if not corpus:
        raise JobError(f"--idf {option}: the file has no captions")
    return IdfChoice(f"the {len(corpus)} captions in {path}", corpus_digest(corpus), corpus=corpus)


def _read(path: Path, what: str) -> bytes:
    """The bytes of ``path``, a regular file (a FIFO or a device is refused, never read: JobError)."""
    from ..input_files import NotARegularFile, read_regular_bytes

    try:
        return read_regular_bytes(path, what)
    except NotARegularFile as exc:
        raise JobError(str(exc)) from None


def read_record(path: Path) -> dict:
    data = _read(path, "the idf record")
    try:
        record = json.loads(data.decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise JobError(f"{path}: cannot read the idf record ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise JobError(f"{path}: not an idf record written by capreward score")
    return record


def table_of(record: dict) -> IdfTable | None:
    if record["weights"] is None:
        return None
    return IdfTable(weights={int(k): float(v) for k, v in record["weights"].items()}, default=float(record["default"]))


def write_record(path: Path, choice: IdfChoice, table: IdfTable | None, clip_model: str) -> None:
    """Write the record atomically (a temporary file renamed over ``path``)."""
    record = {
        "format": RECORD_FORMAT,
        "source": choice.source,
        "corpus_sha256": choice.digest,
        "corpus_size": len(choice.corpus) if choice.corpus else None,
        "clip_model": clip_model,
        "default": None if table is None else table.default,
        "weights": None if table is None else {str(k): v for k, v in sorted(table.weights.items())},
    }
    tmp = path.with_name(path.name + ".tmp")
    from .safe_files import open_job_stream

    with open_job_stream(tmp, "w", "the idf record", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def job_idf(out: str | Path, choice: IdfChoice, has_results: bool, compute: Callable[[list[str]], IdfTable],
            clip_model: str) -> IdfTable | None:
    """The idf table of results file ``out`` (None: no idf): the recorded one when ``out`` already has
    results scored with the same choice, else ``choice``'s (computed with ``compute(corpus)`` and
    recorded). Raises :class:`IdfMismatch` when ``out`` has results and ``choice`` differs from their idf."""
    path = record_path(out)
    if has_results:
        if not path.exists():
            raise IdfMismatch(f"{out} already has results but no {path.name} recording their idf; "
                              "score into a new --out")
        record = read_record(path)
        if record["corpus_sha256"] != choice.digest:
            raise IdfMismatch(
                f"{out} was scored with the idf recorded in {path} ({record['source']}), but this run would use "
                f"{choice.source}; pass --idf {path} to keep the recorded idf, or score into a new --out"
            )
        return table_of(record)
    table = choice.table if choice.table is not None else (compute(choice.corpus) if choice.corpus else None)
    write_record(path, choice, table, clip_model)
    return table
