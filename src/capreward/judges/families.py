"""What differs between VLM judge families, for :class:`~capreward.judges.local.LocalJudge`.

LLaVA-1.5 is the judge the released FLEUR, VisCE² and G-VEval numbers were made with; ``LocalJudge``
keeps its path exactly (LLaVA v1 conversation, images padded to a square, a fixed number of image
tokens, 1-D positions). Other families differ in four places, each a method of a :class:`JudgeFamily`:

- the conversation: the model's own chat template (``processor.chat_template``), rendered once with a
  marker per message, the messages then put back as :class:`~capreward.judges.caller_text.Data` (caller
  text never becomes a role, a special token or an image slot);
- the image: the family's own image processor (Qwen2-VL: patches and an ``image_grid_thw``; Idefics3:
  tiles of the split image plus the global image), and what the one image placeholder of the template
  becomes in tokens (Idefics3: ``<fake_token_around_image><row_1_col_1><image>...<global-img>...``);
- the image features: ``model.get_image_features`` with the family's arguments, one row per image;
- the positions: Qwen2-VL's multimodal rotary positions (temporal, height, width) over the image
  tokens, and text after the image continuing from the image's largest position (a per-image offset);
- the forward: Qwen3-VL adds DeepStack visual features to the hidden states of its first decoder
  layers at the image tokens (:attr:`JudgeFamily.deepstack`, :meth:`JudgeFamily.language_forward`).

Images are resized to one :attr:`JudgeFamily.image_size` before the processor, so every image of a batch
has the same grid and the same image tokens: the prompts of a GRPO group then share their whole prefix
(system text, image, prompt before the caption), which runs once per image, and the captions' suffixes
run batched on its cached keys and values, as for LLaVA.

:func:`judge_family` picks the family from ``model.config.model_type``; :data:`FAMILIES` lists the
supported ones.
"""

from __future__ import annotations

import math
import uuid
from typing import Any, cast
from collections.abc import Sequence

import torch
from PIL import Image

from .caller_text import Data, fill_parts

#: model_type -> family class name, for the families other than LLaVA-1.5 (``"llava"``, handled by
#: ``LocalJudge`` itself).
FAMILIES = {
    "qwen2_vl": "Qwen2VLFamily",
    "qwen2_5_vl": "Qwen2VLFamily",
    "qwen3_vl": "Qwen3VLFamily",
    "idefics3": "Idefics3Family",
    "smolvlm": "SmolVLMFamily",
    "llava_next": "LlavaNextFamily",
    "llava_onevision": "LlavaOnevisionFamily",
}

#: The longest side images are resized to when the family's processor would allow more.
DEFAULT_IMAGE_SIDE = 448


