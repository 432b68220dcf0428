"""The settings of a job, fixed per results file: ``capreward score``'s, and any other job's.

The first run on a results file records in ``<out>.settings.json`` every setting that changes what its
rows hold (:func:`scoring_settings` for ``capreward score``; a plain dict built by the job for others, see
:func:`check_settings` and :class:`JobKind`). A resume (the results file already has rows) compares its own
settings with the record and is refused (:class:`SettingsMismatch`, naming each differing setting with
its recorded and its new value) instead of writing rows scored by another model or with other options
into the same file; the same settings resume as before.

A results file with rows but no record (written before capreward recorded settings, or the record was
deleted) is refused too, since nothing says how its rows were scored; ``accept_unrecorded=True``
(``--accept-unrecorded-settings``) records this run's settings as theirs and resumes.

The idf of the metrics that use one is fixed separately, by ``<out>.idf.json``
(:mod:`capreward.jobs.idf_file`): that record is a table other jobs can reuse (``--idf OUT.idf.json``),
and this one only says how the rows were scored.

A record also names the command that wrote it (``capreward score`` before this field existed): a
results file of another command is refused rather than compared setting by setting.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from ..names import SEP
from .errors import JobError
from .. import registry
from .runners import ScoreOptions

logger = logging.getLogger(__name__)

RECORD_FORMAT = "capreward-settings/1"
#: A "model folder" with more files than this is refused (see model_identity): a listing stays bounded.
MAX_MODEL_FILES = 10_000

#: How a results file's fields name sub-scores (``emscore/video/fine_p``); files from before it was
#: recorded name them ``emscore.video.fine_p``, and a resume would mix both in one file.
SEPARATOR_FLAG = ("the separator of sub-score fields (this capreward writes <metric>/<sub-score>; 'not used' is "
                  "a file written with <metric>.<sub-score>)")

#: How each setting every job may record is set on the command line (for the refusal message); the
#: metrics' own settings are named by their specs' job flags (:data:`FLAGS`).
SHARED_FLAGS = {
    "metrics": "--metrics",
    "clip_model": "--clip-model",
    "precision": "--precision",
    "frames": "--frames",
    "judge_model": "--judge-model",
    "judge_dtype": "the local judge's dtype (float16 on CUDA, else float32: set by --device)",
    "judge_base_url": "--judge-base-url",
    "judge_api_model": "--judge-api-model",
    "judge_top_logprobs_cap": "--judge-top-logprobs-cap",
    "alignment": "--alignment",
    "image_aggregation": "--image-aggregation",
    "max_pixels": "--max-pixels",
    "max_video_pixels": "--max-video-pixels",
    "max_caption_chars": "--max-caption-chars",
    "max_caption_claims": "--max-caption-claims",
    "sub_score_separator": SEPARATOR_FLAG,
}


class ScoreFlags(Mapping[str, str]):
    """:data:`SHARED_FLAGS` and every registered metric's job flags (setting -> its flag), read from the
    registry when used, so a metric registered later is named too."""

    def _table(self) -> dict[str, str]:
        return {**SHARED_FLAGS, **{flag.name: flag.flags[0] for _, flag in registry.job_flags()}}

    def __getitem__(self, key: str) -> str:
        return self._table()[key]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


#: How each recorded setting is set on the command line (for the refusal message).
FLAGS: Mapping[str, str] = ScoreFlags()


class SettingsMismatch(JobError):
    """A resume would score rows with other settings than the rows already in the results file."""


@dataclass(frozen=True)
class JobKind:
    """The command whose settings a record holds, for the record and the refusal messages: ``command``
    (``"score"``: ``capreward score``), ``verb`` (what it did to the rows: ``"scored"``), ``flags``
    (how each setting is set on its command line; a setting without one is named by its key) and
    ``legacy`` (a setting recorded only since a later version -> the value every run had before it: a
    record without it is read as holding that value)."""

    command: str
    verb: str
    flags: Mapping[str, str] = field(default_factory=dict)
    legacy: Mapping[str, Any] = field(default_factory=dict)


#: ``--harmonic-mean`` exists since the score job writes EMScore's F and RefCLIP-S sign-safely by default:
#: rows of a record without it were formed with the released 2ab/(a+b).
SCORE = JobKind("score", "scored", FLAGS, legacy={"harmonic_mean": "released"})


def record_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".settings.json")


def scoring_settings(options: ScoreOptions) -> dict[str, Any]:
    """The settings of ``options`` that change a row's output, as JSON values keyed by ScoreOptions
    field (plus ``judge_dtype``); a setting is included only when a chosen metric uses it, so changing
    an unused one (``--clip-model`` of a FLEUR-only job) does not block a resume.

    Included: ``metrics`` (as a sorted set: their order changes nothing); ``clip_model`` (the metrics on
    the shared CLIP); ``precision`` (``fp32`` for None) and ``frames`` (0: every frame, as ``--frames 0``)
    for every metric on a CLIP (the judges see videos as a three-frame composite whatever ``frames``
    says); ``judge_model`` and ``judge_dtype`` (the local LLaVA of the judge metrics without a server);
    ``judge_base_url``, ``judge_api_model`` and ``judge_top_logprobs_cap`` (the judge metrics on a
    server; the model resolved to the backend's default when not given, the URL because another server
    may serve other weights under the same name, the cap because it decides which numbers an exact score
    reads); each chosen metric's own settings, its spec's job flags
    (:attr:`~capreward.registry.MetricSpec.job_flags`) recorded as their ``record`` says (a default
    resolved, so a changed default shows; a model by :func:`model_identity`); ``alignment`` (with a
    metric that writes one: it changes which fields a row holds, and a report over rows with and without
    alignment would be inconsistent); ``max_pixels`` and ``max_video_pixels``, for every metric (the
    limits in force decide which rows are refused, and a JPEG over ``max_pixels`` is decoded at a reduced
    scale, which changes its score); ``max_caption_chars`` and ``max_caption_claims`` when they are not
    the defaults (the caption budget decides which rows are refused unread: :mod:`capreward.caption_budget`); ``sub_score_separator`` (how the rows name their sub-score fields,
    ``/``: see :mod:`capreward.names`). Models on local disk are recorded with :func:`model_identity`, so
    new weights at the same path count as another model.

    Excluded: ``batch_size`` (a row never depends on its batch: tested per metric), ``device`` (a job
    may go on on another machine or GPU; what the device decides by design, the local judge's default
    dtype, is recorded as ``judge_dtype``, and what is left is the float arithmetic of other hardware,
    which two separate runs on two devices differ by as well), and ``idf_weights``/``idf_default``
    (fixed by ``<out>.idf.json``). The job's other options (``--engine``: the Ray and local engines
    write the same rows, tested; ``--num-actors``, ``--no-progress``, ``--csv``) are not ScoreOptions
    and do not change a row.
    """
    used = set(options.metrics)
    chosen = [registry.get(m) for m in sorted(used)]
    settings: dict[str, Any] = {"metrics": sorted(used)}
    on_clip = set(registry.on_backbone("clip")) & used
    if used & set(registry.sharing("clip")):
        settings["clip_model"] = model_identity(options.clip_model, open_clip=True)
    if on_clip:
        settings["precision"] = options.precision or "fp32"
        settings["frames"] = options.frames if options.frames is not None else 0
    # judge metrics that may run on a server instead of the local LLaVA (a chat-judge scorer or a remote scorer)
    chat = {s.name for s in registry.specs() if s.judge_backend or s.remote_scorer}
    local_only = set(registry.on_backbone("chat_judge")) - chat
    if used & local_only or (used & chat and not options.remote_judge):
        from ..judges.loading import resolve_device, resolve_dtype

        settings["judge_model"] = model_identity(options.judge_model)
        settings["judge_dtype"] = str(resolve_dtype(None, resolve_device(options.device))).removeprefix("torch.")
    if used & chat and options.remote_judge:
        from ..judges.remote import DEFAULT_API_MODEL

        settings["judge_base_url"] = options.judge_base_url  # None: OpenAI's API
        settings["judge_api_model"] = options.judge_api_model or DEFAULT_API_MODEL
        # how many alternatives the server gives decides which numbers an exact score can read
        settings["judge_top_logprobs_cap"] = int(options.judge_top_logprobs_cap)
    for spec in chosen:  # each metric's own settings, as its spec's job flags say to record them
        for flag in spec.job_flags:
            if flag.record is not None:
                settings[flag.name] = recorded_value(flag.record, spec.job_value(flag, options.metric_options.get(flag.name)))
    if any(spec.writes_alignment for spec in chosen):
        settings["alignment"] = bool(options.alignment)
    from ..media.limits import get_media_limits

    limits = get_media_limits()  # the command's --max-pixels / --max-video-pixels (main() sets them)
    settings["max_pixels"] = limits.max_pixels
    settings["max_video_pixels"] = limits.max_video_pixels
    settings["sub_score_separator"] = SEP
    if options.image_aggregation != "mean":  # several-image rows; the default unrecorded, as before it existed
        settings["image_aggregation"] = options.image_aggregation
    from ..caption_budget import CaptionBudget, get_caption_budget

    budget, default = get_caption_budget(), CaptionBudget()  # which rows are refused unread; the default unrecorded
    for name in ("max_chars", "max_claims"):
        if getattr(budget, name) != getattr(default, name):
            settings[f"max_caption_{name.split('_')[1]}"] = getattr(budget, name)
    return settings


def recorded_value(record: str, value: Any) -> Any:
    """``value`` of a job flag as the record holds it (:attr:`capreward.registry.JobFlag.record`)."""
    if record == "bool":
        return bool(value)
    if record == "float":
        return None if value is None else float(value)
    if record in ("model", "clip_model"):
        return None if not value else model_identity(value, open_clip=record == "clip_model")
    return value


def local_model_path(spec: str, open_clip: bool = False) -> tuple[str | None, Path] | None:
    """``(architecture or None, path)`` when model ``spec`` names weights on local disk: a file or
    folder, or with ``open_clip`` (a CLIP specification) also ``local-dir:PATH`` or ``ARCH/PATH`` /
    ``ARCH//PATH``; None for a hub name or tag."""
    path = Path(spec).expanduser()
    if path.exists():
        return None, path
    if not open_clip or spec.startswith("hf-hub:"):
        return None
    if spec.startswith("local-dir:"):
        return None, Path(spec.removeprefix("local-dir:")).expanduser()
    arch, sep, rest = spec.partition("/")
    if sep and rest and Path(rest).expanduser().exists():
        return arch, Path(rest).expanduser()
    return None


