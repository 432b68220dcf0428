"""A local VLM judge on transformers: prompt + image -> greedy text and token distributions.

:class:`LocalJudge` wraps a ``LlavaForConditionalGeneration`` (or a model built the same way: a
forward taking ``inputs_embeds``, ``attention_mask``, ``position_ids``, a key/value cache (``cache``
on transformers >= 5.24, ``past_key_values`` before: :func:`~capreward.judges.cache.cache_keyword`) and
``logits_to_keep``, ``get_image_features``, a ``.model`` returning hidden states and an output
embedding) and its processor. It offers the building blocks the
LLM-judged metrics need:

- :meth:`LocalJudge.start`: one batched prefill. Captions that share an image (a GRPO group) share the
  image and the prompt text before the caption: that prefix is run once per image (the model's own
  attention, SDPA by default) and its keys/values are held once per image for all its rows, never
  copied into them (:mod:`~capreward.judges.prefix_cache`); only each row's remaining tokens are run on
  top of it.
- :meth:`LocalJudge.step` / :meth:`LocalJudge.select`: cheap continuation from the cached state, one
  token per row, and forking rows (for trees of decode steps; a fork copies the row's own tokens only).
- :meth:`LocalJudge.greedy` / :meth:`LocalJudge.generate_from`: decoding on the device with the full logits of
  every step (or of chosen steps), the host looking at the state every few steps only, and the decode
  step replayed as a CUDA graph on a GPU (:mod:`~capreward.judges.decoding`).
- :meth:`LocalJudge.logits_at`: one differentiable teacher-forced pass that returns the logits at chosen
  steps, with gradients to ``inputs_embeds`` and ``pixel_values``.

Batches are left padded; positions are counted over real tokens only, so a row's results do not depend
on what else is in the batch. Everything that is not explicitly differentiable runs under
``torch.inference_mode()``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol, cast
from collections.abc import Sequence

import torch
from PIL import Image

from ..text import well_formed
from .cache import cache_keyword, growing_cache, output_cache
from .decoding import DecodeOutput, GreedyOutput, decode_loop
from .prefix_cache import SharedPrefixCache, shared_attention
from .families import JudgeFamily, judge_family
from .images import mean_background, pad_to_square
from ..devices import checked_device
from ..default_models import DEFAULT_LLAVA
from .loading import load_llava, resolve_device, resolve_dtype
from .caller_text import Data, PromptParts, control_token_ids, control_token_strings, encode_parts_many, render
from .prompts import IMAGE_PLACEHOLDER, LLAVA_V1_SYSTEM, llava_v1_parts
from .vocab import digit_token_ids


@dataclass
class DecodeState:
    """A batch of N sequences in the middle of decoding.

    ``cache`` (:class:`~capreward.judges.prefix_cache.SharedPrefixCache`) holds the shared prefix once per
    image and each row's own keys/values (the rest of its prompt, its answer so far), with the mask of its
    real columns; ``next_position`` (N,) is each row's position id for its next token; ``logits`` (N, V)
    float32 are the next-token logits. :meth:`LocalJudge.step` extends the cache in place: keep using the
    returned state, or :meth:`LocalJudge.select` rows first to branch.
    """

    cache: Any
    next_position: torch.Tensor
    logits: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.logits.shape[0])


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of the integer sequences ``rows`` (0 for no rows)."""
    if not rows:
        return 0
    first = rows[0]
    n = min(len(r) for r in rows)
    for i in range(n):
        t = first[i]
        if any(r[i] != t for r in rows):
            return i
    return n


class _VideoFamily(Protocol):
    """What a :class:`JudgeFamily` that takes videos (``takes_video``) adds."""

    @property
    def video_token_id(self) -> int: ...

    @property
    def video_placeholder(self) -> str: ...

    def preprocess_videos(self, videos: Any, device: Any, dtype: Any) -> torch.Tensor: ...


