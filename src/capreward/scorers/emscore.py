"""EMScore and EMScore_ref: a CLIP backbone + the matching math + batching and caching.

Definitions (DESIGN.md, EMScore section): fine-grained token↔frame greedy matching with idf on
precision, coarse cos(f_X, f_V), full = (fine + coarse) / 2; references take the place of frames
(idf on both sides), each component maxed over references; with both, video and reference parts
are averaged.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Mapping, Sequence

import torch

from ..backbones.clip import CLIPBackbone, embed_captions
from ..default_models import DEFAULT_CLIP
from ..backbones.windows import check_long_captions
from ..media import DEFAULT_FRAMES
from ..names import SEP, sub_score
from ..metrics.emscore import FineMatch, coarse_score, greedy_match, pad_stack, video_embedding
from ..metrics.harmonic import harmonic_mean as harmonic_mean_named
from ..metrics.idf import IdfTable, idf_from_mapping, idf_from_rows
from .bad_items import check_error_mode, score_valid
from .contract import Scores
from .results import Alignments, MatchScores, TokenAlignment  # noqa: F401  (imported from here before)

#: The components of a :class:`MatchScores`, in order.
MATCH_FIELDS = dataclasses.fields(MatchScores)
from .validation import check_captions, check_references, check_same_length

logger = logging.getLogger(__name__)


@dataclass
class EMScoreResult:
    """Per-candidate EMScore results.

    ``score`` is the full F of EMScore(X, V, X*) when videos and references are both given, else of
    whichever was given. ``video``/``reference``/``combined`` are None when not computed.
    ``alignment`` is given with videos (each candidate's built when first read);
    ``truncated[i]`` says whether candidate i was cut to the context (only with
    ``long_captions="truncate"``); ``windows[i]`` how many text windows it was read in.
    """

    score: torch.Tensor
    video: MatchScores | None
    reference: MatchScores | None
    combined: MatchScores | None
    alignment: Alignments | None
    truncated: list[bool]
    errors: list[str | None] | None = None  # with errors="nan": why item i got NaN (None: scored)
    windows: list[int] | None = None  # text windows per candidate (1 when it fits the context)

    def rows(self) -> list[dict[str, float]]:
        """One flat dict per candidate: ``score`` and every computed component (``video/fine_p`` …, the
        sub-score names of :mod:`capreward.names`)."""
        out = []
        for i in range(len(self.score)):
            row = {"score": float(self.score[i])}
            for name in ("video", "reference", "combined"):
                part = getattr(self, name)
                if part is not None:
                    row.update({sub_score(name, k): v for k, v in part.row(i).items()})
            out.append(row)
        return out


@dataclass
class CandidateText:
    """Candidate token embeddings padded to a common length, with masks and idf weights."""

    tokens: torch.Tensor  # [N, L, D]
    mask: torch.Tensor  # [N, L]
    weights: torch.Tensor  # [N, L]
    pooled: torch.Tensor  # [N, D]
    ids: list[torch.Tensor] | None  # per candidate, None for soft captions


class EMScore:
    """EMScore (video), EMScore_ref (references) and their combination.

    Ranges: coarse, P and R are cosine based, in [-1, 1]. F = 2PR/(P+R) is the paper's formula kept
    as released, so it leaves [-1, 1] (unbounded near P = -R) when P and R have opposite signs, e.g.
    -12.6 for a 20,000-character caption; ``full_f`` = (``fine_f`` + coarse)/2 inherits that.
    ``score(..., harmonic_mean="sign-safe")`` forms every F with
    `sign_safe_harmonic_mean()` instead (each in [-1, 1]), as
    `EMScoreReward` does by default.

    Args:
        model: CLIP specification (name/tag, OpenAI-format ``.pt``, open_clip checkpoint, factory).
        device: where the CLIP runs.
        precision: in which precision the CLIP runs (fp32 on CPU).
        idf: ``False`` (every token weight 1, the default), a list of captions (the released idf
            procedure over that fixed corpus), a dict token id → weight (used as given, ``idf_default``
            for missing ids; when None, a ``defaultdict``'s default (as the released code's dict gives),
            else the dict's largest weight), or ``"batch"`` to recompute idf from
            each call's references (else candidates) as the released code does. ``"batch"`` makes a
            score depend on the rest of the batch, so do not use it for rewards. Deliberate difference:
            the released ``EMScorer.score()`` defaults to the batch idf; capreward defaults to no idf,
            so that a score never depends on its batch. Pass ``idf="batch"`` to reproduce the release's
            default (e.g. its VATEX-EVAL numbers), or a fixed corpus for idf that stays put.
        frames: frames sampled per video (10: the paper's VATEX-EVAL protocol; None: all frames).
        batch_size: captions per text-encoder batch. The matching math runs in float64, so given the same
            embeddings a sample's sub-scores are the same alone or in any batch, near F's singularity
            too (`capreward.metrics.emscore`); the fp32 text tower itself rounds a caption's
            embedding differently (~1e-7) in passes of other shapes, which F = 2PR/(P+R) amplifies near
            P + R = 0. ``batch_size=1`` encodes each caption in its own pass (slower), so that even
            there a sample's sub-scores do not depend on its batch (visual embeddings are cached per
            content and reused). cache_size: visual embeddings kept (LRU).
        trim_text: run the text tower only to the longest caption of a batch (exact; faster).
        backbone: an existing `CLIPBackbone` to share (then model/device/precision are ignored).
        long_captions: ``"windows"`` (default): a caption (or reference) longer than the text context is
            read whole, in sentence/clause windows whose token embeddings are united (the fine-grained
            set) and whose caption embeddings are averaged weighted by length (f_X); see
            `capreward.backbones.windows`. Captions that fit keep the released numbers exactly.
            ``"truncate"``: cut to the context keeping EOS, as the released metric (``truncated`` says
            which).

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward import EMScore
        >>> em = EMScore(model=clip)
        >>> r = em.score(["a red image.", "a blue image."], images=[red, red])
        >>> bool(r.score[0] > r.score[1])              # full F: the right colour wins
        True
        >>> list(r.rows()[0])[:4]                      # every sub-score, named as in results files
        ['score', 'video/coarse', 'video/fine_p', 'video/fine_r']
        >>> r = em.score(["a red image.", ""], images=[red, red], errors="nan")
        >>> r.errors
        [None, 'empty caption']
    """

    def __init__(
        self,
        model: str | os.PathLike | Callable[[], tuple] = DEFAULT_CLIP,
        device: str | torch.device = "cpu",
        idf: bool | str | Sequence[str] | Mapping[int, float] = False,
        idf_default: float | None = None,
        frames: int | None = DEFAULT_FRAMES,
        batch_size: int = 64,
        cache_size: int = 512,
        precision: str | None = None,
        trim_text: bool = True,
        backbone: CLIPBackbone | None = None,
        long_captions: str = "windows",
    ):
        self.long_captions = check_long_captions(long_captions)
        self.backbone = backbone or CLIPBackbone(
            model, device=device, precision=precision, cache_size=cache_size, trim_text=trim_text
        )
        self.frames = frames
        self.batch_size = batch_size
        self.batch_idf = False
        self.idf_table: IdfTable | None = None
        if idf is True:
            raise ValueError("idf=True is ambiguous: pass a corpus (list of captions), a dict, or 'batch'")
        if isinstance(idf, str):
            if idf != "batch":
                raise ValueError(f"idf must be False, 'batch', a list of captions or a dict; got {idf!r}")
            self.batch_idf = True
        elif isinstance(idf, Mapping):
            self.idf_table = idf_from_mapping(idf, idf_default)
        elif idf is not False and idf is not None:
            corpus = check_captions(idf, what="idf corpus")
            self.idf_table = idf_from_rows(self.backbone.context_rows(corpus), self.backbone.eot_id)
        self._idf_vector = None if self.idf_table is None else self.idf_table.vector(self.backbone.vocab_size)

    # ----------------------------------------------------------------- public
    def score(
        self,
        candidates: Sequence[str],
        videos: Sequence[Any] | None = None,
        references: Sequence[Sequence[str]] | None = None,
        *,
        images: Sequence[Any] | None = None,
        video_ids: Sequence[str | None] | None = None,
        errors: str = "raise",
        harmonic_mean: str = "released",
    ) -> EMScoreResult:
        """Score ``candidates`` against ``videos`` (or ``images``, one-frame videos) and/or
        ``references`` (one list of reference captions per candidate).

        Args:
            candidates: the captions to score.
            videos: one video per candidate (a path, frames, or a decoded clip), or None.
            references: one list of reference captions per candidate, or None.
            images: one image per candidate instead of ``videos`` (scored as one-frame videos).
            video_ids: cache ids of the visuals (None: keyed by content).
            errors: ``"raise"`` (default): a bad item (empty caption, unreadable visual) raises, naming it;
                ``"nan"``: bad items get NaN and their reason in ``result.errors[i]`` (a
                :class:`~capreward.errors.SampleError`), the others are scored exactly as alone.
            harmonic_mean: ``"released"`` or ``"sign-safe"`` (below).

        ``harmonic_mean``: how every F (video, each reference, hence combined and full) is formed from
        P and R: ``"released"`` (the paper's 2PR/(P+R), default) or ``"sign-safe"``
        (`sign_safe_harmonic_mean()`, what the rewards use).

        ``errors="raise"`` (default): a bad item (empty caption, unreadable visual) raises, naming it.
        ``errors="nan"``: bad items get NaN in every score (None alignment) and their reason in
        ``result.errors[i]``; the others are scored as they would be alone (see
        `capreward.scorers.bad_items`; with ``idf="batch"`` the corpus is the scorable items').

        Returns:
            An `EMScoreResult`: ``score`` (N,), the full F of every part scored; the parts ``video``,
            ``reference`` and ``combined`` (each with coarse, fine_p/r/f, full_p/r/f; None when not
            scored), ``alignment`` (token -> best frame), ``errors`` (with ``errors="nan"``).

        Raises:
            ValueError: with ``errors="raise"``, a bad item (empty caption, references of the wrong
                form, lengths that differ), naming it, or ``MediaError`` (a ValueError) for a visual
                that cannot be read; both videos and images given.
        """
        check_error_mode(errors)
        if errors == "nan":
            if videos is not None and images is not None:
                raise ValueError("give videos or images, not both")
            kind = "video" if videos is not None else "image"
            return score_valid(
                functools.partial(self.score, harmonic_mean=harmonic_mean), candidates,
                videos if videos is not None else images, f"{kind}s", video_ids, "video_ids",
                references,
                lambda vs, ids: self.backbone.visual_embeddings(vs, kind=kind, frames=self.frames, ids=ids),
                lambda n: EMScoreResult(torch.full((n,), float("nan")), None, None, None, None, [False] * n),
            )
        mean = harmonic_mean_named(harmonic_mean)
        candidates = check_captions(candidates)
        n = len(candidates)
        visuals, kind = self._visual_inputs(n, videos, images, video_ids)
        refs = check_references(references, n)
        text = embed_captions(self.backbone, candidates, self.batch_size, long_captions=self.long_captions)
        if any(text.truncated):
            logger.warning(
                "EMScore: candidates %s exceed CLIP's %d-token context and were truncated (EOS kept)",
                [i for i, t in enumerate(text.truncated) if t], self.backbone.context_length,
            )
        idf_vector = self._batch_idf_vector(refs, candidates) if self.batch_idf else self._idf_vector
        tokens, mask = pad_stack(text.tokens)
        weights = self._weights_for(pad_ids(text.ids), mask, idf_vector)
        cand = CandidateText(tokens=tokens, mask=mask, weights=weights, pooled=text.pooled, ids=text.ids)
        result = self._score_text(cand, visuals, kind, video_ids, refs, idf_vector, mean)
        result.truncated = text.truncated
        result.windows = text.windows
        if result.alignment is not None:
            result.alignment.truncated = list(text.truncated)
        return result

    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None,
               harmonic_mean: str = "released") -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`): the headline (the main part's full
        F), every ``<part>/<component>`` of the parts scored, and the extras ``truncated`` and
        ``alignment`` (with a visual). ``harmonic_mean`` as for :meth:`score` (the rewards' default:
        ``"sign-safe"``)."""
        res = self.score(list(captions), videos=videos, references=references, images=images, video_ids=visual_ids,
                         harmonic_mean=harmonic_mean)
        subs = {f"{part}{SEP}{f.name}": getattr(scores, f.name).tolist() for part in ("video", "reference", "combined")
                if (scores := getattr(res, part)) is not None for f in MATCH_FIELDS}
        extras: dict[str, Any] = {"truncated": [bool(t) for t in res.truncated]}
        if res.alignment is not None:
            extras["alignment"] = res.alignment
        return Scores(score=res.score.tolist(), sub_scores=subs, extras=extras, result=res)

    def score_soft(
        self,
        probs: torch.Tensor,
        lengths: torch.Tensor,
        videos: Sequence[Any] | None = None,
        references: Sequence[Sequence[str]] | None = None,
        *,
        images: Sequence[Any] | None = None,
        video_ids: Sequence[str | None] | None = None,
        harmonic_mean: str = "released",
    ) -> EMScoreResult:
        """Differentiable EMScore of soft captions.

        Args:
            probs: [N, L, V] distributions over CLIP's vocabulary (below).
            lengths: [N] positions of each caption, SOS and EOS included.
            videos: as for `score()`.
            references: as for `score()`.
            images: as for `score()`.
            video_ids: as for `score()`.
            harmonic_mean: as for `score()`.

        Returns:
            An `EMScoreResult` whose tensors carry gradients to ``probs``.

        ``probs`` [N, L, V] holds a distribution over CLIP's vocabulary at each position (position 0 is
        SOS, position ``lengths[i]-1`` is EOS, later positions are ignored). Token embeddings are the
        probability-weighted mix of CLIP's token embeddings and idf weights are expected idf, so the
        returned tensors carry gradients to ``probs``.
        """
        mean = harmonic_mean_named(harmonic_mean)
        n = probs.shape[0]
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        check_same_length(n, lengths, "lengths")
        if int(lengths.min()) < 2 or int(lengths.max()) > probs.shape[1]:
            raise ValueError("each length must count SOS..EOS (>= 2) and fit in the probs' length")
        visuals, kind = self._visual_inputs(n, videos, images, video_ids)
        refs = check_references(references, n)
        if self.batch_idf:
            raise ValueError("idf='batch' needs caption strings; give a fixed corpus or dict for soft captions")
        emb = self.backbone.encode_text_soft(probs, lengths)
        if self._idf_vector is None:
            weights = emb.mask.float()
        else:
            weights = (probs.float() @ self._idf_vector.to(probs.device)) * emb.mask
        cand = CandidateText(tokens=emb.tokens, mask=emb.mask, weights=weights, pooled=emb.pooled, ids=None)
        return self._score_text(cand, visuals, kind, video_ids, refs, self._idf_vector, mean)

    # --------------------------------------------------------------- internals
    def _visual_inputs(self, n, videos, images, video_ids):
        if videos is not None and images is not None:
            raise ValueError("give videos or images, not both")
        visuals = videos if videos is not None else images
        if visuals is not None:
            if isinstance(visuals, (str, os.PathLike)):
                raise TypeError("videos/images must be a list with one entry per candidate")
            visuals = list(visuals)
            check_same_length(n, visuals, "videos" if videos is not None else "images")
        check_same_length(n, video_ids, "video_ids")
        return visuals, ("video" if videos is not None else "image")

    def _batch_idf_vector(self, refs, candidates) -> torch.Tensor:
        corpus = [r for rs in refs for r in rs] if refs is not None else candidates
        table = idf_from_rows(self.backbone.context_rows(corpus), self.backbone.eot_id)
        return table.vector(self.backbone.vocab_size)

    def _weights_for(self, ids: torch.Tensor, mask: torch.Tensor, idf_vector: torch.Tensor | None) -> torch.Tensor:
        if idf_vector is None:
            return mask.float()
        return idf_vector[ids.cpu()].to(mask.device) * mask

    def _score_text(self, cand: CandidateText, visuals, kind, video_ids, refs, idf_vector, mean) -> EMScoreResult:
        if visuals is None and refs is None:
            raise ValueError("EMScore needs videos (or images) and/or references")
        video = reference = combined = None
        alignment = None
        if visuals is not None:
            frame_list = self.backbone.visual_embeddings(visuals, kind=kind, frames=self.frames, ids=video_ids)
            frames, frame_mask = pad_stack([f.to(cand.tokens.device) for f in frame_list])
            fine = greedy_match(cand.tokens, cand.mask, cand.weights, frames, frame_mask, frame_mask.float(), mean)
            coarse = coarse_score(cand.pooled, video_embedding(frames, frame_mask))
            video = MatchScores.from_parts(coarse, fine.p, fine.r, fine.f)
            if cand.ids is not None:
                alignment = self._alignments(cand, fine)
        if refs is not None:
            reference = self._reference_scores(cand, refs, idf_vector, mean)
        if video is not None and reference is not None:
            combined = MatchScores.average(video, reference)
        main = combined or video or reference
        assert main is not None  # a video, references or both were given
        truncated = [False] * cand.tokens.shape[0]
        return EMScoreResult(main.full_f, video, reference, combined, alignment, truncated)

    def _reference_scores(self, cand: CandidateText, refs: list[list[str]], idf_vector, mean) -> MatchScores:
        """Each component maxed over the candidate's references; F = ``mean(P_r, R_r)`` per reference,
        then maxed."""
        flat = [r for rs in refs for r in rs]
        owner = torch.tensor([i for i, rs in enumerate(refs) for _ in rs], device=cand.tokens.device)
        ref_text = embed_captions(self.backbone, flat, self.batch_size, long_captions=self.long_captions)
        ref_tokens, ref_mask = pad_stack([t.to(cand.tokens.device) for t in ref_text.tokens])
        ref_weights = self._weights_for(pad_ids(ref_text.ids), ref_mask, idf_vector)
        fine = greedy_match(
            cand.tokens[owner], cand.mask[owner], cand.weights[owner], ref_tokens, ref_mask, ref_weights, mean
        )
        coarse = coarse_score(cand.pooled[owner], ref_text.pooled.to(cand.tokens.device))
        n = cand.tokens.shape[0]
        return MatchScores.from_parts(*(group_max(v, owner, n) for v in (coarse, fine.p, fine.r, fine.f)))

    def _alignments(self, cand: CandidateText, fine: FineMatch) -> Alignments:
        ids_list = cand.ids
        assert ids_list is not None  # alignments are built for text captions only
        best_target = fine.best_target.detach()
        best_similarity = fine.best_similarity.detach()
        weights = cand.weights.detach()

        def build(i: int) -> TokenAlignment:
            ids = ids_list[i].tolist()
            n = len(ids)
            return TokenAlignment(
                tokens=[self.backbone.decode_token(t) for t in ids],
                token_ids=ids,
                best_frame=best_target[i, :n].tolist(),
                similarity=best_similarity[i, :n].tolist(),
                weight=weights[i, :n].tolist(),
            )

        return Alignments(len(ids_list), build)


def group_max(values: torch.Tensor, owner: torch.Tensor, n: int) -> torch.Tensor:
    """For each group g in [0, n), the max of ``values`` where ``owner == g`` (differentiable)."""
    out = values.new_full((n,), float("-inf"))
    return out.scatter_reduce(0, owner, values, reduce="amax", include_self=True)


def pad_ids(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack LongTensor [L_i] rows into [N, max L], zero-padded."""
    return torch.nn.utils.rnn.pad_sequence([r.cpu() for r in rows], batch_first=True)
