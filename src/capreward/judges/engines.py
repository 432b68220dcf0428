"""Local judges on the inference engines users run: vLLM's offline ``LLM`` and SGLang's ``Engine``, in process.

:class:`EngineJudge` is a :class:`~capreward.judges.local_chat.LocalChatJudge` whose model runs inside an
engine instead of transformers: the same conversations, rendered by capreward (the prompt's structure
from the template, every caller text encoded as data, never as special tokens) and handed to the engine
as **token ids** with the image, and the same exact readings:

- :meth:`EngineJudge.generate`: the answers, each token's log-probability and its top alternatives;
- :meth:`EngineJudge.integer_distributions`: the exact distribution over "0".."100" at a score
  position, from the probabilities of the ten digit tokens at every node of the digit tree (102 nodes a
  row: vLLM's ``SamplingParams(logprob_token_ids=...)``, SGLang's ``token_ids_logprob``), all nodes of a
  batch in one engine call (the engines' prefix caches run the shared prompt once);
- :meth:`EngineJudge.token_distributions`: the probabilities of given tokens right after a prompt (a
  yes/no reading).

The engine adapters (:class:`VLLMEngine`, :class:`SGLangEngine`) speak each engine's documented offline API
and nothing else; :meth:`EngineJudge.from_engine` picks one from the engine object's package. The image an
engine gets is the one capreward's own path would use (LLaVA-1.5: padded to a square in the processor's
mean colour, as released, which the engines' processors do not do; other families: resized to the
family's image size), so the engine's processor sees what capreward's does.

The text side is the judge's (:class:`~capreward.judges.local.LocalJudge`); built from a model directory
it needs no weights (the model is built on PyTorch's meta device: config, tokenizer and template only).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, cast
from collections.abc import Sequence

import numpy as np
from PIL import Image

from ..errors import SampleError
from ..metrics.gveval import NUM_SCORES, digit_tree_distribution
from .decoding import DecodeOutput
from .images import mean_background, pad_to_square
from .local import LocalJudge
from .local_chat import LocalChatJudge, _row
from .protocol import ChatRequest, ChatResponse

log = logging.getLogger(__name__)


@dataclass
class EngineRun:
    """One request to an engine: ``prompt_ids`` (one placeholder token per image: the engine expands it),
    the ``image``, a token budget, a temperature (0: greedy), a seed, ``top_logprobs`` alternatives per
    generated token and ``token_ids`` whose log-probabilities are wanted at every generated position."""

    prompt_ids: list[int]
    image: Image.Image | None
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    top_logprobs: int = 0
    token_ids: list[int] | None = None


@dataclass
class EngineAnswer:
    """An engine's answer to an :class:`EngineRun`: the generated ``token_ids`` (an end-of-sequence token
    included if the engine wrote one), each one's log-probability, the top alternatives of each position
    [(id, logprob), ...] and, per position, {id: logprob} of the run's ``token_ids``."""

    token_ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    token_logprobs: list[dict[int, float]] = field(default_factory=list)
    error: str | None = None


def _fields(cls: Any) -> set[str]:
    """The constructor fields of a class: msgspec structs (vLLM's ``SamplingParams``), dataclasses, or its
    signature."""
    names = getattr(cls, "__struct_fields__", None)
    if names:
        return set(names)
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


