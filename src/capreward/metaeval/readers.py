"""Readers for the human-judgment files as the benchmarks release them.

Each reader takes a path and returns :class:`~capreward.metaeval.judgments.Judgments`; malformed
items raise :class:`JudgmentError` naming the file and item. Formats:

- Flickr8k-Expert / Flickr8k-CF / Composite (``flickr8k.json``, ``crowdflower_flickr8k.json`` and the
  Composite file in the same layout, as distributed with the CLIP-S / PAC-S evaluation code):
  ``{key: {"image_id", "image_path", "ground_truth": [...], "human_judgement": [{"image_id",
  "image_path", "caption", "rating"}, ...]}}``; one item per rating. A judgement may also carry
  ``correctness`` and ``thoroughness`` (Composite's two dimensions).
- Pascal-50S: ``{"HC"|"HI"|"HM"|"MM": [{"image", "captions": [a, b], "label": 0|1, "references"}]}``;
  ``label`` is the index of the caption people preferred.
- MSVD-Eval: ``{vid: {"vname", "ref", "candidate", "human_score": [[acc, comp, conc, rel, overall], ...]}}``
  (one list per annotator); the item keeps each annotator's scores and their means per dimension.
- VATEX-EVAL: the released folder (``candidates_list.pkl``, ``video_ids.pkl``, ``human_scores.pkl``
  holding the three annotators' scores back to back), or a JSONL of ``{"video", "caption",
  "human_scores": [s1, s2, s3]}``.
- THumB 1.0: JSONL rows ``{"image", "hyp", "human_score", "P", "R", ...}``.
- FOIL: the COCO-style ``{"annotations": [{"id", "image_id", "caption", "foil": bool}]}``; an original
  caption and its foiled versions share ``id``; each (original, foil) is a pair preferring the original.
- CapArena (long captions, pairwise battles; ``caparena_annots_eval.json`` of njucckevin/CapArena): a
  JSON list of ``{"img", "caption1", "caption2", "source1", "source2", "winner", "cluster", "ref"}``;
  ``winner`` is the source people preferred, anything else a tie (``preferred = -1``); ``cluster`` (the
  difficulty level) is the category; ``ref`` becomes the item's references.
- DetailCaps-style per-caption scores (DeCapBench / DetailCaps consistency): JSONL rows
  ``{"image", "caption", "human_score"}`` (``"score"`` accepted), one per rated long caption.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from collections.abc import Callable

from ..jsonl import json_lines
from .judgments import Judgments, JudgmentError, PairItem, RatedItem, as_rating, visual_aliases

log = logging.getLogger(__name__)

PASCAL_CATEGORIES = ("HC", "HI", "HM", "MM")
ACCR_DIMENSIONS = ("accuracy", "completeness", "conciseness", "relevance", "overall")
# Per-rating columns a judgement of the Flickr8k layout may carry besides ``rating`` (Composite's two
# dimensions).
FLICKR_EXTRA_COLUMNS = ("correctness", "thoroughness")


def _load_json(path: Path) -> object:
    from ..input_files import NotARegularFile, open_regular_stream

    try:
        with open_regular_stream(path, "the judgments file", "r", encoding="utf-8") as f:  # a FIFO: refused
            return json.load(f)
    except FileNotFoundError:
        raise JudgmentError(f"{path}: no such judgments file") from None
    except NotARegularFile as exc:
        raise JudgmentError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise JudgmentError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None


def read_jsonl_objects(path: Path, what: str = "judgments") -> list[tuple[str, dict]]:
    """``(where, object)`` for every non-blank line of a JSONL file, ``where`` being ``path:line``.
    Raises JudgmentError naming the file (missing: "no such <what> file") or the line (invalid JSON,
    not an object)."""
    if not path.exists():
        raise JudgmentError(f"{path}: no such {what} file")
    rows = []
    for _, where, obj in json_lines(path, JudgmentError):
        if not isinstance(obj, dict):
            raise JudgmentError(f"{where}: expected a JSON object")
        rows.append((where, obj))
    return rows


def _caption(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise JudgmentError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    return value


def read_flickr8k(path: str | Path, benchmark: str = "flickr8k-expert") -> Judgments:
    """Flickr8k-Expert, Flickr8k-CF or Composite in the ``human_judgement`` layout: one item per rating
    (NaN ratings kept here; the protocol drops and counts them)."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise JudgmentError(f"{path}: expected an object keyed by image, got {type(data).__name__}")
    out = Judgments(benchmark, str(path))
    for key, entry in data.items():
        where = f"{path}[{key!r}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("human_judgement"), list):
            raise JudgmentError(f"{where}: expected an object with a 'human_judgement' list")
        for i, h in enumerate(entry["human_judgement"]):
            w = f"{where}.human_judgement[{i}]"
            if not isinstance(h, dict):
                raise JudgmentError(f"{w}: expected an object")
            image_id = h.get("image_id", entry.get("image_id", key))
            image_path = h.get("image_path", entry.get("image_path"))
            human = {"rating": as_rating(h.get("rating"), w)}
            for column in FLICKR_EXTRA_COLUMNS:
                if column in h:
                    human[column] = as_rating(h[column], f"{w}.{column}")
            out.rated.append(RatedItem(visual_aliases(image_id, image_path), _caption(h, "caption", w), human, w,
                                       group=str(key)))
    return out