def model_identity(spec: str | os.PathLike, open_clip: bool = False) -> str | dict[str, Any]:
    """What identifies the model ``spec``: the name itself for a hub name or tag; for weights on local
    disk (``open_clip``: ``spec`` is a CLIP specification, see :func:`local_model_path`), their absolute
    path (symlinks not resolved) with the size and modification time (ns) of the
    file, or for a folder its file count, total size, newest modification time and the SHA-256 of its
    listing (each file's relative path, size and modification time; dot-files skipped).

    Size and modification time rather than a hash of the content: checking costs one ``stat`` per file
    however large the weights are (a 13B judge is 26 GB; hashing it all would add minutes to every run),
    and every way of writing new weights (``torch.save``, ``save_pretrained``, a download, ``cp``) sets a
    new modification time. A hash of a bounded prefix would be cheap too but misses exactly the case
    that matters: a fine-tune that leaves the first layers alone (PAC-S's checkpoint has CLIP ViT-B/32's
    size and token embedding) hashes the same. The price is on the safe side: a byte-identical copy
    without its timestamps (``cp`` without ``-p``) or a ``touch`` counts as another model.
    """
    spec = os.fspath(spec)
    local = local_model_path(spec, open_clip)
    if local is None:
        return spec
    arch, path = local
    identity: dict[str, Any] = {"path": os.path.abspath(path)}
    if arch:
        identity["architecture"] = arch
    if path.is_dir():
        listing = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(f for f in files if not f.startswith(".")):
                full = Path(root) / name
                st = full.stat()
                listing.append((full.relative_to(path).as_posix(), st.st_size, st.st_mtime_ns))
                if len(listing) > MAX_MODEL_FILES:
                    raise JobError(f"{spec}: more than {MAX_MODEL_FILES} files under a model folder; "
                                   "point at the folder that holds the model's weights and config")
        identity.update(
            files=len(listing), bytes=sum(s for _, s, _ in listing),
            mtime_ns=max((m for _, _, m in listing), default=0),
            listing_sha256=hashlib.sha256(json.dumps(sorted(listing)).encode("utf-8")).hexdigest(),
        )
    else:
        st = path.stat()
        identity.update(bytes=st.st_size, mtime_ns=st.st_mtime_ns)
    return identity


