"""Metric runners for offline jobs: manifest rows in, one flat result dict per row out.

One runner per metric, built by ``ManifestScorer._build_<metric>``; the fields each writes:

Sub-score fields are named ``<metric>/<sub-score>`` (the one separator of :mod:`capreward.names`).

- ``emscore``: ``emscore`` and ``emscore/<part>/<component>`` (``video/fine_p``, ``reference/full_f``, ...);
  with ``alignment=True`` also ``alignment`` = {tokens (SOS..EOS), best_frame, similarity, weight}.
- ``clip_s`` / ``pac_s``: ``clip_s`` / ``pac_s`` (and ``ref_clip_s`` / ``ref_pac_s`` with references).
- ``hallucination``: ``hallucination``, the penalty of
  :class:`~capreward.scorers.hallucination.Hallucination` in [-1, 0] (0: every content word of the
  caption has a matching frame; -1: none has; more negative is worse), and ``hallucination/flagged``,
  the positions of the flagged tokens in the caption's token list, the same list as ``alignment.tokens``
  (SOS at 0), which ``capreward report`` outlines. With ``alignment=True`` and no ``emscore`` runner it
  writes ``alignment`` itself.
- ``fleur``: ``fleur`` in [0, 1] and ``fleur/raw`` (videos judged on G-VEval's three-frame composite).
- ``visce2``: ``visce2`` in [0, 100], ``visce2/raw`` (the rating answer) and ``visce2/context`` (the
  visual context). Images only: a video row gets an error, and so does an unreadable image (no fields).
  An answer without an integer scores 0, as in the paper, with the reason in ``errors``.
- ``claims``: ``claims`` in [0, 1] (F1 of claim precision and reference-claim recall; precision alone
  without references), ``claims/precision``, ``claims/recall`` (rows with references), ``claims/n_claims``
  and ``claims/claims`` (per claim: text, start, end, p). Videos are judged on their three-frame composite.
- ``qa_utility``: ``qa_utility`` in [0, 1] (expected accuracy of a text-only judge answering the row's
  ``questions`` from the caption alone; rows without questions get them from the chat judge, per visual),
  ``qa_utility/n_questions`` and ``qa_utility/answers``.
- ``gveval``: ``gveval`` in [0, 100] and ``gveval/raw``; with ACCR also ``gveval/accuracy``,
  ``gveval/completeness``, ``gveval/conciseness``, ``gveval/relevance`` (ACCR: videos only). Videos are
  judged on their three-frame composite.

CLIP-based metrics (emscore, clip_s, hallucination) share one CLIP backbone; judge metrics (fleur,
visce2, gveval) share one local LLaVA, or visce2/gveval use an OpenAI-compatible server when
``judge_base_url`` or ``judge_api_model`` is set (key from ``$OPENAI_API_KEY``; fleur then runs as
:class:`~capreward.scorers.fleur_remote.RemoteFLEUR` on that server).

A row's output never depends on the other rows of its batch: within a batch, rows are scored in
groups of one kind (image or video) and one reference mode (with or without references), each row
with its own references, and the idf is fixed for the whole job. A score that is NaN or missing is
written as null with the reason in ``errors[metric]``. A row whose caption or references are empty
gets that error for every metric without being scored. A batch is scored at once; if that fails on a
bad item, it is split in halves until the failing rows are alone, so the error (``"row '<id>':
<reason>"``) is recorded on the offending row only and nothing else is lost.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable

from ..backbones.clip_loading import DEFAULT_CLIP
from .. import registry
from ..errors import SampleError
from ..names import spelling, sub_score
from .row_inputs import HASH_FIELD, visual_digest
from .manifest import ManifestRow

logger = logging.getLogger(__name__)



def __getattr__(name: str):
    # the tuples this module exported before the registry, now read from it
    if name == "METRICS":  # every metric, by its one name
        return registry.names()
    if name == "CLIP_METRICS":  # metrics computed on the shared CLIP backbone
        return registry.sharing("clip")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class ScoreOptions:
    """Everything a worker needs to build its scorers (picklable, so Ray actors can receive it)."""

    metrics: list[str] = field(default_factory=lambda: ["emscore"])
    clip_model: str = DEFAULT_CLIP
    pac_model: str | None = None
    judge_model: str = "llava-hf/llava-1.5-13b-hf"  # local LLaVA (name or dir) for fleur, visce2, gveval
    judge_base_url: str | None = None  # OpenAI-compatible server for fleur/visce2/gveval (key: $OPENAI_API_KEY)
    judge_api_model: str | None = None  # the served model's name (None: OpenAIJudge's default)
    judge_top_logprobs_cap: int = 20  # the most top_logprobs the server serves (vLLM --max-logprobs)
    gveval_mode: str = "ref-free"  # ref-free | ref-only | combined
    gveval_accr: bool = False  # the four ACCR dimensions (video rows only)
    qa_model: str | None = None  # text-only causal LM of qa_utility (None: the judge server, if any)
    hallucination_threshold: float | None = None  # None: capreward.scorers.hallucination.DEFAULT_THRESHOLD
    device: str = "cpu"
    precision: str | None = None
    batch_size: int = 64
    frames: int | None = 10
    # The idf table of emscore/hallucination (token id -> weight, ``idf_default`` for other ids), fixed for
    # the whole job so results do not depend on batching; None: every token weight 1.
    idf_weights: dict[int, float] | None = None
    idf_default: float | None = None
    alignment: bool = False  # store EMScore's token -> best-frame alignment per row (for reports)

    def __post_init__(self):
        self.metrics = [spelling(m) for m in self.metrics]  # "clip-s", "clipscore" are "clip_s"
        known = registry.names()
        unknown = [m for m in self.metrics if m not in known]
        if unknown:
            near = {m: registry.suggest(m) for m in unknown}
            hint = "".join(f" (did you mean {' or '.join(map(repr, n))} for {m!r}?)" for m, n in near.items() if n)
            raise ValueError(f"unknown metrics {unknown}{hint}; choose from {list(known)}")

    @property
    def remote_judge(self) -> bool:
        """Whether fleur/visce2/gveval ask an OpenAI-compatible server instead of the local LLaVA."""
        return bool(self.judge_base_url or self.judge_api_model)


def finite_or_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


class ManifestScorer:
    """Builds the chosen scorers once (sharing one CLIP, and one judge) and scores batches of manifest rows."""

    def __init__(self, options: ScoreOptions, backbone=None):
        """``backbone``: an already loaded CLIPBackbone of ``options.clip_model`` to share (else one is loaded
        when a CLIP metric is chosen)."""
        self.options = options
        self._runners: dict[str, Callable[[list[ManifestRow]], list[dict]]] = {}
        self._judge = None  # the local LLaVA judge, loaded on first use (see _local_judge)
        self._chat = None  # the chat backend of visce2/gveval (see _chat_backend)
        if backbone is None and set(registry.sharing("clip")) & set(options.metrics):
            from ..backbones.clip import CLIPBackbone

            backbone = CLIPBackbone(options.clip_model, device=options.device, precision=options.precision)
        for metric in options.metrics:
            self._runners[metric] = getattr(self, f"_build_{metric}")(backbone)

    @property
    def idf(self) -> dict | bool:
        """The ``idf`` argument of the EMScore-based scorers: the job's fixed table, or False."""
        if self.options.idf_weights is None:
            return False
        return {int(k): float(v) for k, v in self.options.idf_weights.items()}

    def _build_emscore(self, backbone):
        from ..scorers.emscore import EMScore

        scorer = EMScore(backbone=backbone, idf=self.idf, idf_default=self.options.idf_default,
                         frames=self.options.frames, batch_size=self.options.batch_size)

        def run(rows: list[ManifestRow]) -> list[dict]:
            out: list[dict] = [{} for _ in rows]
            for kind, refs, idx in row_groups(rows):
                visual = {f"{kind}s": [rows[i].path for i in idx]}
                res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
                for pos, (j, flat) in enumerate(zip(idx, res.rows())):
                    out[j] = {"emscore": flat.pop("score"), **{sub_score("emscore", k): v for k, v in flat.items()}}
                    if self.options.alignment and res.alignment is not None:
                        out[j]["alignment"] = alignment_fields(res.alignment[pos])
            return out

        return run

    def _clip_like(self, scorer, name: str):
        def run(rows: list[ManifestRow]) -> list[dict]:
            out: list[dict] = [{} for _ in rows]
            for kind, refs, idx in row_groups(rows):
                visual = {f"{kind}s": [rows[i].path for i in idx]}
                res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
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

    def _build_hallucination(self, backbone):
        from ..scorers.hallucination import DEFAULT_THRESHOLD, Hallucination

        threshold = self.options.hallucination_threshold
        penalty = Hallucination(
            backbone=backbone, idf=self.idf, idf_default=self.options.idf_default, frames=self.options.frames,
            batch_size=self.options.batch_size, threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
        )
        write_alignment = self.options.alignment and "emscore" not in self.options.metrics

        def run(rows: list[ManifestRow]) -> list[dict]:
            out: list[dict] = [{} for _ in rows]
            for kind, _, idx in row_groups(rows, with_references=False):
                alignments = penalty.alignments([rows[i].caption for i in idx], [rows[i].path for i in idx], kind)
                # the row's alignment is EMScore's (what an emscore runner writes); the penalty's flags also
                # read each content word encoded alone, so they can differ from that alignment's similarities
                shown = getattr(alignments, "contextual", alignments)
                for j, a, c in zip(idx, alignments, shown):
                    report = penalty.report_for(a)
                    out[j] = {"hallucination": report.penalty, sub_score("hallucination", "flagged"): report.flagged_index}
                    if write_alignment:
                        out[j]["alignment"] = alignment_fields(c)
            return out

        return run

    def _local_judge(self):
        """The local LLaVA judge (``judge_model``), loaded once and shared by fleur, visce2 and gveval."""
        if self._judge is None:
            from ..judges.local import LocalJudge

            self._judge = LocalJudge(self.options.judge_model, device=self.options.device)
        return self._judge

    def _chat_backend(self):
        """The chat backend of visce2 and gveval: an OpenAI-compatible server when ``judge_base_url`` or
        ``judge_api_model`` is set (API key from ``$OPENAI_API_KEY``), else the shared local judge."""
        if self._chat is None:
            if self.options.remote_judge:
                from ..judges.remote import OpenAIJudge

                model = {"model": self.options.judge_api_model} if self.options.judge_api_model else {}
                self._chat = OpenAIJudge(self.options.judge_base_url, api_key_env="OPENAI_API_KEY",
                                         top_logprobs_cap=self.options.judge_top_logprobs_cap, **model)
            else:
                from ..judges.local_chat import LocalChatJudge

                self._chat = LocalChatJudge(self._local_judge())
        return self._chat

    def _tree(self) -> dict:
        """The digit-tree width of a remote judge's exact expected scores (the server's logprob cap)."""
        return {"tree_top_logprobs": max(10, self.options.judge_top_logprobs_cap)} if self.options.remote_judge else {}

    def _build_fleur(self, backbone):
        from ..scorers.fleur import FLEUR

        if self.options.remote_judge:  # the served judge, read exactly (as visce2/gveval)
            from ..scorers.fleur_remote import RemoteFLEUR

            scorer = RemoteFLEUR(self._chat_backend(), top_logprobs=min(20, self.options.judge_top_logprobs_cap))
        else:
            scorer = FLEUR(model=self._local_judge())

        def run(rows: list[ManifestRow]) -> list[dict]:
            out: list[dict] = [{} for _ in rows]
            for kind, refs, idx in row_groups(rows):  # videos are judged on G-VEval's three-frame composite
                visual = {f"{kind}s": [rows[i].path for i in idx]}
                res = scorer.score([rows[i].caption for i in idx], references=refs, **visual)
                for j, k in enumerate(idx):
                    out[k] = {"fleur": finite_or_none(float(res.score[j])), sub_score("fleur", "raw"): res.raw[j]}
                    if res.error[j]:
                        out[k]["_error"] = res.error[j]
            return out

        return run

    def _build_visce2(self, backbone):
        from ..scorers.visce2 import VisCE2

        scorer = VisCE2(self._chat_backend(), **self._tree())
        spec = registry.get("visce2")

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
                out[i] = {"visce2": finite_or_none(float(res.score[pos])), sub_score("visce2", "raw"): res.raw[pos],
                          sub_score("visce2", "context"): res.context[pos]}
                if res.error[pos]:
                    out[i]["_error"] = res.error[pos]
            return out

        return run

    def _build_claims(self, backbone):
        from ..scorers.claims import ClaimScorer

        scorer = ClaimScorer(self._chat_backend())

        def run(rows: list[ManifestRow]) -> list[dict]:
            out: list[dict] = [{} for _ in rows]
            for kind, refs, idx in row_groups(rows):
                res = scorer.score([rows[i].caption for i in idx], references=refs,
                                   **{f"{kind}s": [rows[i].path for i in idx]})
                for j, k in enumerate(idx):
                    out[k] = {"claims": finite_or_none(float(res.score[j])),
                              sub_score("claims", "precision"): finite_or_none(float(res.precision[j]))}
                    if refs is not None:
                        out[k][sub_score("claims", "recall")] = finite_or_none(float(res.recall[j]))
                    out[k][sub_score("claims", "n_claims")] = int(res.n_claims[j])
                    out[k][sub_score("claims", "claims")] = [
                        {"text": v.text, "start": v.start, "end": v.end, "p": finite_or_none(float(v.p))} for v in res.claims[j]]
                    if res.error[j]:
                        out[k]["_error"] = res.error[j]
            return out

        return run

    def _build_qa_utility(self, backbone):
        from ..scorers.qa_utility import LocalTextJudge, QAUtility

        if self.options.qa_model:
            answerer = LocalTextJudge(self.options.qa_model)
        elif self.options.remote_judge:
            answerer = self._chat_backend()
        else:
            raise ValueError("qa_utility needs a text judge: --qa-model (a causal LM) or a judge server")
        scorer = QAUtility(answerer, question_backend=self._chat_backend() if self.options.remote_judge else None)
        if not self.options.remote_judge:  # a local question writer is the local LLaVA, loaded on first need
            from ..judges.lazy import LazyBackend

            scorer.question_backend = LazyBackend(self._chat_backend)

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
                    out[k] = {"qa_utility": finite_or_none(float(res.score[j])),
                              sub_score("qa_utility", "n_questions"): int(res.n_questions[j]),
                              sub_score("qa_utility", "answers"): [finite_or_none(float(p)) for p in res.answers[j]]}
                    if res.error[j]:
                        out[k]["_error"] = res.error[j]
            return out

        return run

    def _build_gveval(self, backbone):
        from ..scorers.gveval import GVEval

        mode, accr = self.options.gveval_mode, self.options.gveval_accr
        scorer = GVEval(self._chat_backend(), mode=mode, accr=accr, **self._tree())
        spec, config = registry.get("gveval"), {"mode": mode, "accr": accr}
        needs_refs = spec.references_for(config) == "required"

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
                        out[i] = {"_error": f"{refused}; score {kind}s without --gveval-accr"}
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
                    out[i] = {"gveval": finite_or_none(float(res.score[pos])), sub_score("gveval", "raw"): res.raw[pos]}
                    for name in spec.sub_scores_for(config):
                        if name != "raw":  # the ACCR dimensions, with accr
                            out[i][sub_score("gveval", name)] = finite_or_none(float(getattr(res, name)[pos]))
                    if res.error[pos]:
                        out[i]["_error"] = res.error[pos]
            return out

        return run

    def score_rows(self, rows: list[ManifestRow]) -> list[dict]:
        """One result dict per row: id, caption, visual path, metric fields, and ``errors``; each row's
        output is the same whatever other rows are in ``rows``."""
        results = [base_fields(r) for r in rows]
        problems = {i: SampleError(i, "input", f"row {r.id!r}", p) for i, r in enumerate(rows) if (p := row_problem(r))}
        scorable = [i for i in range(len(rows)) if i not in problems]
        for metric, run in self._runners.items():
            for i, problem in problems.items():
                results[i]["errors"][metric] = problem
            if not scorable:
                continue
            for i, fields_ in zip(scorable, isolate_errors(run, [rows[i] for i in scorable], metric)):
                err = fields_.pop("_error", None)
                results[i].update(fields_)
                if err:  # a runner's own plain-text reason (a visual kind the metric refuses) is of kind "input"
                    results[i]["errors"][metric] = err if isinstance(err, SampleError) else SampleError(i, "input", "", err)
        for r in results:
            if not r["errors"]:
                r["errors"] = None
        return results