def read_pascal50s(path: str | Path) -> Judgments:
    """Pascal-50S pairs by category (HC, HI, HM, MM)."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict) or not set(data) & set(PASCAL_CATEGORIES):
        raise JudgmentError(f"{path}: expected an object with categories {list(PASCAL_CATEGORIES)}")
    out = Judgments("pascal50s", str(path))
    for category, items in data.items():
        if category not in PASCAL_CATEGORIES:
            raise JudgmentError(f"{path}: unknown category {category!r}; expected {list(PASCAL_CATEGORIES)}")
        for i, item in enumerate(items):
            where = f"{path}[{category!r}][{i}]"
            captions = item.get("captions") if isinstance(item, dict) else None
            if not (isinstance(captions, list) and len(captions) == 2 and all(isinstance(c, str) for c in captions)):
                raise JudgmentError(f"{where}: 'captions' must be a list of two strings")
            label = item.get("label")
            if label not in (0, 1) or isinstance(label, bool):
                raise JudgmentError(f"{where}: 'label' must be 0 or 1 (index of the preferred caption), got {label!r}")
            if not isinstance(item.get("image"), str):
                raise JudgmentError(f"{where}: 'image' must be a string")
            out.pairs.append(PairItem(visual_aliases(item["image"]), (captions[0], captions[1]), int(label), category, where))
    return out


def read_msvd_eval(path: str | Path) -> Judgments:
    """MSVD-Eval: per candidate each annotator's ACCR dimensions and overall score (``annotators``) and
    their means (``human``)."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise JudgmentError(f"{path}: expected an object keyed by video id")
    out = Judgments("msvd-eval", str(path))
    for vid, entry in data.items():
        where = f"{path}[{vid!r}]"
        if not isinstance(entry, dict):
            raise JudgmentError(f"{where}: expected an object")
        scores = entry.get("human_score")
        if not (isinstance(scores, list) and scores and all(isinstance(a, list) and len(a) == 5 for a in scores)):
            raise JudgmentError(f"{where}: 'human_score' must be a list of [accuracy, completeness, conciseness, relevance, overall] per annotator")
        annotators = tuple({name: as_rating(a[d], f"{where}.human_score[{k}][{d}]") for d, name in enumerate(ACCR_DIMENSIONS)}
                           for k, a in enumerate(scores))
        human = {name: sum(a[name] for a in annotators) / len(annotators) for name in ACCR_DIMENSIONS}
        out.rated.append(RatedItem(visual_aliases(vid, entry.get("vname")), _caption(entry, "candidate", where), human, where,
                                   annotators=annotators))
    return out


