"""Tiny random judges of the current VLM families, built offline from their configs, for tests.

Each builder returns ``(model, processor)``: the family's own ``...ForConditionalGeneration`` with seeded
random weights and the family's real processor class around an in-memory tokenizer (the words of the
judge prompts as whole tokens, digits always single tokens, the family's special tokens) and the
family's released chat template. Nothing is downloaded.

- :func:`build_tiny_qwen2_vl`: Qwen2-VL, Qwen2.5-VL and Qwen3-VL (``Qwen2VLForConditionalGeneration`` /
  ``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` and their processors: image
  grid ``image_grid_thw``, 3-D rotary positions, the ChatML template with ``<|image_pad|>``; Qwen3-VL's
  DeepStack features).
- :func:`build_tiny_idefics3`: Idefics3 (``Idefics3ForConditionalGeneration``, ``Idefics3Processor``:
  image splitting into tiles plus the global image, ``<row_r_col_c>`` tile tags).
- :func:`build_tiny_smolvlm`: SmolVLM (``SmolVLMForConditionalGeneration``, ``SmolVLMProcessor``: Idefics3's
  splitting through SmolVLM's own classes).
- :func:`build_tiny_llava_next`: LLaVA-NeXT and LLaVA-OneVision (any-resolution tiling over
  ``image_grid_pinpoints``, ``image_newline`` features, the whole image's features first).

The weights are random: what the judges answer is noise, which is what the batched-vs-per-sample checks
need (any difference in positions, image tokens or cache shows up in the logits).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import torch

from ..judges.vlm_prompts import prompt_words
from .tiny_llava import PROMPT_WORDS, FLEUR_TASK_WORDS, unigram_tokenizer

#: Qwen2-VL's released chat template (Qwen/Qwen2-VL-*-Instruct chat_template.json).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

#: Qwen3-VL-Instruct's chat template without its tool-calling branches (Qwen/Qwen3-VL-*-Instruct
#: chat_template.json): no default system turn, images as <|vision_start|><|image_pad|><|vision_end|>.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' "
    "or 'image' in content or 'image_url' in content %}<|vision_start|><|image_pad|><|vision_end|>{% elif "
    "content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' "
    "in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

QWEN2_VL_SPECIAL = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>",
)

#: Every word of the FLEUR, VisCE² and G-VEval prompts and of the toy task: whole tokens.
JUDGE_WORDS: tuple[str, ...] = tuple(dict.fromkeys(PROMPT_WORDS + tuple(prompt_words()) + FLEUR_TASK_WORDS))


def build_chatml_tokenizer(special: Sequence[str], words: Sequence[str] = JUDGE_WORDS, eos: str = "<|im_end|>",
                           pad: str = "<|endoftext|>") -> Any:
    """A byte-level-free, Qwen-style fast tokenizer built in memory: no BOS, ``special`` tokens first
    (added, special), then the printable ASCII characters, a space-marker ``Ġ`` piece per word and the
    words. Digits are always single tokens (as Qwen2's tokenizer splits numbers). Returns a
    ``PreTrainedTokenizerFast`` padding on the left."""
    from tokenizers import AddedToken, decoders
    from transformers import PreTrainedTokenizerFast

    tok = unigram_tokenizer(("<unk>",), words, prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        pad_token=pad,
        unk_token="<unk>",
        padding_side="left",
        model_max_length=4096,
        model_input_names=["input_ids", "attention_mask"],
    )


def _seeded(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` with weights drawn from ``seed`` (the caller's RNG untouched)."""
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return model_class(config)


def _finish(model: Any, tok: Any, eos: Sequence[str], pad: str, answer_bias: float | None) -> Any:
    """Scale the digit, "$" and first end-of-turn output rows by ``answer_bias`` (see
    :func:`build_tiny_qwen2_vl`) and set the generation config's end, pad and (no) BOS tokens."""
    eos_ids = [tok.convert_tokens_to_ids(t) for t in eos]
    if answer_bias is not None:
        rows = [tok.convert_tokens_to_ids(str(d)) for d in range(10)] + [tok.convert_tokens_to_ids("$"), eos_ids[0]]
        with torch.no_grad():
            model.get_output_embeddings().weight[rows] *= float(answer_bias)
    model.generation_config.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    model.generation_config.pad_token_id = tok.convert_tokens_to_ids(pad)
    model.generation_config.bos_token_id = None
    return model.float().eval()


def build_tiny_qwen2_vl(
    seed: int = 0, image_size: int = 32, patch_size: int = 4, answer_bias: float | None = None, version: str = "2"
) -> tuple[Any, Any]:
    """``(Qwen2VLForConditionalGeneration, Qwen2VLProcessor)``: 2 text layers of width 64 (head dim 16,
    M-RoPE sections 2/3/3), a 2-block vision tower with ``patch_size`` patches merged 2x2, random weights
    from ``seed``; the processor's image processor resizes to multiples of ``2 * patch_size`` within
    ``image_size``² pixels. ``answer_bias``: scale the output rows of the digits, "$" and the end of turn
    by this factor, so that the random model answers with numbers (input-dependent ones) and ends them.
    ``version="2.5"``: Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``, ``Qwen2_5_VLProcessor``, a
    windowed vision tower). ``version="3"``: Qwen3-VL (``Qwen3VLForConditionalGeneration``,
    ``Qwen3VLProcessor`` with its ``Qwen3VLVideoProcessor``, learned vision position embeddings, DeepStack
    features from both vision blocks, interleaved M-RoPE, Qwen3-VL-Instruct's template). Nothing is
    downloaded."""
    import transformers
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    if version not in ("2", "2.5", "3"):
        raise ValueError(f"version must be '2', '2.5' or '3', got {version!r}")
    prefix = {"2": "Qwen2VL", "2.5": "Qwen2_5_VL", "3": "Qwen3VL"}[version]
    config_class = getattr(transformers, f"{prefix}Config")
    model_class = getattr(transformers, f"{prefix}ForConditionalGeneration")
    processor_class = getattr(transformers, f"{prefix}Processor")

    tok = build_chatml_tokenizer(QWEN2_VL_SPECIAL)
    factor = 2 * patch_size
    pixels = {"shortest_edge": factor * factor, "longest_edge": image_size * image_size}
    image_processor = Qwen2VLImageProcessor(size=pixels, patch_size=patch_size, merge_size=2, temporal_patch_size=2)
    video_class = Qwen2VLVideoProcessor if version != "3" else transformers.Qwen3VLVideoProcessor
    video_processor = video_class(size=pixels, patch_size=patch_size, merge_size=2, temporal_patch_size=2)
    processor = processor_class(image_processor=image_processor, tokenizer=tok, video_processor=video_processor,
                                 chat_template=QWEN2_VL_CHAT_TEMPLATE if version != "3" else QWEN3_VL_CHAT_TEMPLATE)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN2_VL_SPECIAL}
    vision: dict[str, Any]
    if version == "2":
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=patch_size,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    elif version == "2.5":
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2,
                      patch_size=patch_size, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                      window_size=4 * patch_size, fullatt_block_indexes=[1],
                      # 24 temporal positions a second: frame groups of 2 frames at the processor's 24 fps
                      # for frames without metadata are 2 positions apart (the video tests see the spacing)
                      tokens_per_second=24)
    else:  # a learned position grid of (image_size / patch_size)² entries, deepstack after both blocks
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2,
                      patch_size=patch_size, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                      num_position_embeddings=(image_size // patch_size) ** 2, deepstack_visual_indexes=[0, 1])
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    if version == "3":
        rope["mrope_interleaved"] = True
    config = config_class(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, head_dim=16,
            rope_parameters=rope,
            bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    model = _seeded(model_class, config, seed)
    return _finish(model, tok, ["<|im_end|>", "<|endoftext|>"], "<|endoftext|>", answer_bias), processor


#: Idefics3's and SmolVLM's released chat template (transformers' Idefics3 processor tests, SmolVLM).
IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == "
    "'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' "
    "%}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

IDEFICS3_SPECIAL = (
    "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>", "<pad>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
)


def build_tiny_idefics3(seed: int = 0, tile: int = 16, patch_size: int = 4, splits: int = 2,
                        answer_bias: float | None = None) -> tuple[Any, Any]:
    """``(Idefics3ForConditionalGeneration, Idefics3Processor)``: a 2-layer SigLIP-style vision tower on
    ``tile``-pixel tiles of ``patch_size`` patches (pixel shuffle by 2: ``(tile/patch)²/4`` image tokens
    per tile), a 2-layer LLaMA of width 64; the image processor splits an image of ``splits * tile``
    pixels a side into ``splits``² tiles plus the global image (Idefics3's image splitting).
    ``answer_bias`` as in :func:`build_tiny_qwen2_vl`."""
    return _build_idefics3_like("Idefics3", IDEFICS3_SPECIAL, seed, tile, patch_size, splits, answer_bias)


SMOLVLM_SPECIAL = IDEFICS3_SPECIAL + ("<video>",)


def build_tiny_smolvlm(seed: int = 0, tile: int = 16, patch_size: int = 4, splits: int = 2,
                       answer_bias: float | None = None) -> tuple[Any, Any]:
    """``(SmolVLMForConditionalGeneration, SmolVLMProcessor)``: as :func:`build_tiny_idefics3` (tiles of
    ``tile`` pixels, ``splits``² tiles plus the global image, pixel shuffle by 2) with SmolVLM's own
    classes: ``SmolVLMImageProcessor``, ``SmolVLMVideoProcessor`` and the processor (which needs the
    ``num2words`` package). Nothing is downloaded."""
    return _build_idefics3_like("SmolVLM", SMOLVLM_SPECIAL, seed, tile, patch_size, splits, answer_bias)


def _build_idefics3_like(prefix: str, special: Sequence[str], seed: int, tile: int, patch_size: int, splits: int,
                         answer_bias: float | None) -> tuple[Any, Any]:
    """The tiny ``Idefics3`` or ``SmolVLM`` (``prefix``) model and processor of the builders above; SmolVLM's
    processor also takes its video processor."""
    import transformers

    tok = build_chatml_tokenizer(special, eos="<end_of_utterance>", pad="<pad>")
    image_processor = getattr(transformers, f"{prefix}ImageProcessor")(
        do_image_splitting=True, max_image_size={"longest_edge": tile}, size={"longest_edge": splits * tile}
    )
    videos = {}
    if prefix == "SmolVLM":
        videos["video_processor"] = transformers.SmolVLMVideoProcessor(
            max_image_size={"longest_edge": tile}, size={"longest_edge": splits * tile})
    processor = getattr(transformers, f"{prefix}Processor")(
        image_processor=image_processor, tokenizer=tok, **videos, image_seq_len=(tile // patch_size) ** 2 // 4,
        chat_template=IDEFICS3_CHAT_TEMPLATE)
    ids = {t: tok.convert_tokens_to_ids(t) for t in special}
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=tile, patch_size=patch_size),
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=None, eos_token_id=ids["<end_of_utterance>"],
                         pad_token_id=ids["<pad>"]),
        image_token_id=ids["<image>"], scale_factor=2,
    )
    model = _seeded(getattr(transformers, f"{prefix}ForConditionalGeneration"), config, seed)
    return _finish(model, tok, ["<end_of_utterance>"], "<pad>", answer_bias), processor


