"""How ``capreward explain`` asks each judge metric why: the ``explainer`` hooks their specs name
(:attr:`capreward.registry.MetricSpec.explainer`).

Each hook is ``build(spec, args) -> explain(rows) -> list[dict]``: ``args`` holds the command's options
(``judge_model``, ``device``, ``dtype``, ``batch_size``, ``max_new_tokens``, ``references``), ``rows`` a
batch of :class:`~capreward.jobs.manifest.ManifestRow`, and each returned dict one row's fields: the score
under the metric's name, ``<metric>/raw``, ``explanation`` and ``_error`` (the row's error). The first
paragraph of a hook's docstring is its line in ``capreward explain --help``. Nothing heavy is imported
before a hook is built.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..names import sub_score

Explainer = Callable[[list], list[dict]]  # manifest rows -> one result dict per row


def _split_by_kind(rows: list) -> dict[str, list[int]]:
    kinds: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        kinds.setdefault(r.kind, []).append(i)
    return kinds


def fleur_explainer(spec, args: Any) -> Explainer:
    """FLEUR, or RefFLEUR with --references: the score, then the follow-up question "Why? Tell me the
    reason."

    A row without a score gets the reason and no explanation."""
    scorer = spec.load()(model=args.judge_model, device=args.device, dtype=args.dtype, batch_size=args.batch_size,
                   explain_max_new_tokens=args.max_new_tokens)

    def run(rows: list) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, idx in _split_by_kind(rows).items():
            caps = [rows[i].caption for i in idx]
            visual = {"images" if kind == "image" else "videos": [rows[i].path for i in idx]}
            refs = [rows[i].references for i in idx] if args.references else None
            if refs is not None and any(r is None for r in refs):
                missing = next(rows[i].id for i in idx if rows[i].references is None)
                raise ValueError(f"--references: row {missing!r} has no references")
            res = scorer.score(caps, references=refs, **visual)
            scores = res.score.tolist()
            ok = [k for k, s in enumerate(scores) if not math.isnan(s)]
            explanations: dict[int, str] = {}
            if ok:
                sub = {key: [v[k] for k in ok] for key, v in visual.items()}
                texts = scorer.explain([caps[k] for k in ok], references=[refs[k] for k in ok] if refs else None,
                                       scores=[scores[k] for k in ok], **sub)
                explanations = dict(zip(ok, texts))
            for k, i in enumerate(idx):
                row = {spec.name: None if math.isnan(scores[k]) else scores[k], sub_score(spec.name, "raw"): res.raw[k],
                       "explanation": explanations.get(k)}
                if res.error[k]:
                    row["_error"] = res.error[k]
                out[i] = row
        return out

    return run


def gveval_explainer(spec, args: Any) -> Explainer:
    """G-VEval: the judge writes its reasoning before the score; that reasoning is the explanation.

    The combined mode with --references, else reference-free."""
    from ..judges.local import LocalJudge
    from ..judges.local_chat import LocalChatJudge

    judge = LocalJudge(args.judge_model, device=args.device, dtype=args.dtype)
    scorer = spec.load()(LocalChatJudge(judge, batch_size=args.batch_size), mode="combined" if args.references else "ref-free",
                    max_tokens=args.max_new_tokens)

    def run(rows: list) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, idx in _split_by_kind(rows).items():
            visual = {"images" if kind == "image" else "videos": [rows[i].path for i in idx]}
            refs = [rows[i].references or [] for i in idx] if args.references else None
            res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
            for k, i in enumerate(idx):
                score = float(res.score[k])
                row = {spec.name: None if math.isnan(score) else score, sub_score(spec.name, "raw"): res.raw[k],
                       "explanation": res.raw[k] or None}
                if res.error[k]:
                    row["_error"] = res.error[k]
                out[i] = row
        return out

    return run