def read_vatex_eval(path: str | Path) -> Judgments:
    """VATEX-EVAL from the released pickle folder or a JSONL (see the module docstring)."""
    path = Path(path)
    out = Judgments("vatex-eval", str(path))
    if path.is_dir():
        import pickle

        import numpy as np

        def load(name: str):
            file = path / name
            if not file.exists():
                raise JudgmentError(f"{path}: missing {name} (the released VATEX-EVAL folder has it)")
            from ..input_files import NotARegularFile, open_regular_stream

            try:
                f = open_regular_stream(file, name)  # a FIFO or a device: refused, never read
            except NotARegularFile as exc:
                raise JudgmentError(str(exc)) from None
            with f:
                return pickle.load(f)  # the release's own format; only read files you trust

        cands = [str(c) for c in np.asarray(load("candidates_list.pkl")).tolist()]
        vids = [str(v) for v in np.asarray(load("video_ids.pkl")).tolist()]
        human = np.asarray(load("human_scores.pkl"), dtype=float)
        if human.size % len(cands) or len(vids) != len(cands):
            raise JudgmentError(f"{path}: {len(cands)} candidates, {len(vids)} video ids and {human.size} human scores do not line up")
        # The release stores annotator 1's scores for every candidate, then annotator 2's, ...
        human = human.reshape(-1, len(cands)).T
        for i, (vid, cap) in enumerate(zip(vids, cands)):
            ratings = {f"annotator_{k + 1}": float(v) for k, v in enumerate(human[i])}
            out.rated.append(RatedItem(visual_aliases(vid), cap, ratings, f"{path}[{i}]"))
        return out
    for where, obj in read_jsonl_objects(path):
        scores = obj.get("human_scores")
        if not (isinstance(scores, list) and scores):
            raise JudgmentError(f"{where}: 'human_scores' must be a list with one score per annotator")
        video = obj.get("video", obj.get("video_id"))
        if video is None:
            raise JudgmentError(f"{where}: needs 'video'")
        ratings = {f"annotator_{k + 1}": as_rating(v, where) for k, v in enumerate(scores)}
        out.rated.append(RatedItem(visual_aliases(video), _caption(obj, "caption", where), ratings, where))
    return out


def read_thumb(path: str | Path) -> Judgments:
    """THumB 1.0 JSONL: ``human_score`` (the total), plus precision ``P`` and recall ``R`` when given."""
    path = Path(path)
    out = Judgments("thumb", str(path))
    for where, obj in read_jsonl_objects(path):
        if "human_score" not in obj or not isinstance(obj.get("image"), str):
            raise JudgmentError(f"{where}: a THumB row needs 'image', 'hyp' and 'human_score'")
        human = {"human_score": as_rating(obj["human_score"], where)}
        for k in ("P", "R"):
            if k in obj:
                human[k] = as_rating(obj[k], where)
        out.rated.append(RatedItem(visual_aliases(obj["image"]), _caption(obj, "hyp", where), human, where))
    return out


def coco_file_name(image_id: int | str, split: str = "val2014") -> str:
    return f"COCO_{split}_{int(image_id):012d}.jpg"


def read_foil(path: str | Path) -> Judgments:
    """FOIL-COCO: one pair (original, foil) per foiled caption, the original preferred."""
    path = Path(path)
    data = _load_json(path)
    anns = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(anns, list):
        raise JudgmentError(f"{path}: expected a COCO-style object with an 'annotations' list")
    groups: dict[object, dict[str, list]] = defaultdict(lambda: {"orig": [], "foil": []})
    for i, a in enumerate(anns):
        where = f"{path}.annotations[{i}]"
        if not isinstance(a, dict) or "id" not in a or "image_id" not in a or not isinstance(a.get("foil"), bool):
            raise JudgmentError(f"{where}: needs 'id', 'image_id', 'caption' and a boolean 'foil'")
        _caption(a, "caption", where)
        groups[a["id"]]["foil" if a["foil"] else "orig"].append((where, a))
    out = Judgments("foil", str(path))
    unpaired = 0
    for gid, g in groups.items():
        if len(g["orig"]) != 1 or not g["foil"]:
            unpaired += len(g["orig"]) + len(g["foil"])
            continue
        _, orig = g["orig"][0]
        for where, foil in g["foil"]:
            if foil["image_id"] != orig["image_id"]:
                raise JudgmentError(f"{where}: foil of caption id {gid!r} is on image {foil['image_id']}, the original on {orig['image_id']}")
            image_id = orig["image_id"]
            visual = visual_aliases(image_id, coco_file_name(image_id)) if str(image_id).isdigit() else visual_aliases(image_id)
            out.pairs.append(PairItem(visual, (orig["caption"], foil["caption"]), 0, "foil", where))
    if unpaired:
        log.warning("%s: %d annotations have no original/foil counterpart and form no pair", path, unpaired)
    return out


