"""Training a captioner *through* a CLIP-based reward: relaxed captions and the differentiable loss.

The captioner decodes autoregressively with the straight-through Gumbel-softmax (Jang et al., 2017): at
each step it draws ``y = onehot(argmax(logits + g))`` in the forward pass with the gradient of
``softmax((logits + g) / tau)`` in the backward pass, and feeds ``y @ E`` (E: its input embeddings) to
the next step, so the gradient flows through the whole caption. A :class:`VocabularyBridge` maps each
step's distribution over the captioner's vocabulary to one over CLIP's BPE vocabulary, and the soft
caption is scored by :meth:`capreward.scorers.EMScore.score_soft` or
:meth:`capreward.scorers.CLIPScore.score_soft`; the loss is minus the mean reward.

Which tokenizers are supported (and what is refused):

- **Shared vocabulary**: the captioner uses CLIP's own BPE vocabulary (same size, same tokens): the
  bridge is the identity.
- **Mappable word-level vocabularies** (``tokenizers``' ``WordLevel`` model): every ordinary token must
  be a single CLIP token (``"red"`` -> ``red</w>``); the bridge is a 0/1 matrix. Words CLIP splits into
  several pieces are refused with the list of offending words (``on_unmappable="refuse"``), or excluded
  from sampling (``"exclude"``), never silently dropped.
- **Subword vocabularies** (GPT-2/RoBERTa BPE, WordPiece, SentencePiece/Unigram) are refused: their
  pieces do not correspond one to one to CLIP's, whose tokens carry end-of-word marks. Train those
  models with :class:`~capreward.training.SelfCriticalStep` (SCST), which needs no gradient through the
  reward.

Special tokens: the captioner's EOS ends the caption (CLIP's SOS and EOS are placed around it); its
BOS, PAD and UNK are excluded from sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from ..errors import CaprewardError
from ..metrics.harmonic import harmonic_mean as harmonic_mean_named
from ..scorers.emscore import EMScore

UNMAPPABLE = ("refuse", "exclude")


class UnsupportedVocabularyError(CaprewardError, ValueError):
    """The captioner's tokenizer cannot be mapped token by token onto CLIP's vocabulary (train it with
    :class:`~capreward.training.SelfCriticalStep` instead).

    Examples:
        >>> from capreward.training import UnsupportedVocabularyError
        >>> issubclass(UnsupportedVocabularyError, ValueError)
        True
    """


def _model_type(tokenizer: Any) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return type(backend.model).__name__ if backend is not None else None


class VocabularyBridge:
    """A map from a captioner's vocabulary to CLIP's: ``matrix`` [V_captioner, V_clip] with one 1 per
    sampleable token, plus the ids that end a caption (``eos_ids``) and that may be sampled
    (``allowed`` [V_captioner] bool).

    Build it with :meth:`from_tokenizers`, or from an explicit ``{captioner id: CLIP id}`` with the constructor.

    Args:
        pairs: captioner token id -> CLIP token id, for every token the captioner may sample.
        captioner_vocab: the captioner's vocabulary size.
        clip_vocab: CLIP's vocabulary size.
        eos_ids: the captioner ids that end a caption.

    Raises:
        ValueError: a mapped id outside its vocabulary.

    Examples:
        >>> import torch
        >>> from capreward.training import VocabularyBridge
        >>> bridge = VocabularyBridge({0: 5, 1: 7}, captioner_vocab=3, clip_vocab=8, eos_ids=[2])
        >>> bridge.to_clip(torch.tensor([[0.25, 0.75, 0.0]]))[0, [5, 7]].tolist(), bridge.allowed.tolist()
        ([0.25, 0.75], [True, True, True])
    """

    def __init__(self, pairs: Mapping[int, int], captioner_vocab: int, clip_vocab: int, eos_ids: Sequence[int]):
        self.captioner_vocab = int(captioner_vocab)
        self.clip_vocab = int(clip_vocab)
        self.eos_ids = sorted({int(i) for i in eos_ids})
        rows = torch.tensor(sorted(pairs), dtype=torch.long)
        cols = torch.tensor([pairs[int(i)] for i in rows], dtype=torch.long)
        if len(rows) and (int(rows.max()) >= self.captioner_vocab or int(cols.max()) >= self.clip_vocab):
            raise ValueError("a mapped id is outside its vocabulary")
        self.rows, self.cols = rows, cols
        allowed = torch.zeros(self.captioner_vocab, dtype=torch.bool)
        allowed[rows] = True
        allowed[self.eos_ids] = True
        self.allowed = allowed

    @classmethod
    def from_tokenizers(cls, tokenizer: Any, backbone: Any, on_unmappable: str = "refuse") -> VocabularyBridge:
        """The bridge from a ``transformers`` tokenizer to a :class:`~capreward.backbones.CLIPBackbone`.

        Args:
            tokenizer: the captioner's tokenizer (CLIP's own, or a word-level vocabulary).
            backbone: the CLIP backbone of the reward.
            on_unmappable: ``"refuse"`` (default) a word CLIP splits into several tokens, or ``"exclude"``
                it (never sampled).

        Returns:
            The :class:`VocabularyBridge`.

        Raises:
            UnsupportedVocabularyError: a subword vocabulary, a tokenizer without EOS, or (with
                ``on_unmappable="refuse"``) a word-level vocabulary with words CLIP splits.
        """
        if on_unmappable not in UNMAPPABLE:
            raise ValueError(f"on_unmappable must be one of {UNMAPPABLE}, got {on_unmappable!r}")
        vocab_size = len(tokenizer)
        specials = {int(i) for i in tokenizer.all_special_ids}
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        if not eos:
            raise UnsupportedVocabularyError("the captioner's tokenizer has no EOS token, so a caption's end is undefined")
        if vocab_size == backbone.vocab_size and _same_as_clip(tokenizer, backbone):
            pairs = {i: i for i in range(vocab_size) if i not in specials}
            return cls(pairs, vocab_size, backbone.vocab_size, eos)
        kind = _model_type(tokenizer)
        if kind != "WordLevel":
            raise UnsupportedVocabularyError(
                f"the captioner's tokenizer is a {kind or type(tokenizer).__name__} subword vocabulary; only CLIP's own "
                "vocabulary or a word-level vocabulary whose words are single CLIP tokens can be mapped token by "
                "token. Train this model with SelfCriticalStep (SCST) instead."
            )
        pairs, unmappable = {}, []
        for word, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            if i in specials:
                continue
            ids, _ = backbone.token_ids(word)
            inner = ids[1:-1]  # drop SOS/EOS
            if len(inner) == 1:
                pairs[i] = inner[0]
            else:
                unmappable.append(word)
        if unmappable and on_unmappable == "refuse":
            shown = ", ".join(repr(w) for w in unmappable[:10]) + (" ..." if len(unmappable) > 10 else "")
            raise UnsupportedVocabularyError(
                f"{len(unmappable)} words of the captioner's vocabulary are not single CLIP tokens: {shown}; "
                "pass on_unmappable='exclude' to forbid sampling them"
            )
        return cls(pairs, vocab_size, backbone.vocab_size, eos)

    def to_clip(self, y: torch.Tensor) -> torch.Tensor:
        """Map distributions over the captioner's vocabulary onto CLIP's.

        Args:
            y: distributions [..., V_captioner].

        Returns:
            [..., V_clip]: each mapped id's mass at its CLIP id (the mass of unmapped ids is dropped; those
            ids are never sampled, see :attr:`allowed`).
        """
        out = y.new_zeros(*y.shape[:-1], self.clip_vocab)
        return out.index_add(-1, self.cols.to(y.device), y.index_select(-1, self.rows.to(y.device)))


def _same_as_clip(tokenizer: Any, backbone: Any) -> bool:
    """True when ``tokenizer`` gives CLIP's ids for a probe sentence (a shared vocabulary)."""
    probe = "a photo of a dog running on the beach"
    ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
    return list(ids) == backbone.token_ids(probe)[0][1:-1]