def describe(value: Any) -> str:
    """A recorded setting for people, as one would write it on the command line; a local model as
    ``path (N bytes, modified <UTC time>)``."""
    if isinstance(value, dict) and "path" in value:
        when = dt.datetime.fromtimestamp(value["mtime_ns"] / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        files = f"{value['files']} files, " if "files" in value else ""
        arch = f"{value['architecture']}/" if "architecture" in value else ""  # ARCH//abs/path
        return f"{arch}{value['path']} ({files}{value['bytes']} bytes, modified {when})"
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    return json.dumps(value, ensure_ascii=False)


_UNUSED = object()  # a setting recorded on one side only


def differences(recorded: dict[str, Any], current: dict[str, Any], flags: Mapping[str, str] = FLAGS) -> list[str]:
    """One ``"<flag> was <old>, now <new>"`` per setting that differs (``not used`` where a setting is
    recorded on one side only), each setting named by ``flags`` (by its key when not there)."""
    out = []
    for key in [*recorded, *(k for k in current if k not in recorded)]:
        old, new = recorded.get(key, _UNUSED), current.get(key, _UNUSED)
        if old == new:
            continue
        old_text, new_text = (("not used" if v is _UNUSED else describe(v)) for v in (old, new))
        if old_text == new_text:  # e.g. a folder whose listing changed but not its newest time
            old_text, new_text = json.dumps(old), json.dumps(new)
        out.append(f"{flags.get(key, key)} was {old_text}, now {new_text}")
    return out


def read_record(path: Path) -> dict:
    from .safe_files import open_job_stream

    try:
        with open_job_stream(path, "rb", "the settings record") as f:  # a link, FIFO or device: refused
            record = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise JobError(f"{path}: cannot read the settings record ({exc})") from None
    if (not isinstance(record, dict) or record.get("format") != RECORD_FORMAT
            or not isinstance(record.get("settings"), dict)):
        raise JobError(f"{path}: not a settings record written by capreward")
    return record


def recorded_command(record: dict) -> str:
    """The command that wrote ``record`` (``score`` for a record from before commands were named)."""
    return str(record.get("command", SCORE.command))


def write_record(path: Path, settings: dict[str, Any], kind: JobKind = SCORE) -> None:
    """Write the record of ``kind``'s ``settings`` atomically (a temporary file renamed over ``path``);
    ``written_by`` is for people only (a resume by another capreward version is not refused)."""
    from .. import __version__

    record = {"format": RECORD_FORMAT, "command": kind.command, "settings": settings,
              "written_by": f"capreward {__version__}"}
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(record, indent=1, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a path with bytes that are not UTF-8 (a lone surrogate): escaped
        text = json.dumps(record, indent=1)
    from .safe_files import open_job_stream

    with open_job_stream(tmp, "w", "the settings record", encoding="utf-8") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def job_settings(out: str | Path, options: ScoreOptions, has_results: bool, accept_unrecorded: bool = False) -> dict:
    """Check ``capreward score``'s ``options`` against the settings recorded for results file ``out`` and
    return them (:func:`scoring_settings`); see :func:`check_settings`."""
    return check_settings(out, scoring_settings(options), SCORE, has_results=has_results,
                          accept_unrecorded=accept_unrecorded)


def check_settings(out: str | Path, settings: dict[str, Any], kind: JobKind, has_results: bool,
                   accept_unrecorded: bool = False) -> dict[str, Any]:
    """Check a ``kind`` job's ``settings`` (JSON values, each a setting that changes a row) against those
    recorded for results file ``out`` and return them.

    Without results in ``out``, records ``settings`` (replacing any record). With results: the same
    settings pass; different ones raise :class:`SettingsMismatch` naming each (by ``kind.flags``) with
    its recorded and its new value, and so does a record written by another command; no record raises it
    too, unless ``accept_unrecorded`` (then ``settings`` are recorded as the rows', with a warning).
    Nothing is written when it raises."""
    path = record_path(out)
    if not has_results:
        write_record(path, settings, kind)
        return settings
    if not path.exists():
        if not accept_unrecorded:
            raise SettingsMismatch(
                f"{out} already has results but no {path.name} recording the settings they were {kind.verb} with "
                "(written before capreward recorded them, or the record was removed); if this run uses the same "
                f"settings, pass --accept-unrecorded-settings to record them and resume, else {kind.command} into "
                "a new --out"
            )
        logger.warning("%s: no settings record; recording this run's settings in %s as those of the rows already "
                       "there (--accept-unrecorded-settings)", out, path)
        write_record(path, settings, kind)
        return settings
    record = read_record(path)
    if recorded_command(record) != kind.command:
        raise SettingsMismatch(
            f"{out} was written by capreward {recorded_command(record)}, not capreward {kind.command} (recorded in "
            f"{path}); {kind.command} into a new --out"
        )
    recorded = {**{k: v for k, v in kind.legacy.items() if k in settings}, **record["settings"]}
    diff = differences(recorded, settings, kind.flags)
    if diff:
        raise SettingsMismatch(
            f"{out} was {kind.verb} with other settings than this run's (recorded in {path}): {'; '.join(diff)}; "
            f"rerun with the recorded settings to resume, or {kind.command} into a new --out"
        )
    return settings
