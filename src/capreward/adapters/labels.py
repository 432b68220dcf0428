"""Per-sample labels of the RL-stack adapters: which visual a completion describes, and its references.

Neither veRL nor OpenRLHF carries images through their reward hooks, so a sample names its visual by
path (or cache id). A label is a dict, or a JSON string encoding one::

    {"video": "clips/abc.mp4", "references": ["a man cooks", "someone fries eggs"], "visual_id": "abc"}
    {"image": "/data/coco/123.jpg", "references": "a dog on a sofa"}
    {"references": ["a man cooks"]}          # reference-only scoring (EMScore_ref, RefCLIP-S text side)

Keys: ``video`` or ``image`` (a path) or ``images`` (a list of paths: the caption is scored on every one
and the values aggregated by the reward's ``image_aggregation``, as the Python API and ``capreward score``
score a sample with several images; a one-path list is that image),
``references`` (a str or a list of str; optional; ``[]``, ``[""]`` or a blank entry gives the sample
the fallback with its reason, never a score without references), ``visual_id`` (optional; it narrows the visual's
cache key, which is always the file's identity or the pixels' hash, so a reused id never serves
another visual's embedding), ``questions`` (optional; the ``qa_utility`` reward's multiple-choice
questions about the visual: a list of ``{"question", "options", "answer"}`` or JSON text of one,
:func:`parse_label_questions`; other rewards ignore them).

Which paths are served is decided by a :class:`~capreward.adapters.paths.MediaPaths` policy: the
reward server confines them to its media root (a refused path gives that sample a fallback with one
fixed reason, :data:`~capreward.adapters.paths.REFUSED`); a plain ``media_root`` string is the
trusted-caller mode (relative paths joined to it, nothing checked).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ..errors import CaprewardError
from ..text import capped
from ..media.files import ConfinedFile
from .. import json_limits
from .paths import MediaPaths, PathRefused

LABEL_KEYS = ("image", "images", "video", "references", "visual_id", "questions")
#: The most references one sample may have, and the most characters they (or the JSON text holding them)
#: may have together: a sample over either is refused (None / the fallback) instead of costing the batch
#: seconds of tokenising (captioning datasets have 5 to 20 references of a sentence each).
MAX_REFERENCES = 256
MAX_REFERENCE_CHARS = 100_000
#: The bounds on one sample's questions are :mod:`capreward.scorers.qa_questions`' (every door reads them there):
#: MAX_QUESTIONS and MAX_QUESTION_CHARS, imported above.


class LabelError(CaprewardError, ValueError):
    """A malformed label; the message names the offending item (e.g. ``labels[3]``)."""


@dataclass
class Label:
    """One parsed label: at most one of ``image``/``video`` (a path), ``references`` (None or a list
    of str as given: the reward refuses an empty list or a blank entry, per sample) and an optional
    cache id. ``error``: why the sample cannot be scored although the label is well formed (a refused
    path); such a sample gets the fallback."""

    image: str | ConfinedFile | None = None  # ConfinedFile: a confined path, opened only inside its root
    video: str | ConfinedFile | None = None
    references: list[str] | None = None
    visual_id: str | None = None
    error: str | None = None
    questions: list[dict] | None = None
    #: every image of a label naming several (``image`` is the first); None for one image or none
    images: tuple | None = None

    @property
    def has_input(self) -> bool:
        """Whether the label names something to score against: a visual, references, or questions (the
        QA-utility reward needs nothing else)."""
        return (self.image is not None or self.video is not None or self.references is not None
                or self.questions is not None)


def _tolist(value: Any) -> Any:
    """numpy arrays (how parquet-backed datasets hand over lists) as Python lists; others unchanged."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def parse_references(value: Any, where: str) -> list[str] | None:
    """A str or list of str as a list of references (None for None).

    A str that holds a JSON list (``'["a", "b"]'``) is decoded. Raises :class:`LabelError` naming
    ``where`` for other types, for entries that are not str, for JSON that does not parse (nested too
    deeply, an integer over Python's 4300-digit limit included), and for more than
    :data:`MAX_REFERENCES` references or :data:`MAX_REFERENCE_CHARS` characters. An empty list or a blank
    entry is kept as given: the reward gives that sample None (the fallback here) with the reason, as the
    scorers and ``capreward score`` refuse it, rather than scoring it without references (another metric).
    """
    value = _tolist(value)
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > MAX_REFERENCE_CHARS:
            raise LabelError(f"{where}: references of {len(value)} characters; at most {MAX_REFERENCE_CHARS}")
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise LabelError(f"{where}: references look like a JSON list but do not parse: {exc}") from None
            except RecursionError:
                raise LabelError(f"{where}: references look like a JSON list but are nested too deeply") from None
            except ValueError as exc:  # an integer over sys.get_int_max_str_digits() digits
                raise LabelError(f"{where}: references look like a JSON list but do not parse: {exc}") from None
        else:
            value = [value]
    if not isinstance(value, (list, tuple)):
        raise LabelError(f"{where}: references must be a str or a list of str, got {type(value).__name__}")
    if len(value) > MAX_REFERENCES:
        raise LabelError(f"{where}: {len(value)} references; at most {MAX_REFERENCES}")
    chars = 0
    for j, r in enumerate(value):
        if not isinstance(r, str):
            raise LabelError(f"{where}: references[{j}] must be a str, got {type(r).__name__}")
        chars += len(r)
        if chars > MAX_REFERENCE_CHARS:
            raise LabelError(f"{where}: references of more than {MAX_REFERENCE_CHARS} characters together")
    return list(value)