#: LLaVA-NeXT (Mistral) template: llava-hf/llava-v1.6-mistral-7b-hf's chat template.
LLAVA_NEXT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<<SYS>>\\n' + message['content'][0]['text'] "
    "+ '\\n<</SYS>>\\n\\n' }}{% elif message['role'] == 'user' %}{{ '[INST] ' }}{% for content in message['content'] "
    "| selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}{{' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' ' + message['content'][0]['text'] + '</s> '}}{% endif %}{% endfor %}"
)

#: LLaVA-OneVision (Qwen2) template: llava-hf/llava-onevision-qwen2-*-ov-hf's chat template.
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'text') %}{{ '\\n' + content['text'] }}{% endfor %}{{'<|im_end|>'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_llava_next(seed: int = 0, tile: int = 16, patch_size: int = 4, onevision: bool = False,
                          answer_bias: float | None = None) -> tuple[Any, Any]:
    """``(LlavaNextForConditionalGeneration, LlavaNextProcessor)``: a 2-layer CLIP vision tower on
    ``tile``-pixel tiles of ``patch_size`` patches, any-resolution grids of 1x2, 2x1 and 2x2 tiles
    (``image_grid_pinpoints``), a 2-layer LLaMA of width 64, the Mistral chat template.
    ``onevision=True``: LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``,
    ``LlavaOnevisionProcessor`` with its image and video processors, a SigLIP tower, a Qwen2 language
    model, the full-feature strategy, the ChatML-style template). ``answer_bias`` as in
    :func:`build_tiny_qwen2_vl`. Nothing is downloaded."""
    import transformers

    pinpoints = [[tile, 2 * tile], [2 * tile, tile], [2 * tile, 2 * tile]]
    per_tile = (tile // patch_size) ** 2
    if onevision:
        special: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")
        tok = build_chatml_tokenizer(special, eos="<|im_end|>", pad="<|endoftext|>")
        image_processor = transformers.LlavaOnevisionImageProcessor(
            size={"height": tile, "width": tile}, image_grid_pinpoints=pinpoints)
        video_processor = transformers.LlavaOnevisionVideoProcessor(size={"height": tile, "width": tile})
        processor = transformers.LlavaOnevisionProcessor(
            image_processor=image_processor, tokenizer=tok, video_processor=video_processor, num_image_tokens=per_tile,
            vision_feature_select_strategy="full", chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE)
        ids = {t: tok.convert_tokens_to_ids(t) for t in special}
        config = transformers.LlavaOnevisionConfig(
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=2, image_size=tile, patch_size=patch_size,
                               vision_use_head=False),
            text_config=dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=4096, bos_token_id=None, eos_token_id=ids["<|im_end|>"],
                             pad_token_id=ids["<|endoftext|>"]),
            image_token_index=ids["<image>"], video_token_index=ids["<video>"], image_grid_pinpoints=pinpoints,
            vision_feature_select_strategy="full", vision_feature_layer=-1,
        )
        model = _seeded(transformers.LlavaOnevisionForConditionalGeneration, config, seed)
        return _finish(model, tok, ["<|im_end|>", "<|endoftext|>"], "<|endoftext|>", answer_bias), processor
    special = ("</s>", "<image>", "<pad>")
    tok = build_chatml_tokenizer(special, eos="</s>", pad="<pad>")
    image_processor = transformers.LlavaNextImageProcessor(
        size={"shortest_edge": tile}, crop_size={"height": tile, "width": tile}, image_grid_pinpoints=pinpoints)
    processor = transformers.LlavaNextProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=patch_size, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=LLAVA_NEXT_CHAT_TEMPLATE)
    ids = {t: tok.convert_tokens_to_ids(t) for t in special}
    config = transformers.LlavaNextConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=tile, patch_size=patch_size, projection_dim=32),
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=None, eos_token_id=ids["</s>"],
                         pad_token_id=ids["<pad>"]),
        image_token_index=ids["<image>"], image_grid_pinpoints=pinpoints, vision_feature_select_strategy="default",
        vision_feature_layer=-1, image_seq_length=per_tile,
    )
    model = _seeded(transformers.LlavaNextForConditionalGeneration, config, seed)
    return _finish(model, tok, ["</s>"], "<pad>", answer_bias), processor