class LocalJudge:
    """A LLaVA-style judge running locally with transformers.

    Args:
        model: a hub name or local directory (default ``llava-hf/llava-1.5-13b-hf``; the 7b and any
            ``save_pretrained`` directory work), a ``(model, processor)`` pair, or a model object with
            ``processor`` given.
        processor: the processor of a model object.
        device: where to run (None: CUDA if available, else CPU, when loading by name; a passed model is
            moved only when ``device`` or ``dtype`` is given).
        dtype: the precision (None: float16 on CUDA, float32 elsewhere).
        pad_to_square: LLaVA-1.5's padding of images to a square in the processor's mean colour.
        system: the conversation's system sentence (LLaVA v1's by default).
        local_files_only: load from the local cache only (None: transformers' default).
        attn_implementation: transformers' ``attn_implementation`` (None: its default).
        image_size: (width, height) other families' images are resized to (None: the family's default).
        decode_graphs: run decode steps as CUDA graphs (None: on CUDA; never on the CPU); a step that cannot
            be captured, or whose first replay differs from the eager step, falls back to eager steps.
        sync_every: decode steps between the host's looks at the device state (whether every row is done).

    Raises:
        JudgeLoadError: the model or its processor cannot be loaded.
        TypeError: a model object without its processor.

    Other families (`capreward.judges.families`, picked from ``config.model_type``: Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL, Idefics3, SmolVLM, LLaVA-NeXT, LLaVA-OneVision) run through their own chat template,
    image processor and positions; ``image_size``
    (width, height) is what their images are resized to (None: the family's default), and
    ``pad_to_square``/``system`` are LLaVA's only. `family` is None for LLaVA-1.5.

    Examples:
        >>> from capreward.judges import LocalJudge
        >>> from capreward.testing import tiny_judge_dir
        >>> judge = LocalJudge(str(tiny_judge_dir()))    # FLEUR(model=...) builds one of these
        >>> judge.family is None                     # LLaVA-1.5: the released LLaVA v1 prompt
        True
    """

    def __init__(
        self,
        model: Any = DEFAULT_LLAVA,
        processor: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        pad_to_square: bool = True,
        system: str = LLAVA_V1_SYSTEM,
        local_files_only: bool | None = None,
        attn_implementation: str | None = None,
        image_size: tuple[int, int] | int | None = None,
        decode_graphs: bool | None = None,
        sync_every: int = 4,
    ):
        if isinstance(model, (tuple, list)):
            if len(model) != 2 or processor is not None:
                raise TypeError("pass model=(model, processor), or model=... and processor=... separately")
            model, processor = model
        if isinstance(model, (str, os.PathLike)):
            dev = checked_device(resolve_device(device))  # a missing GPU: one clear error before loading
            model, processor = load_llava(
                model,
                dtype=resolve_dtype(dtype, dev),
                device=dev,
                local_files_only=local_files_only,
                attn_implementation=attn_implementation,
            )
        else:
            if processor is None:
                raise TypeError("a model object needs its processor: pass model=(model, processor)")
            if device is not None or dtype is not None:
                dev = checked_device(resolve_device(device)) if device is not None else next(model.parameters()).device
                target = resolve_dtype(dtype, dev) if dtype is not None else next(model.parameters()).dtype
                model.to(device=dev, dtype=target)
            model.eval()
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.pad_to_square = pad_to_square
        self.system = system
        self._digit_ids: list[int] | None = None
        self._control_ids: set[int] | None = None
        self._cache_keyword = cache_keyword(model)  # "cache" or "past_key_values": what this forward takes
        if sync_every < 1:
            raise ValueError(f"sync_every must be at least 1, got {sync_every}")
        self.decode_graphs = decode_graphs
        self.sync_every = int(sync_every)
        self._graphs_ok = True  # False once a capture or its self-check failed
        self._graphs_checked = False  # the first graph's replay was checked against the eager step
        self.family: JudgeFamily | None = judge_family(model, processor, image_size)
        self._check_image_token()

    # ----------------------------------------------------------------------------------------- facts
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def image_token_id(self) -> int:
        return int(self.model.config.image_token_id)

    @property
    def visual_token_ids(self) -> list[int]:
        """The placeholder tokens a prompt's one visual may use: the image token, and the video token of a
        family that takes videos (:meth:`preprocess_videos`)."""
        if self.family is not None and self.family.takes_video:
            return [self.image_token_id, cast(_VideoFamily, self.family).video_token_id]
        return [self.image_token_id]

    def _is_visual(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.isin(ids, torch.tensor(self.visual_token_ids, device=ids.device))

    @property
    def image_placeholder(self) -> str:
        return getattr(self.processor, "image_token", IMAGE_PLACEHOLDER)

    @property
    def eos_token_ids(self) -> set[int]:
        """Ids that end an answer: the generation config's ``eos_token_id`` (one or several), else the
        tokenizer's."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the judge's tokenizer and generation config define no end-of-sequence token")
        return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = getattr(getattr(self.model, "generation_config", None), "pad_token_id", None)
        if pad is None:
            pad = min(self.eos_token_ids)
        return int(pad)

    @property
    def context_length(self) -> int:
        """Most positions the language model was built for (``max_position_embeddings``)."""
        text_config = self.model.config.get_text_config()
        return int(getattr(text_config, "max_position_embeddings", 4096))

    def _check_image_token(self) -> None:
        ids = self.tokenizer.encode(self.image_placeholder, add_special_tokens=False)
        if ids != [self.image_token_id]:
            raise ValueError(
                f"the tokenizer encodes the image placeholder {self.image_placeholder!r} as {ids}, but the model's "
                f"image_token_id is {self.image_token_id}; the model and processor do not belong together"
            )

    def digit_token_ids(self) -> list[int]:
        """Token ids of the digits 0-9 (:func:`~capreward.judges.vocab.digit_token_ids` of this judge's
        tokenizer, computed once). Returns 10 ids."""
        if self._digit_ids is None:
            self._digit_ids = digit_token_ids(self.tokenizer)
        return list(self._digit_ids)

    # ------------------------------------------------------------------------------------- text side
    def conversation(self, turns: Sequence[tuple[str, str | None]]) -> str:
        """The LLaVA v1 prompt for ``turns`` with the image placeholder before the first message (another
        family: its chat template's prompt, the image in the first user turn)."""
        return render(self.conversation_parts(turns))

    def conversation_parts(self, turns: Sequence[tuple[str, str | None]], video: bool = False) -> list[str | Data]:
        """`conversation()` as prompt parts: every message and answer is `Data` (encoded by
        `encode_prompts()` without special tokens). ``video``: the first turn holds a video (the
        family's video placeholder, `preprocess_videos()`) instead of an image."""
        if video:
            family = self._video_family()
            return family.conversation_parts(turns, cast(_VideoFamily, family).video_placeholder, kind="video")
        if self.family is not None:
            return self.family.conversation_parts(turns, self.image_placeholder)
        return llava_v1_parts(turns, system=self.system, image_placeholder=self.image_placeholder)

    def _video_family(self) -> JudgeFamily:
        if self.family is None or not self.family.takes_video:
            name = "llava" if self.family is None else self.family.name
            raise ValueError(f"the {name} judge family does not take videos (video judges: Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision); "
                             "pass frames as images or a composite instead")
        return self.family

    @property
    def control_token_ids(self) -> set[int]:
        """Ids that are prompt structure (special and added tokens, the image token): never written by
        caller text."""
        if self._control_ids is None:
            self._control_ids = control_token_ids(self.tokenizer, [self.image_token_id])
        return set(self._control_ids)

    def control_token_strings(self) -> list[str]:
        """The text of every `control_token_ids` token ("<s>", "</s>", "<image>", ...)."""
        return control_token_strings(self.tokenizer, [self.image_token_id])

    def encode_prompts(
        self, prompts: Sequence[str | PromptParts], num_image_tokens: int, names: Sequence[str] | None = None
    ) -> list[list[int]]:
        """Token ids of each prompt (BOS included), the image placeholder expanded to ``num_image_tokens``
        copies, as the processor does.

        A prompt is a ``str`` (all template: its special-token strings are special tokens, as in a chat
        template) or parts (`conversation_parts()`): template ``str`` pieces and
        `Data` pieces, whose text never becomes a special token (a
        caption's "</s>" or "<image>" is spelled out as characters; clean text gets exactly the ids of
        encoding the rendered string; a lone surrogate reads as U+FFFD, as in CLIP's text cleaning).
        Raises ValueError naming the prompt (``names[i]``, default
        ``prompts[i]``) when it does not hold exactly one image placeholder."""
        out = []
        control = self.control_token_ids
        in_parts = [i for i, prompt in enumerate(prompts) if not isinstance(prompt, str)]  # one tokenizer call
        by_parts = dict(zip(in_parts, encode_parts_many(self.tokenizer, [prompts[i] for i in in_parts], control)))
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                ids = list(self.tokenizer(well_formed(prompt), add_special_tokens=True)["input_ids"])
            else:
                ids = by_parts[i]
            visual = set(self.visual_token_ids)
            count = sum(1 for t in ids if t in visual)
            if count != 1:
                name = names[i] if names is not None else f"prompts[{i}]"
                raise ValueError(f"{name} holds {count} image placeholders; exactly one is needed")
            at = next(k for k, t in enumerate(ids) if t in visual)
            if self.family is None:
                expansion = [self.image_token_id] * num_image_tokens
            else:  # Idefics3: the processor's tile layout around the image tokens
                expansion = self.family.image_expansion(ids[at], num_image_tokens)
            out.append(list(ids[:at]) + expansion + list(ids[at + 1 :]))
        return out

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of generated ``tokens`` (special tokens dropped), stripped of outer whitespace."""
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True).strip()

    def prefix_texts(self, tokens: Sequence[int]) -> list[str]:
        """``[decode(tokens[:1]), decode(tokens[:2]), ...]`` without stripping: which step wrote what."""
        return [self.tokenizer.decode(list(tokens[: k + 1]), skip_special_tokens=True) for k in range(len(tokens))]

    # ----------------------------------------------------------------------------------- image side
    def preprocess(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """``pixel_values`` (U, 3, H, W) for RGB images, on the judge's device and dtype.

        Each image is padded to a square in the mean colour first when ``pad_to_square`` is set. (Another
        family: its image processor's output for the images resized to ``image_size``.)
        """
        if self.family is not None:
            return self.family.preprocess(images, self.device, self.dtype)
        image_processor = self.processor.image_processor
        if self.pad_to_square:
            background = mean_background(image_processor.image_mean)
            images = [pad_to_square(im, background) for im in images]
        pixel_values = image_processor(images=list(images), return_tensors="pt")["pixel_values"]
        return pixel_values.to(device=self.device, dtype=self.dtype)

    def preprocess_videos(self, videos: Sequence[Sequence[Image.Image]]) -> torch.Tensor:
        """``pixel_values_videos`` for videos given as lists of RGB frames (the same number each), through
        the family's video processor (frames resized to :attr:`JudgeFamily.image_size`); their features
        come from :meth:`image_features` and fill the prompt's video placeholder
        (:meth:`conversation_parts` with ``video=True``). Until the next :meth:`preprocess`, prompts are
        positioned for this video grid. Raises ValueError for a family that takes no videos."""
        return cast(_VideoFamily, self._video_family()).preprocess_videos(videos, self.device, self.dtype)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Projected image features (U, n_image_tokens, hidden) for ``pixel_values`` (of the last
        :meth:`preprocess` or :meth:`preprocess_videos`: a video's features, all frames). Differentiable."""
        if self.family is not None:
            return self.family.image_features(pixel_values.to(device=self.device, dtype=self.dtype))
        out = self.model.get_image_features(pixel_values=pixel_values.to(device=self.device, dtype=self.dtype))
        feats = getattr(out, "pooler_output", out)
        if isinstance(feats, (list, tuple)):
            feats = torch.stack(list(feats))
        return feats

    def embed(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor | None = None,
        feature_start: int = 0,
        text_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Input embeddings (B, L, hidden) of ``input_ids`` (B, L) with image features in place.

        The k-th image placeholder of row b takes ``features[b, feature_start + k]``. ``text_embeds``,
        when given, replaces the token-embedding lookup (to differentiate with respect to it).
        Differentiable in ``features`` and ``text_embeds``.
        """
        emb = self.model.get_input_embeddings()(input_ids) if text_embeds is None else text_embeds
        mask = self._is_visual(input_ids)
        if features is None:
            if bool(mask.any()):
                raise ValueError("the inputs hold image placeholders but no image features were given")
            return emb
        if features.shape[0] != input_ids.shape[0]:
            raise ValueError(f"{features.shape[0]} feature rows for {input_ids.shape[0]} sequences")
        counts = mask.sum(dim=1)
        if bool((counts + feature_start > features.shape[1]).any()):
            raise ValueError(
                f"a row holds {int(counts.max())} image placeholders from offset {feature_start} but the image "
                f"gives {features.shape[1]} features"
            )
        if features.dim() == 4:  # deepstack features after the input features: embed the input ones
            features = features[:, :, 0]
        gathered = features.gather(1, self._feature_index(mask, feature_start, features))
        return torch.where(mask.unsqueeze(-1), gathered.to(emb.dtype), emb)

    @staticmethod
    def _feature_index(mask: torch.Tensor, feature_start: int, features: torch.Tensor) -> torch.Tensor:
        """(B, L, hidden) gather index: the k-th image token of row b reads feature ``feature_start + k``."""
        index = (mask.long().cumsum(dim=1) - 1 + feature_start).clamp(min=0, max=features.shape[1] - 1)
        return index.unsqueeze(-1).expand(-1, -1, features.shape[-1])

    def deepstack_inputs(
        self, input_ids: torch.Tensor, features: torch.Tensor | None, feature_start: int = 0
    ) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """For a family with deepstack features (Qwen3-VL, ``features`` (B, n, 1 + D, hidden)): the image
        token mask (B, L) and, per deepstack layer, the features of those tokens in row-major order (as
        the model's own forward builds ``visual_pos_masks`` / ``deepstack_visual_embeds``); None when
        the family has none or the rows hold no image token. Differentiable in ``features``."""
        if self.family is None or not self.family.deepstack or features is None:
            return None
        mask = self._is_visual(input_ids)
        if not bool(mask.any()):
            return None
        index = self._feature_index(mask, feature_start, features[:, :, 0])
        layers = [features[:, :, d].gather(1, index)[mask] for d in range(1, features.shape[2])]
        return mask, layers

    # ------------------------------------------------------------------------------------- decoding
    def _image_starts(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Index of the first image token of each row (-1: none)."""
        starts = []
        visual = set(self.visual_token_ids)
        for ids in rows:
            ids = list(ids)
            starts.append(next((k for k, t in enumerate(ids) if t in visual), -1))
        return torch.tensor(starts, dtype=torch.long, device=self.device)

    def _positions(self, positions: torch.Tensor, image_start: torch.Tensor) -> torch.Tensor:
        """The model's position ids for sequence indices ``positions`` (B, L) (LLaVA: the indices;
        Qwen2-VL: 3-D rotary positions over the image)."""
        if self.family is None:
            return positions
        return self.family.position_ids(positions, image_start)

    def _forward(self, embeds, attention_mask, position_ids, cache, logits_to_keep=1, deepstack=None):
        """The model's forward with ``cache``; a :class:`SharedPrefixCache` is read by the shared-prefix
        attention (``attention_mask`` is then its query mask, 4-D, which transformers takes as it is)."""
        if isinstance(cache, SharedPrefixCache):
            with shared_attention(self.model, cache) as extra:
                return self._model_forward(embeds, attention_mask, position_ids, cache, logits_to_keep, deepstack, extra)
        return self._model_forward(embeds, attention_mask, position_ids, cache, logits_to_keep, deepstack, {})

    def _model_forward(self, embeds, attention_mask, position_ids, cache, logits_to_keep, deepstack, extra):
        if deepstack is not None:  # Qwen3-VL: the language model with its deepstack inputs, then the head
            assert self.family is not None  # deepstack inputs come from a family
            out = self.family.language_forward(embeds, attention_mask, position_ids,
                                               {self._cache_keyword: cache, **extra}, deepstack[0], deepstack[1])
            hidden = out.last_hidden_state[:, -logits_to_keep:]
            logits = self.model.get_output_embeddings()(hidden)
            return SimpleNamespace(logits=logits, **{self._cache_keyword: output_cache(out, self._cache_keyword)})
        return self.model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{self._cache_keyword: cache},
            **extra,
        )

    def _cache_of(self, output: Any) -> Any:
        """The updated key/value cache of a forward's ``output``."""
        return output_cache(output, self._cache_keyword)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.get_text_config().num_hidden_layers)

    @torch.inference_mode()
    def start(
        self,
        prompt_ids: Sequence[Sequence[int]],
        features: torch.Tensor | None,
        image_index: Sequence[int],
        share_prefix: bool = True,
        reserve: int = 16,
    ) -> DecodeState:
        """Prefill N prompts in one batch and return the state ready for the first generated token.

        ``prompt_ids[n]`` (from `encode_prompts()`) uses image ``image_index[n]`` of ``features``
        (U, n_image_tokens, hidden). With ``share_prefix`` the longest common token prefix of the prompts
        (system text, image, prompt text before the caption) is run once per distinct image, and its
        keys/values are held once per image for all the rows of that image (never copied into the rows:
        :mod:`~capreward.judges.prefix_cache`); then every row's remaining tokens run on top, left padded.
        Each row's own cache keeps room for ``reserve`` more tokens (it grows, doubling, when that runs
        out).
        """
        n_rows = len(prompt_ids)
        if n_rows == 0:
            raise ValueError("no prompts to run")
        if len(image_index) != n_rows:
            raise ValueError(f"{len(image_index)} image indices for {n_rows} prompts")
        device = self.device
        lengths = [len(p) for p in prompt_ids]
        if min(lengths) == 0:
            raise ValueError("empty prompt")
        shared = min(common_prefix_length(prompt_ids), min(lengths) - 1) if share_prefix else 0
        rows_image = torch.tensor(list(image_index), dtype=torch.long, device=device)

        suffix_len = max(lengths) - shared
        visual = set(self.visual_token_ids)
        placeholders_in_prefix = 0
        if shared > 0:
            # The shared prefix, once per distinct image; its keys/values stay once per image.
            used = sorted({int(i) for i in image_index})
            slot = {u: k for k, u in enumerate(used)}
            prefix = torch.tensor(list(prompt_ids[0][:shared]), dtype=torch.long, device=device)
            prefix = prefix.unsqueeze(0).expand(len(used), -1)
            placeholders_in_prefix = sum(1 for t in prompt_ids[0][:shared] if t in visual)
            feats = None
            if features is not None and placeholders_in_prefix:
                feats = features.index_select(0, torch.tensor(used, dtype=torch.long, device=features.device))
            embeds = self.embed(prefix, feats)
            positions = torch.arange(shared, device=device).unsqueeze(0).expand(len(used), -1)
            positions = self._positions(positions, self._image_starts([prompt_ids[0]]).expand(len(used)))
            prefix_cache = growing_cache(None, self.num_layers, reserve=1)
            deepstack = self.deepstack_inputs(prefix, feats)
            self._forward(embeds, torch.ones_like(prefix), positions, prefix_cache, deepstack=deepstack)
            prefix_kv = [(layer.keys, layer.values) for layer in prefix_cache.layers]
            cache = SharedPrefixCache(prefix_kv, [slot[int(i)] for i in image_index], suffix_len + reserve, device)
            del prefix_cache
        else:
            cache = SharedPrefixCache(None, [0] * n_rows, suffix_len + reserve, device, num_layers=self.num_layers)

        ids = torch.full((n_rows, suffix_len), self.pad_token_id, dtype=torch.long)
        real = torch.zeros((n_rows, suffix_len), dtype=torch.bool)
        positions = torch.ones((n_rows, suffix_len), dtype=torch.long)
        for n, p in enumerate(prompt_ids):
            tail = list(p[shared:])
            ids[n, suffix_len - len(tail) :] = torch.tensor(tail, dtype=torch.long)
            real[n, suffix_len - len(tail) :] = True
            positions[n, suffix_len - len(tail) :] = torch.arange(shared, len(p))
        ids, positions = ids.to(device), positions.to(device)
        starts = self._image_starts(prompt_ids)
        positions = self._positions(positions, starts)
        row_features = None
        if features is not None and any(t in visual for p in prompt_ids for t in p[shared:]):
            row_features = features.index_select(0, rows_image.to(features.device))
        embeds = self.embed(ids, row_features, feature_start=placeholders_in_prefix)
        deepstack = self.deepstack_inputs(ids, row_features, feature_start=placeholders_in_prefix)
        mask = cache.open_rows(real)
        out = self._forward(embeds, mask, positions, cache, deepstack=deepstack)
        cache.advance(suffix_len)
        return DecodeState(
            cache=cache,
            # after the prompt every token is text: its position is its index plus the family's offset
            next_position=torch.tensor(lengths, dtype=torch.long, device=device) + self._offset(starts),
            logits=out.logits[:, -1, :].float(),
        )

    def _offset(self, image_start: torch.Tensor) -> torch.Tensor:
        """Per row: position minus index of a text token after the image (0 for LLaVA)."""
        if self.family is None:
            return torch.zeros_like(image_start)
        return torch.where(image_start >= 0, self.family.position_offset(), 0)

    def _step_in_place(self, state: DecodeState, tokens: torch.Tensor, device_cursor: bool = False) -> None:
        """One token per row: the cache, ``next_position`` and ``logits`` of ``state`` are updated in place,
        with device operations only (no host value read: a CUDA graph can capture it). ``device_cursor``:
        move only the device cursor (a captured graph; the host length is moved after each replay)."""
        cache = state.cache
        mask = cache.open_step()
        embeds = self.model.get_input_embeddings()(tokens.view(-1, 1))
        out = self._forward(embeds, mask, state.next_position.view(-1, 1), cache)
        state.logits.copy_(out.logits[:, -1, :])
        state.next_position.add_(1)
        if device_cursor:
            cache.cursor.add_(1)
        else:
            cache.advance(1)

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor) -> DecodeState:
        """Feed one token per row (``tokens`` (N,)) and return the state with the next logits.

        The cache is extended in place (the old state must not be stepped again).
        """
        tokens = tokens.to(self.device).view(-1)
        if tokens.shape[0] != state.batch_size:
            raise ValueError(f"{tokens.shape[0]} tokens for {state.batch_size} rows")
        state.cache.reserve(1)
        new = DecodeState(state.cache, state.next_position.clone(), state.logits.clone())
        self._step_in_place(new, tokens)
        return new

    @torch.inference_mode()
    def select(self, state: DecodeState, rows: Sequence[int] | torch.Tensor, reserve: int = 16) -> DecodeState:
        """A new state made of ``rows`` of ``state`` (repeats allowed): branch decoding cheaply. Each new
        row's own keys/values are copied (with room for ``reserve`` more tokens), the shared prefix is not;
        ``state`` stays usable."""
        rows = [int(r) for r in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)]
        index = torch.tensor(rows, dtype=torch.long, device=state.logits.device)
        return DecodeState(
            cache=state.cache.select_rows(rows, reserve),
            next_position=state.next_position.index_select(0, index),
            logits=state.logits.index_select(0, index),
        )

    def cache_bytes(self, state: DecodeState) -> dict[str, int]:
        """Bytes of ``state``'s key/value cache: ``prefix`` (the shared prefixes, once per image), ``rows``
        (the rows' own buffers at their capacity) and ``total``."""
        return state.cache.nbytes()

    @torch.inference_mode()
    def greedy(
        self,
        state: DecodeState,
        max_new_tokens: int | Sequence[int],
        keep_logits: bool = True,
        keep_tokens: Sequence[int] | None = None,
        compact: float = 0.5,
    ) -> GreedyOutput:
        """Greedy decoding from ``state`` (argmax, ties to the lowest id, like ``generate(do_sample=False)``).

        ``max_new_tokens``: one budget for all rows or one per row (the end-of-sequence token counts);
        each row stops at its end-of-sequence token or its budget. ``keep_logits``: keep the logits of
        every step, or with ``keep_tokens`` only of the steps whose chosen token is one of them (FLEUR
        keeps the digit steps, so a long answer does not hold (T, V) logits). ``compact``: once the rows
        still decoding are at most this fraction of the batch, the finished rows are dropped from the
        cache (a copy of the live rows' own keys/values; the prefix is shared), so a few long answers do
        not keep the whole batch stepping. Results do not depend on compaction. The decoding runs on the
        device (:mod:`~capreward.judges.decoding`).
        """
        out = self.generate_from(state, max_new_tokens, keep_logits=keep_logits, keep_tokens=keep_tokens, compact=compact)
        return GreedyOutput(tokens=out.tokens, finished=out.finished, logits=out.logits)

    @torch.inference_mode()
    def generate_from(
        self,
        state: DecodeState,
        max_new_tokens: int | Sequence[int],
        *,
        keep_logits: bool = False,
        keep_tokens: Sequence[int] | None = None,
        temperatures: Sequence[float] | None = None,
        generator: torch.Generator | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        compact: float = 0.5,
        sync_every: int | None = None,
    ) -> DecodeOutput:
        """Decode from ``state`` on the device (:mod:`~capreward.judges.decoding`): greedy, or sampled for
        the rows whose ``temperatures`` are above 0 (drawn with ``generator``, a generator on the judge's
        device). ``logprobs``: each written token's log-probability; ``top_logprobs``: the k most likely
        tokens of each step. ``sync_every``: steps between the host's looks at the state (default
        :attr:`sync_every`). Other arguments as :meth:`greedy`. Returns a :class:`DecodeOutput`."""
        n_rows = state.batch_size
        budgets = [int(max_new_tokens)] * n_rows if isinstance(max_new_tokens, int) else [int(b) for b in max_new_tokens]
        return decode_loop(
            self, state, budgets, keep_logits=keep_logits, keep_tokens=keep_tokens, temperatures=temperatures,
            generator=generator, logprobs=logprobs, top_logprobs=top_logprobs, compact=compact,
            sync_every=self.sync_every if sync_every is None else sync_every,
            graphs=self.uses_graphs,
        )

    @property
    def uses_graphs(self) -> bool:
        """Whether decode steps run as CUDA graphs: ``decode_graphs`` (None: on CUDA) and not turned off by a
        failed capture or self-check (:mod:`~capreward.judges.decoding`)."""
        wanted = self.device.type == "cuda" if self.decode_graphs is None else bool(self.decode_graphs)
        return wanted and self.device.type == "cuda" and self._graphs_ok

    # ---------------------------------------------------------------------------- differentiable pass
    def teacher_forcing_inputs(
        self, prompt_ids: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], read_steps: Sequence[Sequence[int]]
    ) -> TeacherForcing:
        """Left-padded inputs for one pass over prompt + answer that yields the logits of the answer's
        steps ``read_steps[n]`` (indices into ``answers[n]``; rows may read different numbers of steps,
        missing ones repeat the last prompt position)."""
        width = max(1, max((len(s) for s in read_steps), default=1))
        seqs = []
        for p, a, s in zip(prompt_ids, answers, read_steps):
            upto = max(s) if s else 0  # logits of step t come from the position before answer token t
            seqs.append(list(p) + list(a[:upto]))
        length = max(len(s) for s in seqs)
        n_rows = len(seqs)
        ids = torch.full((n_rows, length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n_rows, length), dtype=torch.long)
        positions = torch.ones((n_rows, length), dtype=torch.long)
        read = torch.zeros((n_rows, width), dtype=torch.long)
        for n, (seq, p, s) in enumerate(zip(seqs, prompt_ids, read_steps)):
            offset = length - len(seq)
            ids[n, offset:] = torch.tensor(seq, dtype=torch.long)
            mask[n, offset:] = 1
            positions[n, offset:] = torch.arange(len(seq))
            wanted = [offset + len(p) - 1 + t for t in s] or [offset + len(p) - 1]
            wanted += [wanted[-1]] * (width - len(wanted))
            read[n] = torch.tensor(wanted, dtype=torch.long)
        device = self.device
        return TeacherForcing(ids.to(device), mask.to(device), positions.to(device), read.to(device))

    def logits_at(
        self,
        inputs: TeacherForcing,
        features: torch.Tensor | None,
        image_index: Sequence[int] | torch.Tensor,
        text_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One forward pass over ``inputs``; returns (N, R, V) float logits at ``inputs.read_index``.

        ``features`` (U, n, hidden) are indexed by ``image_index``; ``text_embeds`` (N, L, hidden), when
        given, replaces the token-embedding lookup. Runs with autograd as the caller has it (wrap it in
        ``torch.enable_grad()`` and pass tensors that require grad to differentiate).
        """
        index = torch.as_tensor(image_index, dtype=torch.long, device=self.device)
        row_features = features.index_select(0, index) if features is not None else None
        embeds = self.embed(inputs.input_ids, row_features, text_embeds=text_embeds)
        position_ids = inputs.position_ids
        if self.family is not None:
            is_image = self._is_visual(inputs.input_ids)
            first = is_image.long().argmax(dim=1)
            starts = torch.where(is_image.any(dim=1), position_ids.gather(1, first.view(-1, 1)).view(-1), -1)
            position_ids = self._positions(position_ids, starts)
        deepstack = self.deepstack_inputs(inputs.input_ids, row_features)
        if deepstack is not None:
            assert self.family is not None  # deepstack inputs come from a family
            hidden = self.family.language_forward(embeds, inputs.attention_mask, position_ids, {"use_cache": False},
                                                  deepstack[0], deepstack[1]).last_hidden_state
        else:
            hidden = self.model.model(
                inputs_embeds=embeds,
                attention_mask=inputs.attention_mask,
                position_ids=position_ids,
                use_cache=False,
            ).last_hidden_state
        picked = hidden.gather(1, inputs.read_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        logits = self.model.get_output_embeddings()(picked)
        return logits if logits.dtype == torch.float64 else logits.float()


@dataclass
class TeacherForcing:
    """Left-padded inputs of a teacher-forced pass: ``input_ids``, ``attention_mask``, ``position_ids``
    (N, L) and ``read_index`` (N, R), the positions whose output logits are wanted."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    read_index: torch.Tensor
