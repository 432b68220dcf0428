"""How ``capreward score`` runs each built-in metric whose rows the generic runner cannot write: the
``job_runner`` hooks their specs name (:attr:`capreward.registry.MetricSpec.job_runner`).

Each hook is ``build(spec, job) -> run(rows) -> list[dict]``: ``job`` is the
:class:`~capreward.jobs.runners.ManifestScorer` (the shared CLIP ``job.backbone``, the judges
``job.local_judge()`` / ``job.chat_backend()``, the job's fixed idf ``job.idf`` and its options
``job.options``), ``rows`` a batch of :class:`~capreward.jobs.manifest.ManifestRow`, and each returned dict
one row's fields (``_error``: the row's error for this metric). The fields each writes are listed in
:mod:`capreward.jobs.runners`. A metric whose scorer returns ``score`` and its sub-scores as attributes
needs no hook (see :func:`capreward.jobs.runners.generic_runner`).

Nothing here is imported before a job runs (the specs name the hooks by ``"module:attr"``).
"""

from __future__ import annotations

from typing import Any, Callable

from .. import registry
from ..jobs.manifest import ManifestRow
from ..jobs.runners import alignment_fields, finite_or_none, row_groups, visual_error, visual_refused
from ..names import sub_score

Runner = Callable[[list[ManifestRow]], list[dict]]


def emscore_runner(spec, job) -> Runner:
    """EMScore: the headline and every ``<part>/<component>``; ``alignment`` with ``--alignment``."""
    from .emscore import EMScore

    scorer = EMScore(backbone=job.backbone, idf=job.idf, idf_default=job.options.idf_default,
                     frames=job.options.frames, batch_size=job.options.batch_size)

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, refs, idx in row_groups(rows):
            visual = {f"{kind}s": [rows[i].path for i in idx]}
            res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
            for pos, (j, flat) in enumerate(zip(idx, res.rows())):
                out[j] = {spec.name: flat.pop("score"), **{sub_score(spec.name, k): v for k, v in flat.items()}}
                if job.options.alignment and res.alignment is not None:
                    out[j]["alignment"] = alignment_fields(res.alignment[pos])
        return out

    return run


def clip_like(spec, scorer) -> Runner:
    """CLIP-S / PAC-S rows: the headline, and its ``ref`` field (``ref_clip_s``) with references."""
    ref_field = spec.field_of("ref")

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, refs, idx in row_groups(rows):
            visual = {f"{kind}s": [rows[i].path for i in idx]}
            res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
            for j, k in enumerate(idx):
                out[k] = {spec.name: float(res.clip_s[j])}
                if res.ref_clip_s is not None:
                    out[k][ref_field] = float(res.ref_clip_s[j])
        return out

    return run


def clip_s_runner(spec, job) -> Runner:
    """CLIP-S on the job's shared CLIP."""
    cls = spec.load()
    return clip_like(spec, cls(backbone=job.backbone, batch_size=job.options.batch_size, frames=job.options.frames))


def pac_s_runner(spec, job) -> Runner:
    """PAC-S on its own checkpoint (``--pac-model``)."""
    cls = spec.load()
    if not job.options.pac_model:
        raise ValueError("pac_s needs the PAC-S checkpoint: pass --pac-model /path/to/clip_ViT-B-32.pth")
    scorer = cls(job.options.pac_model, device=job.options.device, precision=job.options.precision,
                 batch_size=job.options.batch_size, frames=job.options.frames)
    return clip_like(spec, scorer)


def hallucination_runner(spec, job) -> Runner:
    """The penalty and its ``flagged`` token positions; ``alignment`` with ``--alignment`` when no other
    chosen metric writes it."""
    cls = spec.load()
    penalty = cls(
        backbone=job.backbone, idf=job.idf, idf_default=job.options.idf_default, frames=job.options.frames,
        batch_size=job.options.batch_size, threshold=spec.job_config(job.flag_values())["threshold"],
    )
    # EMScore's alignment is written by the metric that writes it; alone, the penalty writes it itself
    write_alignment = job.options.alignment and not any(
        m != spec.name and registry.get(m).writes_alignment for m in job.options.metrics)
    flagged = sub_score(spec.name, spec.flagged_tokens)

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, _, idx in row_groups(rows, with_references=False):
            alignments = penalty.alignments([rows[i].caption for i in idx], [rows[i].path for i in idx], kind)
            # the row's alignment is EMScore's (what an emscore runner writes); the penalty's flags also
            # read each content word encoded alone, so they can differ from that alignment's similarities
            shown = getattr(alignments, "contextual", alignments)
            for j, a, c in zip(idx, alignments, shown):
                report = penalty.report_for(a)
                out[j] = {spec.name: report.penalty, flagged: report.flagged_index}
                if write_alignment:
                    out[j]["alignment"] = alignment_fields(c)
        return out

    return run


def fleur_runner(spec, job) -> Runner:
    """FLEUR on the local LLaVA, or its remote scorer on the judge server (read exactly)."""
    if job.options.remote_judge:  # the served judge, read exactly (as visce2/gveval)
        scorer = spec.load_remote_scorer()(job.chat_backend(), top_logprobs=min(20, job.options.judge_top_logprobs_cap))
    else:
        scorer = spec.load()(model=job.local_judge())

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, refs, idx in row_groups(rows):  # videos are judged on G-VEval's three-frame composite
            visual = {f"{kind}s": [rows[i].path for i in idx]}
            res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
            for j, k in enumerate(idx):
                out[k] = {spec.name: finite_or_none(float(res.score[j])), sub_score(spec.name, "raw"): res.raw[j]}
                if res.error[j]:
                    out[k]["_error"] = res.error[j]
        return out

    return run