class JudgeFamily:
    """A chat-template VLM judge family (see the module docstring). ``model``/``processor``: the loaded
    pair; ``image_size``: (width, height) every image is resized to (None: the family's default)."""

    name = "chat-template"
    #: Whether the prompts of one image share their prefix (image included) and are run once per image.
    shares_prefix = True
    #: Whether the family takes videos (:meth:`preprocess_videos`, the ``video_token_id`` placeholder).
    takes_video = False

    def __init__(self, model: Any, processor: Any, image_size: tuple[int, int] | int | None = None):
        self.model = model
        self.processor = processor
        if getattr(processor, "chat_template", None) is None:
            raise ValueError(f"the {self.name} judge's processor has no chat template")
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        self.image_size = tuple(image_size) if image_size is not None else self.default_image_size()

    def default_image_size(self) -> tuple[int, int]:
        return (DEFAULT_IMAGE_SIDE, DEFAULT_IMAGE_SIDE)

    # --------------------------------------------------------------------------------- conversation
    def conversation_parts(self, turns: Sequence[tuple[str, str | None]], image_placeholder: str,
                           kind: str = "image") -> list[str | Data]:
        """``turns`` [(user message, answer or None), ...] in the model's chat template, the image (``kind``
        "video": the video) in the first user turn, ending with the generation prompt; every message and
        answer as ``Data``. ``image_placeholder``: what the template writes for that visual."""
        if not turns:
            raise ValueError("a conversation needs at least one user turn")
        marker = f"\ue000{uuid.uuid4().hex}:"
        texts: dict[str, str] = {}
        messages: list[dict] = []
        for i, (message, answer) in enumerate(turns):
            if answer is None and i != len(turns) - 1:
                raise ValueError(f"turn {i} has no answer but is not the last turn")
            key = f"{marker}{len(texts)}\ue001"
            texts[key] = message
            content: list[dict] = [{"type": kind}] if i == 0 else []
            content.append({"type": "text", "text": key})
            messages.append({"role": "user", "content": content})
            if answer is not None:
                key = f"{marker}{len(texts)}\ue001"
                texts[key] = answer
                messages.append({"role": "assistant", "content": [{"type": "text", "text": key}]})
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if isinstance(text, list):
            text = text[0]
        missing = [k for k in texts if text.count(k) != 1]
        if missing:
            raise ValueError(f"the {self.name} chat template does not write every message once")
        if text.count(image_placeholder) != 1:
            raise ValueError(f"the {self.name} chat template writes {text.count(image_placeholder)} {kind} placeholders")
        return fill_parts(text, texts)

    # ---------------------------------------------------------------------------------------- image
    def resize(self, image: Image.Image) -> Image.Image:
        """``image`` (RGB) at :attr:`image_size` (bicubic), what the processor is given."""
        image = image.convert("RGB")
        if image.size != self.image_size:
            image = image.resize(cast(tuple[int, int], self.image_size), Image.Resampling.BICUBIC)
        return image

    def preprocess(self, images: Sequence[Image.Image], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- video
    @property
    def video_placeholder(self) -> str:
        """What the template writes for a video (a family that :attr:`takes_video`): the processor's."""
        return self.processor.video_token

    def resized_clips(self, videos: Sequence[Sequence[Image.Image]]) -> list[list[Image.Image]]:
        """Each video's frames at :attr:`image_size` (:meth:`resize`); the videos must hold as many frames
        each (a ValueError names the counts)."""
        clips = [[self.resize(frame) for frame in frames] for frames in videos]
        if len({len(c) for c in clips}) != 1:
            raise ValueError(f"videos of different frame counts {sorted({len(c) for c in clips})}: pass the same number")
        return clips

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def image_expansion(self, image_token_id: int, num_image_tokens: int) -> list[int]:
        """The tokens the template's one image placeholder becomes for an image of ``num_image_tokens``
        features (default: that many image tokens)."""
        return [image_token_id] * num_image_tokens

    # ------------------------------------------------------------------------------------ positions
    def position_ids(self, positions: torch.Tensor, image_start: torch.Tensor) -> torch.Tensor:
        """The model's position ids for tokens at sequence indices ``positions`` (B, L) of rows whose
        image begins at index ``image_start`` (B,) (-1: no image). Default: the indices themselves."""
        return positions

    def position_offset(self) -> int:
        """How far the model's positions of the tokens after the image are from their indices."""
        return 0

    # ------------------------------------------------------------------------------------ forward
    #: Whether :meth:`image_features` returns (U, n, 1 + D, hidden): the input features, then D deepstack
    #: features added to the hidden states after decoder layers 0..D-1 (Qwen3-VL).
    deepstack = False

    def language_forward(self, embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                         cache_kwargs: dict, visual_mask: torch.Tensor | None,
                         deepstack: list[torch.Tensor] | None) -> Any:
        """The language model's forward (hidden states and cache) with deepstack features at the rows'
        image tokens ``visual_mask`` (B, L); only families with :attr:`deepstack` run it."""
        raise NotImplementedError(f"the {self.name} family has no deepstack features")


class Qwen2VLFamily(JudgeFamily):
    """Qwen2-VL and Qwen2.5-VL: ``image_grid_thw``, 2x2 merged patches, 3-D rotary positions.

    An image of grid (1, H, W) patches gives ``H/m * W/m`` image tokens (m the spatial merge size); the
    k-th has positions (s, s + k // (W/m), s + k % (W/m)) for an image starting at index s, and the text
    after it continues from s + max(H, W)/m (the released ``get_rope_index`` for one image).
    """

    name = "qwen2-vl"
    takes_video = True

    def __init__(self, model: Any, processor: Any, image_size: tuple[int, int] | int | None = None):
        self.merge = int(model.config.vision_config.spatial_merge_size)
        super().__init__(model, processor, image_size)
        self.grid: Any = None  # a tensor once a visual is preprocessed
        self.video = False  # whether the last preprocess was of videos
        self.time_interval: float = 1.0  # temporal position step per frame group (Qwen2.5-VL: seconds-based)

    @property
    def video_token_id(self) -> int:
        return int(self.model.config.video_token_id)

    def preprocess_videos(self, videos: Sequence[Sequence[Image.Image]], device: torch.device,
                          dtype: torch.dtype) -> torch.Tensor:
        """``pixel_values_videos`` of videos (lists of frames, the same number each, resized to
        :attr:`image_size`) through the processor, which also gives the grid (frame groups of
        ``temporal_patch_size``) and, for Qwen2.5-VL, the seconds per frame group that space the temporal
        positions (``tokens_per_second`` of them per second; the processor's frame rate for frames without
        metadata)."""
        clips = self.resized_clips(videos)
        out = self.processor(text=[self.video_placeholder] * len(clips), videos=clips, return_tensors="pt")
        grid = out["video_grid_thw"]
        if not bool((grid == grid[0]).all()):
            raise ValueError(f"videos resized to {self.image_size} gave different grids: {grid.tolist()}")
        self.grid, self.video = grid[0].clone(), True
        seconds = out.get("second_per_grid_ts")
        per_second = getattr(self.model.config.vision_config, "tokens_per_second", None)
        if seconds is not None and per_second is not None:
            # in float32, as the model multiplies them
            self.time_interval = float(per_second * torch.as_tensor(seconds, dtype=torch.float32).reshape(-1)[0])
        else:
            self.time_interval = 1.0
        return out["pixel_values_videos"].to(device=device, dtype=dtype)

    def default_image_size(self) -> tuple[int, int]:
        ip = self.processor.image_processor
        factor = int(ip.patch_size) * int(ip.merge_size)
        longest = (getattr(ip, "size", None) or {}).get("longest_edge") or getattr(ip, "max_pixels", None)
        side = DEFAULT_IMAGE_SIDE if longest is None else min(DEFAULT_IMAGE_SIDE, int(math.isqrt(int(longest))))
        side = max(factor, side // factor * factor)
        return (side, side)

    def preprocess(self, images: Sequence[Image.Image], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        out = self.processor.image_processor(images=[self.resize(im) for im in images], return_tensors="pt")
        grid = out["image_grid_thw"]
        if not bool((grid == grid[0]).all()):
            raise ValueError(f"images resized to {self.image_size} gave different grids: {grid.tolist()}")
        self.grid, self.video, self.time_interval = grid[0].clone(), False, 1.0
        return out["pixel_values"].to(device=device, dtype=dtype)

    @property
    def patches_per_image(self) -> int:
        if self.grid is None:
            raise RuntimeError("preprocess an image first")
        return int(self.grid.prod())

    @property
    def grid_hw(self) -> tuple[int, int]:
        """Height and width of the merged grid (image tokens per column and per row)."""
        if self.grid is None:
            raise RuntimeError("preprocess an image first")
        return int(self.grid[1]) // self.merge, int(self.grid[2]) // self.merge

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        n_images = pixel_values.shape[0] // self.patches_per_image
        grid = self.grid.view(1, 3).expand(n_images, 3).to(pixel_values.device)
        if self.video:
            out = self.model.get_video_features(pixel_values_videos=pixel_values, video_grid_thw=grid)
        else:
            out = self.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid)
        feats = getattr(out, "pooler_output", out)
        if isinstance(feats, (list, tuple)):
            return torch.stack(list(feats))
        return feats.view(n_images, -1, feats.shape[-1])

    @property
    def frame_groups(self) -> int:
        """Frame groups of the last preprocessed visual (1 for an image)."""
        return int(self.grid[0]) if self.video else 1

    def position_offset(self) -> int:
        h, w = self.grid_hw
        return max(h, w) - self.frame_groups * h * w

    def position_ids(self, positions: torch.Tensor, image_start: torch.Tensor) -> torch.Tensor:
        """Token k of a visual starting at s: (s + floor(t * interval), s + row, s + column) for its
        frame group t, row and column; text after it continues from s + max(rows, columns) (the
        installed transformers' ``get_rope_index``)."""
        h, w = self.grid_hw
        n = self.frame_groups * h * w
        start = image_start.view(-1, 1).to(positions.device)
        rel = positions - start
        has_image = start >= 0
        inside = has_image & (rel >= 0) & (rel < n)
        after = has_image & (rel >= n)
        text = torch.where(after, positions + (max(h, w) - n), positions)
        k = rel.clamp(min=0)
        group, k = k // (h * w), k % (h * w)
        interval = torch.tensor(self.time_interval, dtype=torch.float32, device=positions.device)
        temporal = start + (group.float() * interval).long() if self.video else start.expand_as(positions)
        t_pos = torch.where(inside, temporal, text)
        h_pos = torch.where(inside, start + k // w, text)
        w_pos = torch.where(inside, start + k % w, text)
        return torch.stack([t_pos, h_pos, w_pos])


class Qwen3VLFamily(Qwen2VLFamily):
    """Qwen3-VL: Qwen2-VL's image grid and 3-D rotary positions (interleaved inside the rotary embedding,
    the position ids are the same), plus DeepStack: the vision tower's features from some of its layers
    (``deepstack_visual_indexes``) are added to the language model's hidden states at the image tokens
    after its first decoder layers. :meth:`image_features` returns them stacked after the input features
    (U, n, 1 + D, hidden); :meth:`language_forward` passes them to the language model as its own forward
    does (``visual_pos_masks``, ``deepstack_visual_embeds``)."""

    name = "qwen3-vl"
    deepstack = True
    takes_video = False  # its processor writes a timestamp and a vision block per frame group: not yet

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        n_images = pixel_values.shape[0] // self.patches_per_image
        grid = self.grid.view(1, 3).expand(n_images, 3).to(pixel_values.device)
        out = self.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid)
        main = torch.stack(list(out.pooler_output))
        layers = [torch.stack(list(feats)) for feats in out.deepstack_features]
        return torch.stack([main, *layers], dim=2)

    def language_forward(self, embeds, attention_mask, position_ids, cache_kwargs, visual_mask, deepstack):
        return self.model.model.language_model(
            inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids,
            visual_pos_masks=visual_mask, deepstack_visual_embeds=deepstack, **cache_kwargs,
        )


class Idefics3Family(JudgeFamily):
    """Idefics3: the image is split into tiles (rows x columns of the processor's ``max_image_size``)
    plus the global image, each tile's features pixel-shuffled to ``image_seq_len`` image tokens; the
    placeholder becomes the processor's tile layout (``<fake_token_around_image><row_r_col_c>`` and image
    tokens per tile, ``<global-img>`` and image tokens for the whole image). Positions are 1-D."""

    name = "idefics3"

    def __init__(self, model: Any, processor: Any, image_size: tuple[int, int] | int | None = None):
        super().__init__(model, processor, image_size)
        self.expansion: list[int] | None = None

    def default_image_size(self) -> tuple[int, int]:
        ip = self.processor.image_processor
        side = int((getattr(ip, "size", None) or {}).get("longest_edge", DEFAULT_IMAGE_SIDE))
        return (side, side)

    def preprocess(self, images: Sequence[Image.Image], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        resized = [self.resize(im) for im in images]
        out = self.processor.image_processor(images=[[im] for im in resized], return_tensors="pt")
        if self.expansion is None:
            text = self.processor(text=[self.processor.image_token], images=[[resized[0]]], add_special_tokens=False)
            self.expansion = [int(t) for t in text["input_ids"][0]]
        return out["pixel_values"].to(device=device, dtype=dtype)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        n_images = pixel_values.shape[0]
        out = self.model.get_image_features(pixel_values=pixel_values)
        feats = getattr(out, "pooler_output", out)
        if isinstance(feats, (list, tuple)):
            feats = torch.cat([f.reshape(-1, f.shape[-1]) for f in feats])
        return feats.reshape(n_images, -1, feats.shape[-1])

    def image_expansion(self, image_token_id: int, num_image_tokens: int) -> list[int]:
        if self.expansion is None:
            raise RuntimeError("preprocess an image first")
        if sum(1 for t in self.expansion if t == image_token_id) != num_image_tokens:
            raise ValueError(f"the processor's image layout holds a different number of image tokens than the {num_image_tokens} features")
        return list(self.expansion)


class SmolVLMFamily(Idefics3Family):
    """SmolVLM: Idefics3's image splitting and tile layout through ``SmolVLMProcessor`` (its own image
    processor, the ``<row_r_col_c>`` / ``<global-img>`` layout the processor writes)."""

    name = "smolvlm"


class LlavaNextFamily(JudgeFamily):
    """LLaVA-NeXT and LLaVA-OneVision: any-resolution tiling. The image processor picks the grid of
    ``image_grid_pinpoints`` that fits the image best and cuts it into tiles of the vision tower's size
    plus the whole image resized; the model's ``get_image_features`` runs every tile, keeps the features
    of the part that is image (not padding) with an ``image_newline`` feature after each row, and puts
    the whole image's features first (``pack_image_features``). With every image resized to
    :attr:`image_size`, each gives the same number of features, and the placeholder becomes that many
    image tokens (what the processor counts from the image size). Positions are 1-D."""

    name = "llava-next"

    def __init__(self, model: Any, processor: Any, image_size: tuple[int, int] | int | None = None):
        super().__init__(model, processor, image_size)
        self.image_sizes: torch.Tensor | None = None

    def preprocess(self, images: Sequence[Image.Image], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        out = self.processor.image_processor(images=[self.resize(im) for im in images], return_tensors="pt")
        self.image_sizes = out["image_sizes"][0].clone()
        return out["pixel_values"].to(device=device, dtype=dtype)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if self.image_sizes is None:
            raise RuntimeError("preprocess an image first")
        n_images = pixel_values.shape[0]
        sizes = self.image_sizes.view(1, 2).expand(n_images, 2).to(pixel_values.device)
        out = self.model.get_image_features(pixel_values=pixel_values, image_sizes=sizes)
        feats = getattr(out, "pooler_output", out)
        if isinstance(feats, (list, tuple)):
            return torch.stack(list(feats))
        return feats.view(n_images, -1, feats.shape[-1])


class LlavaOnevisionFamily(LlavaNextFamily):
    """LLaVA-OneVision: LLaVA-NeXT's any-resolution tiling (the model reduces the feature grid of an
    image with more tiles than its ``vision_aspect_ratio`` allows, the processor counts the same).

    It takes videos: the frames go through the processor's video processor (each frame one tile), the
    model's ``get_video_features`` pools each frame's features 2x2 and puts one ``image_newline`` feature
    after the last frame; the template's one ``<video>`` placeholder becomes that many video tokens.
    Positions are 1-D, so a video prompt shares its prefix as an image prompt does."""

    name = "llava-onevision"
    takes_video = True

    def __init__(self, model: Any, processor: Any, image_size: tuple[int, int] | int | None = None):
        super().__init__(model, processor, image_size)
        self.video = False  # whether the last preprocess was of videos

    @property
    def video_token_id(self) -> int:
        return int(self.model.config.video_token_index)

    def preprocess(self, images: Sequence[Image.Image], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self.video = False
        return super().preprocess(images, device, dtype)

    def preprocess_videos(self, videos: Sequence[Sequence[Image.Image]], device: torch.device,
                          dtype: torch.dtype) -> torch.Tensor:
        """``pixel_values_videos`` (U, frames, 3, H, W) of videos (lists of frames, the same number each,
        resized to :attr:`image_size`) through the processor's video processor."""
        clips = self.resized_clips(videos)
        out = self.processor.video_processor(videos=clips, return_tensors="pt")
        self.video = True
        return out["pixel_values_videos"].to(device=device, dtype=dtype)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if not self.video:
            return super().image_features(pixel_values)
        config = self.model.config
        out = self.model.get_video_features(pixel_values_videos=pixel_values,
                                            vision_feature_layer=config.vision_feature_layer,
                                            vision_feature_select_strategy=config.vision_feature_select_strategy)
        feats = getattr(out, "pooler_output", out)
        return feats.view(pixel_values.shape[0], -1, feats.shape[-1])


def judge_family(model: Any, processor: Any, image_size: tuple[int, int] | int | None = None) -> JudgeFamily | None:
    """The :class:`JudgeFamily` of ``model`` (by ``config.model_type``), or None for LLaVA-1.5 (and any
    model built like it), whose path ``LocalJudge`` keeps as released. Raises ValueError for a known
    multimodal type that is not supported yet."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    name = FAMILIES.get(model_type) if model_type is not None else None
    if name is None:
        if model_type in UNSUPPORTED:
            raise ValueError(
                f"local judges of model_type {model_type!r} are not supported yet; supported: llava, "
                + ", ".join(sorted(FAMILIES))
            )
        return None
    return globals()[name](model, processor, image_size)


#: Image-text families transformers has that the local judges do not run yet (a clear error, not a
#: LLaVA path that fails somewhere inside).
UNSUPPORTED = frozenset(
    {"qwen3_vl_moe", "idefics2",
     "gemma3", "internvl", "mllama", "paligemma"}
)