def parse_label_questions(value: Any, where: str) -> list[dict] | None:
    """A sample's ``questions`` (a list of ``{"question", "options", "answer"}``, or JSON text of one) as
    a list of dicts with the answer as an option index (None for None), checked as every door checks
    them (:func:`~capreward.scorers.qa_questions.questions_of`: the dataset column, ``extra_info`` and
    the scorer alike). Raises :class:`LabelError` naming ``where`` for JSON that does not parse or nests
    too deeply, a question that is not well formed (options not a list of 2..10 distinct non-blank
    strings, a blank question, an answer that is no option), an empty list, more than
    :data:`MAX_QUESTIONS` questions or more than :data:`MAX_QUESTION_CHARS` characters."""
    from ..scorers.qa_questions import InvalidQuestions, questions_of

    try:
        questions = questions_of(value, f"{where}: questions")
    except InvalidQuestions as exc:
        raise LabelError(str(exc)) from None
    if questions is None:
        return None
    return [{"question": q.question, "options": list(q.options), "answer": q.answer} for q in questions]


def _path_value(value: Any, key: str, where: str) -> str | None:
    value = _tolist(value)
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        shown = value if isinstance(value, (int, float, bool, str)) else type(value).__name__
        raise LabelError(f"{where}: {key!r} must be a non-empty path string, got {capped(shown)}")
    return value


#: The most images one label may name (each is decoded and encoded).
MAX_IMAGES = 64


def _image_list(value: Any, where: str) -> list[str] | None:
    """The paths of an ``images`` value: a list of 1 to :data:`MAX_IMAGES` non-empty path strings (a
    single path is a list of one); None for None."""
    value = _tolist(value)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        value = [value]
    if not value:
        raise LabelError(f"{where}: 'images' is an empty list; name at least one image, or leave the key out")
    if len(value) > MAX_IMAGES:
        raise LabelError(f"{where}: 'images' names {len(value)} images; at most {MAX_IMAGES}")
    paths = []
    for k, v in enumerate(value):
        path = _path_value(v, f"images[{k}]", where)
        if path is None:
            raise LabelError(f"{where}: 'images[{k}]' must be a non-empty path string, got None")
        paths.append(path)
    return paths


def _policy(paths: MediaPaths | str | os.PathLike | None) -> MediaPaths:
    if isinstance(paths, MediaPaths):
        return paths
    return MediaPaths(paths, allow_any_path=True)


def parse_label(label: Any, where: str = "label", paths: MediaPaths | str | os.PathLike | None = None) -> Label:
    """Parse one label (dict or JSON string of a dict); see the module docstring for the keys.

    ``paths``: a :class:`~capreward.adapters.paths.MediaPaths` policy, or a directory (or None) that
    relative paths are joined to with no confinement (trusted callers). Raises :class:`LabelError`
    naming ``where`` when the label is not a dict/JSON object, has unknown keys, gives both an image
    and a video, has values of the wrong type, or names nothing to score against. A path the policy
    refuses is no LabelError: the label comes back with ``error`` set (the same text whatever the
    reason), and other problems with a file are reported by the scorer, per sample.
    """
    if isinstance(label, (str, bytes)):
        try:
            label = json_limits.loads(label, where=where)
        except json_limits.JSONLimitError as exc:  # names the field: labels[2].visual_id is an integer of ...
            raise LabelError(str(exc)) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LabelError(f"{where} is not valid JSON ({exc}); expected an object such as "
                             '{"video": "clip.mp4", "references": ["..."]}') from None
    if not isinstance(label, dict):
        raise LabelError(f"{where} must be an object with image/video/references keys, got {type(label).__name__}")
    unknown = sorted(set(label) - set(LABEL_KEYS))
    if unknown:
        shown = ", ".join(capped(k) for k in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise LabelError(f"{where} has unknown keys [{shown}]; allowed: {list(LABEL_KEYS)}")
    if label.get("image") is not None and label.get("images") is not None:
        raise LabelError(f"{where} gives both 'image' and 'images'; give one (the other would be ignored)")
    image = _path_value(label.get("image"), "image", where)
    images = _image_list(label.get("images"), where)
    if images:
        image = images[0]
    video = _path_value(label.get("video"), "video", where)
    if image is not None and video is not None:
        raise LabelError(f"{where} gives both an image and a video; give one")
    policy, error = _policy(paths), None
    image_at: str | ConfinedFile | None = image
    images_at: list[str | ConfinedFile] | None = None if images is None else list(images)
    video_at: str | ConfinedFile | None = video
    try:
        resolved = [policy.resolve(p) for p in images or ([image] if image is not None else [])]
        image_at = resolved[0] if resolved else None
        images_at = resolved if len(resolved) > 1 else None
        video_at = None if video is None else policy.resolve(video)
    except PathRefused as exc:
        error = f"{'image' if image_at is not None else 'video'}: {exc}"
        images_at = None
    visual_id = label.get("visual_id")
    if visual_id is not None and not isinstance(visual_id, (str, int)):
        raise LabelError(f"{where}: visual_id must be a str, got {type(visual_id).__name__}")
    parsed = Label(image=image_at, video=video_at, references=parse_references(label.get("references"), where),
                   visual_id=None if visual_id is None else str(visual_id), error=error,
                   questions=parse_label_questions(label.get("questions"), where),
                   images=None if images_at is None else tuple(images_at))
    if not parsed.has_input:
        raise LabelError(f"{where} names no image, video, references or questions to score against")
    return parsed