def visce2_runner(spec, job) -> Runner:
    """VisCE²: images only (a video row gets the spec's refusal)."""
    scorer = spec.load()(job.chat_backend(), **job.tree())

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} if (e := visual_refused(spec, {}, r.kind)) is None else {"_error": e} for r in rows]
        idx = [i for i, r in enumerate(rows) if not out[i]]
        if not idx:
            return out
        res = scorer.score([rows[i].caption for i in idx], [rows[i].path for i in idx])
        for pos, i in enumerate(idx):
            if (visual := visual_error(rows[i], pos, res.error[pos])) is not None:
                out[i] = {"_error": visual}
                continue
            out[i] = {spec.name: finite_or_none(float(res.score[pos])), sub_score(spec.name, "raw"): res.raw[pos],
                      sub_score(spec.name, "context"): res.context[pos]}
            if res.error[pos]:
                out[i]["_error"] = res.error[pos]
        return out

    return run


def claims_runner(spec, job) -> Runner:
    """Claim F1 (precision alone without references), its parts and the per-claim verdicts."""
    scorer = spec.load()(job.chat_backend())
    name = spec.name

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind, refs, idx in row_groups(rows):
            res = scorer.score([rows[i].caption for i in idx], references=refs,
                               **{f"{kind}s": [rows[i].path for i in idx]})
            for j, k in enumerate(idx):
                out[k] = {name: finite_or_none(float(res.score[j])),
                          sub_score(name, "precision"): finite_or_none(float(res.precision[j]))}
                if refs is not None:
                    out[k][sub_score(name, "recall")] = finite_or_none(float(res.recall[j]))
                out[k][sub_score(name, "n_claims")] = int(res.n_claims[j])
                out[k][sub_score(name, "false_claims")] = finite_or_none(float(res.false_claims[j]))
                out[k][sub_score(name, "claims")] = [
                    {"text": v.text, "start": v.start, "end": v.end, "p": finite_or_none(float(v.p))} for v in res.claims[j]]
                if res.error[j]:
                    out[k]["_error"] = res.error[j]
        return out

    return run


def qa_utility_runner(spec, job) -> Runner:
    """QA utility: a text-only judge (``--qa-model``, or the judge server) answers the row's ``questions``
    (written by the chat judge when the row has none)."""
    from .qa_utility import LocalTextJudge

    if job.options.qa_model:
        answerer: Any = LocalTextJudge(job.options.qa_model)
    elif job.options.remote_judge:
        answerer = job.chat_backend()
    else:
        raise ValueError("qa_utility needs a text judge: --qa-model (a causal LM) or a judge server")
    scorer = spec.load()(answerer, question_backend=job.chat_backend() if job.options.remote_judge else None)
    if not job.options.remote_judge:  # a local question writer is the local LLaVA, loaded on first need
        from ..judges.lazy import LazyBackend

        scorer.question_backend = LazyBackend(job.chat_backend)
    name = spec.name

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind in ("image", "video"):
            idx = [i for i, r in enumerate(rows) if r.kind == kind]
            if not idx:
                continue
            res = scorer.score([rows[i].caption for i in idx],
                               questions=[rows[i].extra.get("questions") for i in idx],
                               **{f"{kind}s": [rows[i].path for i in idx]})
            for j, k in enumerate(idx):
                out[k] = {name: finite_or_none(float(res.score[j])),
                          sub_score(name, "n_questions"): int(res.n_questions[j]),
                          sub_score(name, "answers"): [finite_or_none(float(p)) for p in res.answers[j]]}
                if res.error[j]:
                    out[k]["_error"] = res.error[j]
        return out

    return run


def gveval_runner(spec, job) -> Runner:
    """G-VEval in the job's mode (``--gveval-mode``), with its ACCR dimensions (``--gveval-accr``, videos
    only); a row without references in a mode that needs them gets an error."""
    config = spec.job_config(job.flag_values())
    mode, accr = config["mode"], config["accr"]
    scorer = spec.load()(job.chat_backend(), mode=mode, accr=accr, **job.tree())
    needs_refs = spec.references_for(config) == "required"
    accr_flag = next(f.flags[0] for f in spec.job_flags if f.option == "accr")
    name = spec.name

    def run(rows: list[ManifestRow]) -> list[dict]:
        out: list[dict] = [{} for _ in rows]
        for kind in ("image", "video"):
            idx = []
            for i, r in enumerate(rows):
                if r.kind != kind:
                    continue
                if needs_refs and not r.references:
                    out[i] = {"_error": f"{spec.title} mode {mode!r} needs references; the row has none"}
                elif (refused := visual_refused(spec, {"accr": accr}, kind)) is not None:
                    out[i] = {"_error": f"{refused}; score {kind}s without {accr_flag}"}
                else:
                    idx.append(i)
            if not idx:
                continue
            visual = {"images" if kind == "image" else "videos": [rows[i].path for i in idx]}
            res = scorer.score([rows[i].caption for i in idx],
                               references=[rows[i].references for i in idx] if needs_refs else None, **visual)
            for pos, i in enumerate(idx):
                if (visual := visual_error(rows[i], pos, res.error[pos])) is not None:
                    out[i] = {"_error": visual}
                    continue
                out[i] = {name: finite_or_none(float(res.score[pos])), sub_score(name, "raw"): res.raw[pos]}
                for sub in spec.sub_scores_for(config):
                    if sub != "raw":  # the ACCR dimensions, with accr
                        out[i][sub_score(name, sub)] = finite_or_none(float(getattr(res, sub)[pos]))
                if res.error[pos]:
                    out[i]["_error"] = res.error[pos]
        return out

    return run