class VLLMEngine:
    """vLLM's offline engine: ``LLM.generate(prompts, sampling_params, use_tqdm=False)`` with token-id
    prompts ``{"prompt_token_ids": ids, "multi_modal_data": {"image": image}}`` and one
    ``SamplingParams(n=1, temperature=, max_tokens=, seed=, logprobs=, logprob_token_ids=, detokenize=False)``
    per prompt; answers are read from ``RequestOutput.outputs[0]`` (``token_ids``, ``logprobs``: a dict
    {token id: ``Logprob(logprob, rank, decoded_token)``} per generated token, the sampled token included).

    Args:
        llm: a ``vllm.LLM``.
        sampling_params_class: the ``SamplingParams`` class (default: ``vllm.SamplingParams``).

    Log-probabilities of given tokens use ``logprob_token_ids`` where the installed vLLM has it, else
    ``logprobs=-1`` (every token; the ``LLM`` must be built with ``max_logprobs=-1``).

    Examples:
        >>> from capreward.judges.engines import VLLMEngine
        >>> VLLMEngine.name
        'vllm'
    """

    name = "vllm"

    def __init__(self, llm: Any, sampling_params_class: Any = None):
        if sampling_params_class is None:
            from vllm import SamplingParams

            sampling_params_class = SamplingParams  # the engine's own class
        self.llm = llm
        self.sampling_params_class = sampling_params_class
        self.token_ids_field = "logprob_token_ids" in _fields(sampling_params_class)

    def params(self, run: EngineRun) -> Any:
        kwargs: dict[str, Any] = {"n": 1, "temperature": float(run.temperature), "max_tokens": int(run.max_tokens),
                                  "detokenize": False}
        if run.seed is not None and run.temperature > 0:
            kwargs["seed"] = int(run.seed)
        if run.token_ids:
            if self.token_ids_field:
                kwargs["logprob_token_ids"] = list(run.token_ids)
                kwargs["logprobs"] = max(len(run.token_ids), int(run.top_logprobs))
            else:
                kwargs["logprobs"] = -1
        else:  # 0: the sampled token's own log-probability only
            kwargs["logprobs"] = int(run.top_logprobs)
        return self.sampling_params_class(**kwargs)

    def run(self, runs: Sequence[EngineRun]) -> list[EngineAnswer]:
        """Every run in one ``LLM.generate`` call; answers in order."""
        prompts = []
        for r in runs:
            prompt: dict[str, Any] = {"prompt_token_ids": list(r.prompt_ids)}
            if r.image is not None:
                prompt["multi_modal_data"] = {"image": r.image}
            prompts.append(prompt)
        outputs = self.llm.generate(prompts, [self.params(r) for r in runs], use_tqdm=False)
        answers = []
        for run, output in zip(runs, outputs):
            completion = output.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            steps = list(completion.logprobs or [])
            logprobs, top, wanted = [], [], []
            for token, entries in zip(ids, steps):
                entries = entries or {}
                chosen = entries.get(token)
                logprobs.append(float(chosen.logprob) if chosen is not None else math.nan)
                ranked = sorted(((int(t), float(lp.logprob)) for t, lp in entries.items()), key=lambda x: -x[1])
                top.append(ranked[: run.top_logprobs])
                if run.token_ids:
                    wanted.append({int(t): float(entries[t].logprob) for t in run.token_ids if t in entries})
            answers.append(EngineAnswer(ids, logprobs, top, wanted))
        return answers


class SGLangEngine:
    """SGLang's offline engine: ``Engine.generate(input_ids=[...], image_data=[...], sampling_params=[...],
    return_logprob=True, logprob_start_len=-1, top_logprobs_num=[...], token_ids_logprob=[...])`` with one
    ``{"max_new_tokens", "temperature"}`` dict per request (``"sampling_seed"`` when sampling); answers are
    read from each result's ``meta_info``: ``output_token_logprobs`` [(logprob, id, text)],
    ``output_top_logprobs`` and ``output_token_ids_logprobs`` (a list of such tuples per position).

    Args:
        engine: a ``sglang.Engine``.

    Examples:
        >>> from capreward.judges.engines import SGLangEngine
        >>> SGLangEngine.name
        'sglang'
    """

    name = "sglang"

    def __init__(self, engine: Any):
        self.engine = engine

    def run(self, runs: Sequence[EngineRun]) -> list[EngineAnswer]:
        """Every run in one ``Engine.generate`` call; answers in order."""
        params = []
        for r in runs:
            p: dict[str, Any] = {"max_new_tokens": int(r.max_tokens), "temperature": float(r.temperature)}
            if r.seed is not None and r.temperature > 0:
                p["sampling_seed"] = int(r.seed)
            params.append(p)
        images = [r.image for r in runs]
        results = self.engine.generate(
            input_ids=[list(r.prompt_ids) for r in runs],
            image_data=images if any(im is not None for im in images) else None,
            sampling_params=params,
            return_logprob=True,
            logprob_start_len=-1,
            top_logprobs_num=[int(r.top_logprobs) for r in runs],
            token_ids_logprob=[list(r.token_ids) if r.token_ids else None for r in runs]
            if any(r.token_ids for r in runs) else None,
        )
        if isinstance(results, dict):
            results = [results]
        answers = []
        for run, result in zip(runs, results):
            meta = result.get("meta_info", {})
            chosen = meta.get("output_token_logprobs") or []
            ids = [int(t) for _, t, *_ in chosen]
            logprobs = [float(lp) if lp is not None else math.nan for lp, *_ in chosen]
            top = [[(int(t), float(lp)) for lp, t, *_ in step][: run.top_logprobs] for step in (meta.get("output_top_logprobs") or [])]
            wanted = [{int(t): float(lp) for lp, t, *_ in step} for step in (meta.get("output_token_ids_logprobs") or [])]
            answers.append(EngineAnswer(ids, logprobs, top, wanted))
        return answers