def gumbel_softmax_st(logits: torch.Tensor, tau: float = 1.0, hard: bool = True, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Straight-through Gumbel-softmax over the last dim: one-hot forward (``hard``), softmax gradient.

    ``noise`` (same shape) replaces the Gumbel draw (for reproducible tests); -inf logits are never drawn.
    """
    if noise is None:
        noise = -torch.empty_like(logits).exponential_().log()
    soft = torch.softmax((logits + noise) / tau, dim=-1)
    if not hard:
        return soft
    index = soft.argmax(dim=-1, keepdim=True)
    one_hot = torch.zeros_like(soft).scatter_(-1, index, 1.0)
    return one_hot - soft.detach() + soft


@dataclass
class RelaxedCaptions:
    """Relaxed captions of a batch: ``y`` [N, L, V_captioner] (one-hot forward, soft gradient), the hard
    ``ids`` [N, L], ``lengths`` [N] (words before the first EOS), and ``captions`` (decoded text)."""

    y: torch.Tensor
    ids: torch.Tensor
    lengths: torch.Tensor
    captions: list[str]


def relaxed_decode(
    model: Any,
    inputs: Mapping[str, Any],
    bridge: VocabularyBridge,
    tokenizer: Any,
    *,
    max_new_tokens: int = 16,
    tau: float = 1.0,
    hard: bool = True,
    noise: torch.Tensor | None = None,
) -> RelaxedCaptions:
    """Decode captions from an encoder-decoder captioner (``decoder_inputs_embeds``-capable, e.g.
    ``VisionEncoderDecoderModel``) with the straight-through Gumbel-softmax, feeding each step's relaxed
    token embedding to the next. ``noise`` [N, max_new_tokens, V] fixes the Gumbel draws."""
    if not getattr(model.config, "is_encoder_decoder", False):
        raise UnsupportedVocabularyError("relaxed decoding needs an encoder-decoder captioner (decoder_inputs_embeds)")
    embed = model.get_decoder().get_input_embeddings()
    start = model.generation_config.decoder_start_token_id
    if start is None:
        start = model.config.decoder_start_token_id
    n = next(v for v in inputs.values() if torch.is_tensor(v)).shape[0]
    device = embed.weight.device
    blocked = ~bridge.allowed.to(device)
    encoder_outputs = model.get_encoder()(**{k: v for k, v in inputs.items() if k != "labels"})
    embeds = embed(torch.full((n, 1), int(start), dtype=torch.long, device=device))
    ys = []
    for t in range(max_new_tokens):
        logits = model(encoder_outputs=encoder_outputs, decoder_inputs_embeds=embeds).logits[:, -1].float()
        logits = logits.masked_fill(blocked, float("-inf"))
        y = gumbel_softmax_st(logits, tau, hard, None if noise is None else noise[:, t])
        ys.append(y)
        embeds = torch.cat([embeds, (y.to(embed.weight.dtype) @ embed.weight)[:, None]], dim=1)
    y = torch.stack(ys, dim=1)
    ids = y.argmax(dim=-1)
    is_eos = torch.isin(ids, torch.tensor(bridge.eos_ids, device=ids.device))
    lengths = torch.where(is_eos.any(dim=1), is_eos.float().argmax(dim=1), torch.full_like(ids[:, 0], max_new_tokens))
    captions = [tokenizer.decode(row[: int(l)].tolist(), skip_special_tokens=True) for row, l in zip(ids, lengths)]
    return RelaxedCaptions(y=y, ids=ids, lengths=lengths, captions=captions)


def clip_soft_captions(relaxed: RelaxedCaptions, bridge: VocabularyBridge, backbone: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP-vocabulary soft captions [N, L+2, V_clip] (SOS, the relaxed words, EOS) and their lengths
    (SOS..EOS inclusive), the input of ``EMScore.score_soft`` / ``CLIPScore.score_soft``. Captions longer
    than CLIP's context are cut to fit (EOS kept); :class:`DifferentiableRewardLoss` refuses a
    ``max_new_tokens`` that could produce one, so no word of its captions is ever cut."""
    words = bridge.to_clip(relaxed.y)
    n, max_words = words.shape[0], words.shape[1]
    keep = relaxed.lengths.to(words.device).clamp(max=min(backbone.context_length - 2, max_words))
    positions = torch.arange(max_words, device=words.device)
    inside = (positions[None, :] < keep[:, None]).to(words.dtype)
    sos = F.one_hot(torch.full((n, 1), backbone.sot_id, device=words.device), bridge.clip_vocab).to(words.dtype)
    tail = words.new_zeros(n, 1, bridge.clip_vocab)
    probs = torch.cat([sos, words * inside[..., None], tail], dim=1)
    lengths = keep + 2
    eos = F.one_hot(torch.full((n,), backbone.eot_id, device=words.device), bridge.clip_vocab).to(words.dtype)
    at_eos = (torch.arange(max_words + 2, device=words.device)[None, :] == (lengths - 1)[:, None]).to(words.dtype)
    probs = probs * (1 - at_eos[..., None]) + at_eos[..., None] * eos[:, None, :]
    return probs, lengths


@dataclass
class RelaxedRewardOutput:
    """One differentiable-reward step: ``loss`` (minus the mean reward, with gradient), the per-caption
    ``rewards`` [N] (detached), the hard ``captions`` and ``metrics`` (``reward``, ``length``)."""

    loss: torch.Tensor
    rewards: torch.Tensor
    captions: list[str]
    metrics: dict[str, float]


class DifferentiableRewardLoss:
    """The loss ``-mean reward(relaxed captions)`` for a CLIP-based scorer (see the module docstring).

    Args:
        scorer: a `EMScore` (reward: ``field`` of its main scores, default the
            full F) or `CLIPScore` / ``PACScore`` (reward: CLIP-S).
        harmonic_mean: how EMScore's F is formed from P and R: ``"sign-safe"`` (default, as
            `EMScoreReward`: in [-1, 1], never decreasing when P or R grows,
            so no gradient climbs towards P = -R) or ``"released"`` (the paper's 2PR/(P+R)).
        bridge: the `VocabularyBridge` from the captioner's tokenizer to the scorer's backbone.
        tokenizer: the captioner's tokenizer (for the decoded captions).
        tau: Gumbel-softmax temperature; hard: straight-through (one-hot forward) or soft forward.
        max_new_tokens: caption length cap; visual: ``"image"`` or ``"video"``.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward import CLIPScore
        >>> from capreward.testing.tiny_captioner import build_tiny_captioner
        >>> from capreward.training.relaxed import DifferentiableRewardLoss, VocabularyBridge
        >>> model, processor, tokenizer = build_tiny_captioner(seed=0)   # a word-level vocabulary
        >>> scorer = CLIPScore(model=clip)
        >>> loss_fn = DifferentiableRewardLoss(scorer, VocabularyBridge.from_tokenizers(tokenizer, scorer.backbone), tokenizer,
        ...                                    max_new_tokens=4)
        >>> out = loss_fn(model, {"pixel_values": processor([red], return_tensors="pt").pixel_values}, [red])
        >>> out.loss.backward()                          # the gradient reaches the captioner
        >>> any(p.grad is not None for p in model.parameters())
        True
    """

    def __init__(
        self,
        scorer: Any,
        bridge: VocabularyBridge,
        tokenizer: Any,
        *,
        tau: float = 1.0,
        hard: bool = True,
        max_new_tokens: int = 16,
        field: str = "full_f",
        visual: str = "image",
        harmonic_mean: str = "sign-safe",
    ):
        if not hasattr(scorer, "score_soft"):
            raise TypeError(f"{type(scorer).__name__} has no differentiable path (score_soft)")
        if visual not in ("image", "video"):
            raise ValueError(f"visual must be 'image' or 'video', got {visual!r}")
        if bridge.clip_vocab != scorer.backbone.vocab_size:
            raise ValueError("the bridge was built for another CLIP vocabulary")
        room = int(scorer.backbone.context_length) - 2  # SOS and EOS around the words
        if not 1 <= int(max_new_tokens) <= room:
            # a soft caption is one pass through the text tower (no windows): words past the context would
            # be cut and so free, which a reward must never make them
            raise ValueError(
                f"max_new_tokens={max_new_tokens}: the differentiable path reads a caption in one pass of the "
                f"text tower, whose context holds {room} words after SOS and before EOS; give max_new_tokens "
                f"<= {room} (longer captions: score them with the non-differentiable rewards, which read the "
                "whole caption in windows)"
            )
        self.scorer, self.bridge, self.tokenizer = scorer, bridge, tokenizer
        harmonic_mean_named(harmonic_mean)  # a ValueError now for an unknown name
        self.tau, self.hard, self.max_new_tokens, self.field, self.visual = tau, hard, max_new_tokens, field, visual
        self.harmonic_mean = harmonic_mean

    def rewards(self, relaxed: RelaxedCaptions, visuals: Sequence[Any], references: Sequence[Sequence[str]] | None = None) -> torch.Tensor:
        """The scorer's differentiable reward of relaxed captions.

        Args:
            relaxed: the relaxed (soft) captions.
            visuals: one image or video per caption.
            references: one list of reference captions per caption, for a scorer that uses them.

        Returns:
            The rewards [N], with gradients to the captions' distributions.
        """
        probs, lengths = clip_soft_captions(relaxed, self.bridge, self.scorer.backbone)
        where = {"images" if self.visual == "image" else "videos": list(visuals)}
        if isinstance(self.scorer, EMScore):
            result = self.scorer.score_soft(probs, lengths, references=references, harmonic_mean=self.harmonic_mean, **where)
            main = result.combined or result.video or result.reference
            return getattr(main, self.field)
        if references is not None:
            raise ValueError("the differentiable CLIP-S path takes no references")
        return self.scorer.score_soft(probs, lengths, **where)

    def __call__(self, model: Any, inputs: Mapping[str, Any], visuals: Sequence[Any], references=None, noise=None) -> RelaxedRewardOutput:
        relaxed = relaxed_decode(
            model, inputs, self.bridge, self.tokenizer, max_new_tokens=self.max_new_tokens, tau=self.tau, hard=self.hard,
            noise=noise,
        )
        rewards = self.rewards(relaxed, visuals, references)
        return RelaxedRewardOutput(
            loss=-rewards.mean(),
            rewards=rewards.detach(),
            captions=relaxed.captions,
            metrics={"reward": float(rewards.detach().mean()), "length": float(relaxed.lengths.float().mean())},
        )