def alignment_fields(a) -> dict:
    """The ``alignment`` field of a row from a :class:`~capreward.scorers.emscore.TokenAlignment`."""
    return {"tokens": a.tokens, "best_frame": a.best_frame, "similarity": a.similarity, "weight": a.weight}


def base_fields(row: ManifestRow) -> dict:
    """The fields of ``row``'s result before any metric: id, caption, visual path, ``errors``,
    references (when given) and the manifest's other keys, as they are."""
    out = {"id": row.id, "caption": row.caption, row.kind: row.path, "errors": {}}
    if row.references is not None:
        out["references"] = row.references
    out[HASH_FIELD] = visual_digest(row.path)  # a resume refuses the row if its visual changes
    out.update(row.extra)
    return out


def visual_refused(spec, config: dict, kind: str) -> str | None:
    """Why ``spec``'s metric (configured by ``config``) does not score a ``kind`` visual, or None: the
    visual kinds are read from the spec."""
    kinds = spec.visual_kinds(config)
    if kind in kinds:
        return None
    with_config = "" if spec.visual_kinds() == kinds else " with " + ", ".join(f"{k}={v!r}" for k, v in config.items()
                                                                              if v is not False)
    return f"{spec.title} scores {' and '.join(k + 's' for k in kinds)} only{with_config}"


