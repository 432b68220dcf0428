"""Prompt text for the VLM judges and the LLaVA v1 conversation template.

FLEUR and RefFLEUR prompts are the ones published with FLEUR (Lee et al., "FLEUR: An Explainable
Reference-Free Evaluation Metric for Image Captioning Using a Large Multimodal Model", ACL 2024) and
used by the authors' released code. The conversation follows LLaVA v1 (``conv_llava_v1``): the
system sentence, a space, then ``"USER: <msg> ASSISTANT:"`` turns, the assistant's finished answers
closed by ``</s>``.
"""

from __future__ import annotations

import functools

from collections.abc import Sequence

from .caller_text import Data, render

LLAVA_V1_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
LLAVA_V1_ROLES = ("USER", "ASSISTANT")
LLAVA_V1_SEP = " "
LLAVA_V1_SEP2 = "</s>"
IMAGE_PLACEHOLDER = "<image>"

FLEUR_PROMPT = (
    "Your task is to evaluate and rate the caption on a scale of 0.0 to 1.0 based on the given Grading "
    "Criteria. (Print Real Number Score ONLY)\n\nGrading Criteria:\n\n0.0: The caption does not describe "
    "the image at all.\n1.0: The caption accurately and clearly describes the image.\n\n"
    "Caption: {caption}\n\nScore(Choose a rating from 0.0 to 1.0):"
)

REF_FLEUR_PROMPT = (
    "Your task is to evaluate and rate the candidate caption on a scale of 0.0 to 1.0 based on the given "
    "Grading Criteria. (Print Real Number Score ONLY)\n\nGrading Criteria:\n\n0.0: The caption does not "
    "describe the image at all.\n1.0: The caption accurately and clearly describes the image.\n\n"
    "Reference Captions: {references}\n\nCandidate Caption: {caption}\n\nScore(Choose a rating from 0.0 to 1.0):"
)

FLEUR_EXPLAIN_PROMPT = "Why? Tell me the reason."

#: A Jinja chat template that renders a conversation exactly as :func:`llava_v1_conversation` does (BOS,
#: system sentence, ``"USER: <image>\\n{message} "``, ``"ASSISTANT: {answer}</s>"``, and a final
#: ``"ASSISTANT:"``), for servers that accept a per-request template (vLLM's ``chat_template`` field):
#: their own LLaVA template (llava-hf's has no system sentence) would change the prompt FLEUR is defined
#: on. Content may be a string or OpenAI parts (image parts, in any position, become the placeholder
#: before the text, as in LLaVA's format).
LLAVA_V1_CHAT_TEMPLATE = (
    "{{ bos_token }}" + LLAVA_V1_SYSTEM + LLAVA_V1_SEP
    + "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] in ('image', 'image_url') %}" + IMAGE_PLACEHOLDER + "\n{% endif %}{% endfor %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}" + LLAVA_V1_SEP
    + "{% elif message['role'] == 'assistant' %}ASSISTANT: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}" + LLAVA_V1_SEP2
    + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def render_chat_template(
    template: str, messages: Sequence[dict], bos_token: str = "<s>", eos_token: str = "</s>"
) -> str:
    """``template`` rendered for OpenAI-style ``messages`` with a generation prompt, as
    ``transformers``' ``apply_chat_template`` and vLLM render chat templates (sandboxed Jinja,
    ``trim_blocks`` and ``lstrip_blocks``). Returns the prompt text (special tokens as text)."""
    return _compiled(template).render(
        messages=list(messages), add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
    )


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    """``template`` compiled once (a sandboxed Jinja environment; compiling costs far more than rendering)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)


def fleur_prompt(caption: str, references: Sequence[str] | None = None) -> str:
    """The FLEUR user message for ``caption``; the RefFLEUR one when ``references`` are given.

    References are joined by newlines, as in the released ``reffleur.py``.
    """
    if references is None:
        return FLEUR_PROMPT.format(caption=caption)
    return REF_FLEUR_PROMPT.format(caption=caption, references="\n".join(references))


def llava_v1_conversation(
    turns: Sequence[tuple[str, str | None]],
    system: str = LLAVA_V1_SYSTEM,
    image_placeholder: str | None = IMAGE_PLACEHOLDER,
) -> str:
    """Render ``turns`` = [(user message, assistant answer or None), ...] in the LLaVA v1 format.

    The image placeholder and a newline go before the first user message (as LLaVA's CLI and the FLEUR
    code do); ``image_placeholder=None`` renders a text-only conversation. Every turn but the last must
    have an answer; a last answer of None ends the prompt with ``"ASSISTANT:"`` (nothing after it), so
    the model writes the next answer. Returns the prompt string (special tokens as text, e.g. ``</s>``).
    """
    return render(llava_v1_parts(turns, system, image_placeholder))


def llava_v1_parts(
    turns: Sequence[tuple[str, str | None]],
    system: str = LLAVA_V1_SYSTEM,
    image_placeholder: str | None = IMAGE_PLACEHOLDER,
) -> list[str | Data]:
    """:func:`llava_v1_conversation` as prompt parts: the template (system sentence, roles, image
    placeholder, ``</s>``) as ``str``, every message and answer as :class:`~capreward.judges.caller_text.Data`
    (a local judge encodes them without special tokens)."""
    if not turns:
        raise ValueError("a conversation needs at least one user turn")
    user, assistant = LLAVA_V1_ROLES
    parts: list[str | Data] = [system + LLAVA_V1_SEP]
    for i, (message, answer) in enumerate(turns):
        head = f"{image_placeholder}\n" if i == 0 and image_placeholder is not None else ""
        parts += [f"{user}: {head}", Data(message), LLAVA_V1_SEP]
        if answer is None:
            if i != len(turns) - 1:
                raise ValueError(f"turn {i} has no answer but is not the last turn")
            parts.append(f"{assistant}:")
        else:
            parts += [f"{assistant}: ", Data(answer), LLAVA_V1_SEP2]
    return parts
