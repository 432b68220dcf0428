"""CLIP-S / RefCLIP-S (Hessel et al., EMNLP 2021) and PAC-S / RefPAC-S (Sarto et al., CVPR 2023).

The caption is prefixed with "A photo depicts " (references too), as in the released code.
CLIP-S = w · max(cos(image, caption), 0); RefCLIP-S = harmonic mean of CLIP-S and the best
(unscaled, unclipped) cosine between the caption and its references.

Ranges: CLIP-S lies in [0, w]. RefCLIP-S lies in [0, w] only while the best reference cosine is
non-negative: as released, the harmonic mean 2ab/(a+b) of a >= 0 and a negative cosine b is negative
or, near b = -a, unbounded (17.7 was seen with w = 2.5). The rewards clip to [0, w].
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import torch

from ..backbones.clip import CLIPBackbone, embed_captions
from ..default_models import DEFAULT_CLIP
from ..backbones.windows import check_long_captions
from ..media import DEFAULT_FRAMES
from ..metrics.clipscore import clip_s, ref_clip_s, reference_similarity
from ..metrics.harmonic import harmonic_mean as harmonic_mean_named
from ..metrics.emscore import pad_stack, video_embedding
from .bad_items import check_error_mode, score_valid
from .contract import Scores, floats
from .validation import check_captions, check_references, check_same_length

CLIPS_PREFIX = "A photo depicts "


@dataclass
class CLIPScoreResult:
    """Tensor[N] each: ``clip_s`` in [0, w]; ``ref_clip_s`` (in [0, w] unless ``ref_similarity`` < 0,
    see the module doc) and ``ref_similarity`` (max cosine to the references, in [-1, 1]) when
    references were given, else None."""

    clip_s: torch.Tensor
    ref_clip_s: torch.Tensor | None
    ref_similarity: torch.Tensor | None
    truncated: list[bool]
    errors: list[str | None] | None = None  # with errors="nan": why item i got NaN (None: scored)
    windows: list[int] | None = None  # text windows per candidate (1 when it fits the context)

    @property
    def score(self) -> torch.Tensor:
        """RefCLIP-S when references were given, else CLIP-S."""
        return self.ref_clip_s if self.ref_clip_s is not None else self.clip_s

    def rows(self) -> list[dict[str, float]]:
        out = []
        for i in range(len(self.clip_s)):
            row = {"clip_s": float(self.clip_s[i])}
            if self.ref_clip_s is not None:
                row["ref_clip_s"] = float(self.ref_clip_s[i])
            out.append(row)
        return out


class CLIPScore:
    """CLIP-S and RefCLIP-S on images, or on videos through their mean frame embedding.

    Args:
        model: any CLIP specification (:func:`~capreward.backbones.load_clip`).
        device: where the model runs.
        w: the scale of CLIP-S (None: 2.5, the paper's).
        prefix: the text put before every caption (the paper's ``"A photo depicts "``).
        batch_size: captions per text-tower pass.
        cache_size: entries of the visual-embedding cache.
        precision: open_clip precision (default fp32).
        frames: frames sampled per video (a video is scored through its mean frame embedding).
        backbone: share an existing :class:`~capreward.backbones.CLIPBackbone` (``model`` is then unused).
        long_captions: ``"windows"`` (default) reads a caption longer than the text context whole: its
            sentence/clause windows are each scored as ``prefix + window`` and their caption embeddings
            averaged, weighted by length (`capreward.backbones.windows`); captions that fit keep the
            released numbers exactly. ``"truncate"``: the released behaviour (cut to the context, EOS
            kept; ``truncated``).

    Formula: ``CLIP-S = w * max(cos(c, v), 0)``; ``RefCLIP-S = H(CLIP-S, max(max_r cos(c, r), 0))``, the
    harmonic mean H of CLIP-S and the best reference similarity.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward import CLIPScore
        >>> cs = CLIPScore(model=clip)
        >>> r = cs.score(["a red image", "a blue image"], images=[red, red], references=[["a red picture"]] * 2)
        >>> bool(r.clip_s[0] > r.clip_s[1]), bool(0 <= r.clip_s.min() and r.clip_s.max() <= 2.5)
        (True, True)
        >>> bool(r.ref_clip_s[0] > r.ref_clip_s[1])    # RefCLIP-S: with the references
        True
    """

    default_w = 2.5

    def __init__(
        self,
        model: str | os.PathLike | Callable[[], tuple] = DEFAULT_CLIP,
        device: str | torch.device = "cpu",
        w: float | None = None,
        prefix: str = CLIPS_PREFIX,
        batch_size: int = 64,
        cache_size: int = 512,
        precision: str | None = None,
        frames: int | None = DEFAULT_FRAMES,
        backbone: CLIPBackbone | None = None,
        long_captions: str = "windows",
    ):
        self.long_captions = check_long_captions(long_captions)
        self.backbone = backbone or CLIPBackbone(model, device=device, precision=precision, cache_size=cache_size)
        self.w = self.default_w if w is None else float(w)
        self.prefix = prefix
        self.batch_size = batch_size
        self.frames = frames

    def score(
        self,
        candidates: Sequence[str],
        images: Sequence[Any] | None = None,
        references: Sequence[Sequence[str]] | None = None,
        *,
        videos: Sequence[Any] | None = None,
        image_ids: Sequence[str | None] | None = None,
        errors: str = "raise",
    ) -> CLIPScoreResult:
        """Score each candidate against its image (or video) and optionally its references.

        Args:
            candidates: the captions to score.
            images: one image per candidate (a path, PIL image or array), or None with ``videos``.
            references: one list of reference captions per candidate (RefCLIP-S), or None.
            videos: one video per candidate instead of ``images``.
            image_ids: cache ids of the visuals (None: keyed by content).
            errors: ``"raise"`` (default): a bad item (empty caption, unreadable visual) raises, naming it;
                ``"nan"``: bad items get NaN and their reason in ``result.errors[i]`` (a
                :class:`~capreward.errors.SampleError`), the others are scored exactly as alone.

        See `capreward.scorers.bad_items` for ``errors="nan"``.

        Returns:
            A `CLIPScoreResult`: ``clip_s`` (N,) in [0, w]; with references ``ref_clip_s`` (RefCLIP-S)
            and the best reference similarity; ``errors`` (with ``errors="nan"``).

        Raises:
            ValueError: not exactly one of images and videos; with ``errors="raise"``, a bad item
                (empty caption, references of the wrong form), naming it, or ``MediaError`` (a
                ValueError) for a visual that cannot be read.
        """
        check_error_mode(errors)
        if errors == "nan":
            if (images is None) == (videos is None):
                raise ValueError("CLIP-S needs exactly one of images or videos")
            kind = "image" if images is not None else "video"

            def empty(n):
                nan = torch.full((n,), float("nan"))
                return CLIPScoreResult(nan, None if references is None else nan.clone(), None if references is None else nan.clone(), [False] * n)

            return score_valid(
                self.score, candidates, images if images is not None else videos, f"{kind}s", image_ids, "image_ids",
                references,
                lambda vs, ids: self.backbone.visual_embeddings(vs, kind=kind, frames=self.frames, ids=ids),
                empty,
            )
        candidates = check_captions(candidates)
        n = len(candidates)
        visuals, kind = self._visual_inputs(n, images, videos, image_ids)
        refs = check_references(references, n)
        visual = self._visual_embeddings(visuals, kind, image_ids)

        text = embed_captions(
            self.backbone, candidates, self.batch_size, prefix=self.prefix, long_captions=self.long_captions
        )
        scores = clip_s(visual, text.pooled.to(visual.device), self.w)
        if refs is None:
            return CLIPScoreResult(scores, None, None, text.truncated, windows=text.windows)
        flat = [r for rs in refs for r in rs]
        ref_text = embed_captions(
            self.backbone, flat, self.batch_size, prefix=self.prefix, long_captions=self.long_captions
        )
        per_candidate, ref_mask = pad_stack(list(torch.split(ref_text.pooled, [len(rs) for rs in refs])))
        sim = reference_similarity(text.pooled, per_candidate, ref_mask)
        return CLIPScoreResult(scores, ref_clip_s(scores, sim), sim, text.truncated, windows=text.windows)

    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None,
               harmonic_mean: str = "released") -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`): the headline CLIP-S and, with
        references, ``ref`` (RefCLIP-S formed by ``harmonic_mean``: ``"released"`` or ``"sign-safe"``, the
        rewards' default) and ``ref_similarity``; the extra ``truncated``."""
        mean = harmonic_mean_named(harmonic_mean)
        res = self.score(list(captions), images=images, references=references, videos=videos, image_ids=visual_ids)
        n = len(res.clip_s)
        subs = {}
        if res.ref_similarity is not None:
            subs = {"ref": floats(ref_clip_s(res.clip_s, res.ref_similarity, mean), n),
                    "ref_similarity": floats(res.ref_similarity, n)}
        return Scores(score=floats(res.clip_s, n), sub_scores=subs, extras={"truncated": [bool(t) for t in res.truncated]},
                      result=res)

    def score_soft(
        self,
        probs: torch.Tensor,
        lengths: torch.Tensor,
        images: Sequence[Any] | None = None,
        *,
        videos: Sequence[Any] | None = None,
        image_ids: Sequence[str | None] | None = None,
    ) -> torch.Tensor:
        """Differentiable CLIP-S of soft captions, without references.

        Args:
            probs: [N, L, V] distributions over CLIP's vocabulary (below).
            lengths: [N] positions of each caption, SOS and EOS included.
            images: one image per caption.
            videos: one video per caption instead of ``images``.
            image_ids: cache ids of the visuals.

        Returns:
            CLIP-S [N] in [0, w], with gradients to ``probs``.

        ``probs`` [N, L, V] holds a distribution over CLIP's vocabulary per position (position 0 is SOS,
        ``lengths[i]-1`` is EOS, as for `capreward.scorers.EMScore.score_soft()`); the prefix is
        inserted after SOS here as one-hot tokens. Gradients flow to ``probs`` (zero where the cosine is
        negative, as the clip at 0 is flat there).
        """
        n = probs.shape[0]
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        check_same_length(n, lengths, "lengths")
        visuals, kind = self._visual_inputs(n, images, videos, image_ids)
        prefix = self.backbone.token_ids(self.prefix)[0][1:-1] if self.prefix else []
        if prefix:
            one_hot = torch.nn.functional.one_hot(torch.tensor(prefix), probs.shape[-1]).to(probs)
            probs = torch.cat([probs[:, :1], one_hot[None].expand(n, -1, -1), probs[:, 1:]], dim=1)
            lengths = lengths + len(prefix)
        if int(lengths.min()) < 2 or int(lengths.max()) > min(probs.shape[1], self.backbone.context_length):
            raise ValueError("each length must count SOS..EOS (>= 2) and fit in the probs and CLIP's context")
        visual = self._visual_embeddings(visuals, kind, image_ids)
        text = self.backbone.encode_text_soft(probs[:, : int(lengths.max())], lengths)
        return clip_s(visual, text.pooled.to(visual.device), self.w)

    def _visual_inputs(self, n: int, images, videos, image_ids) -> tuple[list, str]:
        """The visuals as a list and their kind, after checking that exactly one of ``images``/``videos``
        is given, with one entry (and id) per candidate."""
        if (images is None) == (videos is None):
            raise ValueError("CLIP-S needs exactly one of images or videos")
        visuals = list(images if images is not None else videos)
        check_same_length(n, visuals, "images" if images is not None else "videos")
        check_same_length(n, image_ids, "image_ids")
        return visuals, ("image" if images is not None else "video")

    def _visual_embeddings(self, visuals: list, kind: str, image_ids) -> torch.Tensor:
        """[n, D] normalised embedding of each image (of each video: its mean frame embedding)."""
        frame_list = self.backbone.visual_embeddings(visuals, kind=kind, frames=self.frames, ids=image_ids)
        frames, frame_mask = pad_stack(frame_list)
        return video_embedding(frames, frame_mask)  # a single frame's embedding for images


class PACScore(CLIPScore):
    """PAC-S / RefPAC-S: CLIP-S with the PAC-S fine-tuned checkpoint and w = 2.0.

    Args:
        model: the PAC-S weights, e.g. the released ``clip_ViT-B-32.pth`` (an OpenAI-format state dict
            under a ``state_dict`` key; the architecture is inferred).
        kwargs: the other arguments of :class:`CLIPScore` (``w`` defaults to 2.0).

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward import PACScore
        >>> pac = PACScore(model=clip)                 # PAC-S's released checkpoint in practice
        >>> pac.w
        2.0
        >>> r = pac.score(["a red image", "a blue image"], images=[red, red])
        >>> bool(r.clip_s[0] > r.clip_s[1])
        True
    """

    default_w = 2.0

    def __init__(self, model: str | os.PathLike | Callable[[], tuple], **kwargs: Any):
        super().__init__(model, **kwargs)