def row_groups(rows: list[ManifestRow], with_references: bool = True):
    """``(kind, references, indices)`` for each non-empty group of rows of one kind ("video", "image")
    and, with ``with_references``, one reference mode: ``references`` is the group's list of reference
    lists, or None for the rows without references (and always None without ``with_references``)."""
    for kind in ("video", "image"):
        modes = (True, False) if with_references else (False,)
        for has_refs in modes:
            idx = [i for i, r in enumerate(rows)
                   if r.kind == kind and (not with_references or (r.references is not None) == has_refs)]
            if idx:
                yield kind, ([rows[i].references for i in idx] if has_refs else None), idx


def row_problem(row: ManifestRow) -> str | None:
    """Why ``row`` cannot be scored by any metric (an empty caption or reference), or None."""
    if not row.caption.strip():
        return "the caption is empty"
    if row.references is not None:
        if not row.references:
            return "'references' is an empty list (leave it out to score without references)"
        for k, ref in enumerate(row.references):
            if not ref.strip():
                return f"references[{k}] is empty"
    return None


def row_error(row: ManifestRow, exc: Exception) -> SampleError:
    """The error recorded on ``row`` when scoring it alone raised ``exc``: ``"row '<id>': <reason>"``
    (just ``"<type>: <message>"`` when the message already names the row); a media error names the
    row's visual: ``"row '<id>': <problem> (<path>)"``."""
    error = SampleError.from_exception(exc, kind="scorer")
    if error.kind in ("media", "refused"):
        return media_row_error(row, error)
    return error if f"row {row.id!r}" in str(exc) else error.within(None, f"row {row.id!r}")