def text_front_end(model: Any, processor: Any = None, **kwargs: Any) -> LocalJudge:
    """The judge's text side for an engine: a :class:`LocalJudge` given as is, a ``(model, processor)`` pair,
    or a model directory / hub name whose config and processor are loaded and whose model is built on the
    meta device (no weights are read or allocated)."""
    if isinstance(model, LocalJudge):
        return model
    if isinstance(model, (tuple, list)) or processor is not None:
        return LocalJudge(model, processor, **kwargs)
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, GenerationConfig, LlavaForConditionalGeneration

    source = os.fspath(model)
    config = AutoConfig.from_pretrained(source)
    processor = AutoProcessor.from_pretrained(source)
    with torch.device("meta"):
        if config.model_type == "llava":
            meta = LlavaForConditionalGeneration(config)
        else:
            meta = AutoModelForImageTextToText.from_config(config)
    try:
        meta.generation_config = GenerationConfig.from_pretrained(source)
    except OSError:
        pass
    return LocalJudge((meta, processor), **kwargs)


class EngineJudge(LocalChatJudge):
    """A local judge running in an in-process inference engine (module docstring): a `JudgeBackend` with the
    exact readings of :class:`~capreward.judges.local_chat.LocalChatJudge`.

    Args:
        engine: a ``vllm.LLM``, a ``sglang.Engine``, or an adapter (:class:`VLLMEngine`, :class:`SGLangEngine`).
        model: the judge's text side: a model directory or hub name (its config, tokenizer and template;
            no weights), a ``(model, processor)`` pair or a :class:`~capreward.judges.local.LocalJudge`.
        batch_size: requests per engine call (the digit tree sends 102 a row: about 20 rows a call by default).
        seed: the base seed of sampled answers.
        name: the model identifier used in cache keys (default: ``engine:<engine>:<model>``).

    Raises:
        TypeError: an engine object that is neither vLLM's nor SGLang's, nor an adapter.

    Requests carry one image, in the first user turn (videos: an error response); ``stop`` strings cut
    the answer as the local judge cuts it.

    Examples:
        >>> from capreward.judges.engines import EngineJudge
        >>> EngineJudge.adapter_for(object())
        Traceback (most recent call last):
        ...
        TypeError: an in-process engine must be a vllm.LLM, a sglang.Engine or an adapter (VLLMEngine, SGLangEngine); got object
    """

    def __init__(self, engine: Any, model: Any, *, batch_size: int = 2048, seed: int = 0, name: str | None = None):
        self.engine = self.adapter_for(engine)
        judge = text_front_end(model)
        super().__init__(judge, batch_size=batch_size, seed=seed, name=name)
        config_name = getattr(judge.model.config, "_name_or_path", "") or "judge"
        self.name = name or f"engine:{self.engine.name}:{config_name}"

    @staticmethod
    def adapter_for(engine: Any) -> Any:
        """The adapter of an engine object (by the package that defines its class), or the adapter given.

        Args:
            engine: a ``vllm.LLM``, a ``sglang.Engine`` or an adapter.

        Returns:
            A :class:`VLLMEngine` or :class:`SGLangEngine` (or the adapter given).

        Raises:
            TypeError: anything else.
        """
        if isinstance(engine, (VLLMEngine, SGLangEngine)) or callable(getattr(engine, "run", None)) and hasattr(engine, "name"):
            return engine
        package = type(engine).__module__.split(".")[0]
        if package == "vllm":
            return VLLMEngine(engine)
        if package == "sglang":
            return SGLangEngine(engine)
        raise TypeError("an in-process engine must be a vllm.LLM, a sglang.Engine or an adapter (VLLMEngine, SGLangEngine); "
                        f"got {type(engine).__name__}")

    # ------------------------------------------------------------------------------------ requests
    def engine_image(self, image: Image.Image) -> Image.Image:
        """The image the engine is given: what capreward's own preprocessing starts from (LLaVA-1.5:
        padded to a square in the mean colour; another family: resized to its image size)."""
        judge = self.judge
        if judge.family is not None:
            return judge.family.resize(image)
        if judge.pad_to_square:
            return pad_to_square(image.convert("RGB"), mean_background(judge.processor.image_processor.image_mean))
        return image.convert("RGB")

    def _engine_prepare(self, requests: Sequence[ChatRequest], offset: int | Sequence[int]):
        """Prompt ids (one placeholder per image, expanded by the engine) and the engine's image of each
        valid request; errors for the others."""
        prompts, visuals, image_index, errors, video = self._read_requests(requests, offset)
        if video:
            errors = [e or SampleError(_row(offset, i), "input", "", "the engine judge takes images; pass a video's frames as images")
                      for i, e in enumerate(errors)]
            return [None] * len(requests), [], errors
        prompt_ids = self._encode_requests(requests, offset, prompts, errors, 1)
        images = [self.engine_image(v) for v in visuals]
        return prompt_ids, [images[k] if k >= 0 else None for k in image_index], errors

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """Answer every request through the engine (see :class:`LocalChatJudge` for the conversations).

        Args:
            requests: the conversations to continue.

        Returns:
            One response per request, in order (token ids included); a request that cannot be answered has
            ``error`` set.
        """
        requests = list(requests)
        out: list[ChatResponse | None] = [None] * len(requests)
        for start in range(0, len(requests), self.batch_size):
            rows = list(range(start, min(len(requests), start + self.batch_size)))
            for i, response in zip(rows, self._engine_batch([requests[i] for i in rows], start)):
                out[i] = response
        return cast(list[ChatResponse], out)  # every request is in one batch

    def _engine_batch(self, requests: list[ChatRequest], offset: int) -> list[ChatResponse]:
        judge = self.judge
        prompt_ids, images, errors = self._engine_prepare(requests, offset)
        responses: list[ChatResponse] = [ChatResponse(text="", error=e) for e in errors]
        rows = [i for i, p in enumerate(prompt_ids) if p is not None]
        if not rows:
            return responses
        runs = []
        for i in rows:
            request = requests[i]
            budget = request.max_tokens if request.max_tokens is not None else judge.context_length - len(prompt_ids[i])
            runs.append(EngineRun(prompt_ids[i], images[i], budget, request.temperature, self.seed + offset + i,
                                  request.top_logprobs))
        answers = self.engine.run(runs)
        eos = judge.eos_token_ids
        tokens, finished, logprobs, top_ids, top_lps = [], [], [], [], []
        for _run, answer in zip(runs, answers):
            ids = list(answer.token_ids)
            end = next((j for j, t in enumerate(ids) if t in eos), None)
            ids = ids if end is None else ids[:end]
            tokens.append(ids)
            finished.append(end is not None)
            logprobs.append(list(answer.logprobs[: len(ids)]))
            top_ids.append([[t for t, _ in step] for step in answer.top[: len(ids)]])
            top_lps.append([[lp for _, lp in step] for step in answer.top[: len(ids)]])
        decoded = DecodeOutput(tokens=tokens, finished=finished, logits=None, logprobs=logprobs, top_ids=top_ids,
                               top_logprobs=top_lps)
        return self._responses(requests, rows, prompt_ids, decoded, responses)

    # ---------------------------------------------------------------------- exact distributions
    def token_distributions(self, requests: Sequence[ChatRequest], prefixes: Sequence[Sequence[int]],
                            token_ids: Sequence[int]) -> np.ndarray:
        """Probabilities (N, K) float64 of each of ``token_ids`` being written right after request n's
        prompt and the generated tokens ``prefixes[n]`` (the full-vocabulary distribution read at those
        ids: rows sum to at most 1).

        Args:
            requests: the conversations.
            prefixes: generated tokens to continue each one with (empty: right after the prompt).
            token_ids: the K tokens to read.

        Returns:
            (N, K) float64.

        Raises:
            ValueError: a request that cannot be run (named).
        """
        nodes: list[list[Any]] = [[]]
        table = self._node_probabilities(requests, prefixes, nodes, list(token_ids))
        return table[:, 0, :]

    def integer_distributions(self, requests: Sequence[ChatRequest], prefixes: Sequence[Sequence[int]],
                              max_branch_rows: int = 64) -> np.ndarray:
        """Exact probabilities (N, 101) float64 of each answer "0".."100" being written after request n's
        prompt and the generated tokens ``prefixes[n]``, as :meth:`LocalChatJudge.integer_distributions`:
        the digit probabilities at the 102 nodes of the digit tree, each node one engine request (all of a
        batch in one engine call; ``max_branch_rows`` is not used).

        Args:
            requests: the conversations.
            prefixes: generated tokens before the number.
            max_branch_rows: ignored (the engine schedules its own batches).

        Returns:
            (N, 101) float64; rows sum to at most 1.

        Raises:
            ValueError: a request that cannot be run (named).
        """
        digits = self.judge.digit_token_ids()
        nodes: list[list[int]] = [[]] + [[a] for a in range(10)] + [[a, b] for a in range(1, 10) for b in range(10)] + [[1, 0, 0]]
        table = self._node_probabilities(requests, prefixes, [[digits[d] for d in node] for node in nodes], digits)
        at = {tuple(node): k for k, node in enumerate(nodes)}
        out = np.zeros((len(requests), NUM_SCORES), dtype=np.float64)
        for r in range(len(requests)):
            p = table[r]

            def end(node, p=p):
                return max(0.0, 1.0 - float(p[at[node]].sum()))

            first = p[at[()]]
            second = np.zeros((10, 10))
            end1 = np.zeros(10)
            end2 = np.zeros((10, 10))
            for a in range(10):
                second[a] = p[at[(a,)]]
                end1[a] = end((a,))
                if a > 0:
                    for b in range(10):
                        end2[a, b] = end((a, b))
            out[r] = digit_tree_distribution(first, end1, second, end2, float(p[at[(1, 0)]][0]), end((1, 0, 0)))
        return out

    def _node_probabilities(self, requests, prefixes, nodes: list[list[int]], token_ids: list[int]) -> np.ndarray:
        """(N, nodes, K) float64: p(token_ids[k] | request n's prompt + prefixes[n] + nodes[j])."""
        if len(prefixes) != len(requests):
            raise ValueError(f"{len(prefixes)} prefixes for {len(requests)} requests")
        out = np.zeros((len(requests), len(nodes), len(token_ids)), dtype=np.float64)
        per_call = max(1, self.batch_size // max(1, len(nodes)))
        for start in range(0, len(requests), per_call):
            rows = list(range(start, min(len(requests), start + per_call)))
            prompt_ids, images, errors = self._engine_prepare([requests[i] for i in rows], rows)
            for j, err in enumerate(errors):
                if err is not None:
                    raise ValueError(f"request {rows[j]}: {err}")
            runs = [EngineRun(list(prompt_ids[j]) + [int(t) for t in prefixes[i]] + list(node), images[j], 1,
                              token_ids=token_ids)
                    for j, i in enumerate(rows) for node in nodes]
            answers = self.engine.run(runs)
            for k, answer in enumerate(answers):
                j, n = divmod(k, len(nodes))
                if answer.error is not None or not answer.token_logprobs:
                    raise ValueError(f"request {rows[j]}: the engine returned no token log-probabilities"
                                     + (f" ({answer.error})" if answer.error else ""))
                step = answer.token_logprobs[0]
                missing = [t for t in token_ids if t not in step]
                if missing:
                    raise ValueError(f"request {rows[j]}: the engine did not return the log-probabilities of tokens {missing}")
                out[rows[j], n] = [math.exp(step[t]) for t in token_ids]
        return out
