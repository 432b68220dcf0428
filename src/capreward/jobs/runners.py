"""Metric runners for offline jobs: manifest rows in, one flat result dict per row out.

A batch is scored at once; if that fails on a bad item, its rows are scored one by one so that the
error is recorded on the offending row only (``errors[metric] = reason``) and nothing else is lost.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..backbones.clip_loading import DEFAULT_CLIP
from .manifest import ManifestRow

logger = logging.getLogger(__name__)

METRICS = ("emscore", "clip_s", "pac_s", "fleur")


@dataclass
class ScoreOptions:
    """Everything a worker needs to build its scorers (picklable, so Ray actors can receive it)."""

    metrics: list[str] = field(default_factory=lambda: ["emscore"])
    clip_model: str = DEFAULT_CLIP
    pac_model: str | None = None
    fleur_model: str = "llava-hf/llava-1.5-13b-hf"
    device: str = "cpu"
    precision: str | None = None
    batch_size: int = 64
    frames: int | None = 10
    idf_corpus: list[str] | None = None  # fixed for the whole job, so results do not depend on batching
    alignment: bool = False  # store EMScore's token -> best-frame alignment per row (for reports)

    def __post_init__(self):
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"unknown metrics {unknown}; choose from {list(METRICS)}")


def finite_or_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


class ManifestScorer:
    """Builds the chosen scorers once (sharing one CLIP) and scores batches of manifest rows."""

    def __init__(self, options: ScoreOptions):
        self.options = options
        self._runners: dict[str, Callable[[list[ManifestRow]], list[dict]]] = {}
        backbone = None
        if {"emscore", "clip_s"} & set(options.metrics):
            from ..backbones.clip import CLIPBackbone

            backbone = CLIPBackbone(options.clip_model, device=options.device, precision=options.precision)
        for metric in options.metrics:
            self._runners[metric] = getattr(self, f"_build_{metric}")(backbone)

    def _build_emscore(self, backbone):
        from ..scorers.emscore import EMScore

        scorer = EMScore(backbone=backbone, idf=self.options.idf_corpus or False, frames=self.options.frames,
                         batch_size=self.options.batch_size)

        def run(rows: list[ManifestRow]) -> list[dict]:
            out: list[dict] = [{} for _ in rows]
            refs = [r.references for r in rows]
            has_refs = all(r is not None for r in refs)
            for kind in ("video", "image"):
                idx = [i for i, r in enumerate(rows) if r.kind == kind]
                if not idx:
                    continue
                visual = {"videos" if kind == "video" else "images": [rows[i].path for i in idx]}
                res = scorer.score([rows[i].caption for i in idx], references=[refs[i] for i in idx] if has_refs else None, **visual)
                for pos, (j, flat) in enumerate(zip(idx, res.rows())):
                    out[j] = {"emscore": flat.pop("score"), **{f"emscore.{k}": v for k, v in flat.items()}}
                    if self.options.alignment and res.alignment is not None:
                        a = res.alignment[pos]
                        out[j]["alignment"] = {"tokens": a.tokens, "best_frame": a.best_frame,
                                               "similarity": a.similarity, "weight": a.weight}
            return out

        return run

    def _clip_like(self, scorer, name: str):
        def run(rows: list[ManifestRow]) -> list[dict]:
            out: list[dict] = [{} for _ in rows]
            refs = [r.references for r in rows]
            has_refs = all(r is not None for r in refs)
            for kind in ("image", "video"):
                idx = [i for i, r in enumerate(rows) if r.kind == kind]
                if not idx:
                    continue
                visual = {"images" if kind == "image" else "videos": [rows[i].path for i in idx]}
                res = scorer.score([rows[i].caption for i in idx], references=[refs[i] for i in idx] if has_refs else None, **visual)
                for j, k in enumerate(idx):
                    out[k] = {name: float(res.clip_s[j])}
                    if res.ref_clip_s is not None:
                        out[k][f"ref_{name}"] = float(res.ref_clip_s[j])
            return out

        return run

    def _build_clip_s(self, backbone):
        from ..scorers.clipscore import CLIPScore

        return self._clip_like(CLIPScore(backbone=backbone, batch_size=self.options.batch_size, frames=self.options.frames), "clip_s")

    def _build_pac_s(self, backbone):
        from ..scorers.clipscore import PACScore

        if not self.options.pac_model:
            raise ValueError("pac_s needs the PAC-S checkpoint: pass --pac-model /path/to/clip_ViT-B-32.pth")
        scorer = PACScore(self.options.pac_model, device=self.options.device, precision=self.options.precision,
                          batch_size=self.options.batch_size, frames=self.options.frames)
        return self._clip_like(scorer, "pac_s")

    def _build_fleur(self, backbone):
        from ..scorers.fleur import FLEUR

        scorer = FLEUR(model=self.options.fleur_model, device=self.options.device)

        def run(rows: list[ManifestRow]) -> list[dict]:
            if any(r.kind != "image" for r in rows):
                raise ValueError("FLEUR scores images; video rows need the composite option")
            refs = [r.references for r in rows]
            res = scorer.score([r.caption for r in rows], [r.path for r in rows],
                               references=refs if all(x is not None for x in refs) else None)
            out = []
            for i in range(len(rows)):
                row = {"fleur": finite_or_none(float(res.score[i])), "fleur.raw": res.raw[i]}
                if res.error[i]:
                    row["_error"] = res.error[i]
                out.append(row)
            return out

        return run

    def score_rows(self, rows: list[ManifestRow]) -> list[dict]:
        """One result dict per row: id, caption, visual path, metric fields, and ``errors``."""
        results = [base_fields(r) for r in rows]
        for metric, run in self._runners.items():
            for i, fields_ in enumerate(isolate_errors(run, rows, metric)):
                err = fields_.pop("_error", None)
                results[i].update(fields_)
                if err:
                    results[i]["errors"][metric] = err
        for r in results:
            if not r["errors"]:
                r["errors"] = None
        return results


def base_fields(row: ManifestRow) -> dict:
    out = {"id": row.id, "caption": row.caption, row.kind: row.path, "errors": {}}
    if row.references is not None:
        out["references"] = row.references
    return out


def isolate_errors(run, rows: list[ManifestRow], metric: str) -> list[dict]:
    """``run(rows)``; if it raises, run each row alone and record the failures as ``_error``."""
    try:
        return run(rows)
    except Exception as exc:  # noqa: BLE001 - any scorer failure must stay on its row
        if len(rows) == 1:
            logger.warning("%s failed on row %s: %s", metric, rows[0].id, exc)
            return [{"_error": f"{type(exc).__name__}: {exc}"}]
    out = []
    for row in rows:
        out.extend(isolate_errors(run, [row], metric))
    return out


def idf_corpus_from(option: str, rows: list[ManifestRow]) -> list[str] | None:
    """``none`` → None; ``refs`` → every reference in the manifest; ``auto`` → refs if any; else a
    text file with one caption per line."""
    if option == "none":
        return None
    if option in ("refs", "auto"):
        corpus = [ref for r in rows if r.references for ref in r.references]
        if not corpus and option == "refs":
            raise ValueError("--idf refs: the manifest has no references")
        return corpus or None
    lines = [line.strip() for line in Path(option).read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line]