def media_row_error(row: ManifestRow, error: SampleError) -> SampleError:
    """The row's error for a visual that cannot be used (``error`` of kind ``"media"``/``"refused"``):
    ``"row '<id>': <problem> (<path>)"``, the same text whichever scorer found it and wherever the row
    sat in its batch."""
    return SampleError(None, error.kind, f"row {row.id!r}", f"{error.message} ({row.path})")


def visual_error(row: ManifestRow, pos: int, error: str | None) -> SampleError | None:
    """The row's error when a scorer that reports unreadable visuals per item (VisCE², G-VEval) gives
    item ``pos`` of its batch (``row``) a media error (a :class:`~capreward.errors.SampleError` of kind
    ``"media"`` or ``"refused"``): see :func:`media_row_error`; None for no error or another kind."""
    if getattr(error, "kind", None) not in ("media", "refused"):
        return None
    return media_row_error(row, error)


def isolate_errors(run, rows: list[ManifestRow], metric: str) -> list[dict]:
    """``run(rows)``; if it raises, run each half on its own (recursively) and record the failure of a
    row that fails alone as ``_error`` naming the row's id. The halves' results equal the batch's
    because every runner scores each row independently of the others."""
    try:
        return run(rows)
    except Exception as exc:  # noqa: BLE001 - any scorer failure must stay on its row
        if len(rows) == 1:
            reason = row_error(rows[0], exc)
            logger.warning("%s: %s", metric, reason)
            return [{"_error": reason}]
    half = len(rows) // 2
    return isolate_errors(run, rows[:half], metric) + isolate_errors(run, rows[half:], metric)