def read_caparena(path: str | Path) -> Judgments:
    """CapArena's human battles: one pair per battle, ties kept (``preferred = -1``), the cluster as category."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise JudgmentError(f"{path}: expected a JSON list of battles")
    out = Judgments("caparena", str(path))
    for i, b in enumerate(data):
        where = f"{path}[{i}]"
        if not isinstance(b, dict) or not isinstance(b.get("img"), str):
            raise JudgmentError(f"{where}: a battle needs 'img', 'caption1', 'caption2', 'source1', 'source2', 'winner'")
        c1, c2 = _caption(b, "caption1", where), _caption(b, "caption2", where)
        s1, s2, winner = b.get("source1"), b.get("source2"), b.get("winner")
        if not isinstance(s1, str) or not isinstance(s2, str):
            raise JudgmentError(f"{where}: 'source1' and 'source2' must name the captions' models")
        preferred = 0 if winner == s1 else 1 if winner == s2 else -1
        out.pairs.append(PairItem(visual_aliases(b["img"]), (c1, c2), preferred, str(b.get("cluster", "all")), where,
                                  sources=(s1, s2)))
    return out


def read_detailcaps(path: str | Path) -> Judgments:
    """Per-caption human scores of long captions (DetailCaps / DeCapBench style) from JSONL."""
    path = Path(path)
    out = Judgments("detailcaps", str(path))
    for where, obj in read_jsonl_objects(path):
        score = obj.get("human_score", obj.get("score"))
        if score is None or not isinstance(obj.get("image"), str):
            raise JudgmentError(f"{where}: a row needs 'image', 'caption' and 'human_score'")
        out.rated.append(RatedItem(visual_aliases(obj["image"]), _caption(obj, "caption", where),
                                   {"human_score": as_rating(score, where)}, where, group=obj["image"]))
    return out


READERS: dict[str, Callable[[str | Path], Judgments]] = {
    "flickr8k-expert": lambda p: read_flickr8k(p, "flickr8k-expert"),
    "flickr8k-cf": lambda p: read_flickr8k(p, "flickr8k-cf"),
    "composite": lambda p: read_flickr8k(p, "composite"),
    "pascal50s": read_pascal50s,
    "vatex-eval": read_vatex_eval,
    "msvd-eval": read_msvd_eval,
    "thumb": read_thumb,
    "foil": read_foil,
    "caparena": read_caparena,
    "detailcaps": read_detailcaps,
}
BENCHMARKS = tuple(READERS)


def read_judgments(benchmark: str, path: str | Path) -> Judgments:
    """Read a benchmark's human judgments.

    Args:
        benchmark: one of :data:`BENCHMARKS`.
        path: the benchmark's file, in its released format.

    Returns:
        The :class:`~capreward.metaeval.judgments.Judgments`.

    Raises:
        JudgmentError: the file cannot be used (the message names the file and item).
    """
    if benchmark not in READERS:
        raise ValueError(f"unknown benchmark {benchmark!r}; choose from {list(BENCHMARKS)}")
    judgments = READERS[benchmark](path)
    if not len(judgments):
        raise JudgmentError(f"{path}: no judgments found for {benchmark}")
    return judgments
