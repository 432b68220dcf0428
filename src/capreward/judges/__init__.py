"""VLM judges: local transformers models (LLaVA) that answer prompts about images.

The local backend exposes greedy text, token distributions at chosen steps and cheap continuation from
a cached, shared prefix; the LLM-judged metrics (FLEUR, VisCE², G-VEval) build on it. Its API is the
contract between them, kept stable:

- ``LocalJudge.conversation(turns)`` / ``encode_prompts(prompts, n_image_tokens)``: LLaVA v1 text -> ids;
- ``preprocess(images)`` -> ``pixel_values``; ``image_features(pixel_values)`` (differentiable);
- ``start(prompt_ids, features, image_index, share_prefix=True)`` -> :class:`DecodeState` (one batched
  prefill, the common prefix run once per distinct image);
- ``step(state, tokens)`` (in place), ``select(state, rows)`` (branch), ``greedy(state, budget)`` ->
  :class:`GreedyOutput` with the logits of every step (or of the steps writing chosen tokens), ended
  rows dropped from the batch as it goes;
- chat backends for VisCE² and G-VEval: :class:`LocalChatJudge` (local LLaVA, exact score distributions),
  :class:`EngineJudge` (the same judge inside vLLM's or SGLang's offline engine, exact too),
  :class:`OpenAIJudge` (any OpenAI-compatible server), :class:`SGLangJudge` (SGLang's ``/generate``) and
  :class:`VLLMJudge` (vLLM), all speaking :class:`JudgeBackend`; the last two also score chosen next
  tokens exactly (:class:`NextTokenScorer`), one request per caption (:class:`NextTokenServerJudge`);
  :class:`LocalTextJudge`, a text-only causal LM (the QA-utility reward's answerer);
- ``teacher_forcing_inputs(...)`` + ``logits_at(inputs, features, image_index, text_embeds=None)``: one
  differentiable pass returning the logits at chosen answer steps.
"""

from .images import mean_background, pad_to_square
from ..default_models import DEFAULT_LLAVA
from .loading import JudgeLoadError, load_llava, resolve_device, resolve_dtype
from .local import DecodeState, GreedyOutput, LocalJudge, TeacherForcing, common_prefix_length
from .local_chat import LocalChatJudge
from .local_text import LocalTextJudge
from .protocol import (
    ChatRequest,
    ChatResponse,
    ChatTurn,
    JudgeBackend,
    MalformedAnswer,
    NextTokenAnswer,
    NextTokenQuery,
    NextTokenScorer,
    TokenLogprob,
    answer_problem,
    assistant_turn,
    system_turn,
    user_turn,
)
from .remote import NextTokenServerJudge, OpenAIJudge
from .sglang import SGLangJudge
from .vllm import VLLMJudge
from .prompts import (
    FLEUR_EXPLAIN_PROMPT,
    FLEUR_PROMPT,
    LLAVA_V1_CHAT_TEMPLATE,
    LLAVA_V1_SYSTEM,
    REF_FLEUR_PROMPT,
    fleur_prompt,
    llava_v1_conversation,
)

#: Documented in the API reference (docs/api/judges.md). The engine's parts (``DecodeState``,
#: ``GreedyOutput``, ``TeacherForcing``, the prompts, ``load_llava``...) still import from here.
__all__ = ["ChatRequest", "ChatResponse", "ChatTurn", "EngineJudge", "JudgeBackend", "JudgeLoadError", "LocalChatJudge",
           "LocalJudge", "LocalTextJudge", "MalformedAnswer", "NextTokenAnswer", "NextTokenQuery", "NextTokenScorer",
           "NextTokenServerJudge", "OpenAIJudge", "SGLangJudge", "TokenLogprob", "VLLMJudge", "answer_problem",
           "assistant_turn", "system_turn", "user_turn"]


def __getattr__(name: str):
    """``EngineJudge`` (vLLM's or SGLang's engine in process) is loaded on first use: importing the judges
    loads no engine module."""
    if name == "EngineJudge":
        from .engines import EngineJudge

        return EngineJudge
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
