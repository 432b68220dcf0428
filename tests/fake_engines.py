"""Fakes of vLLM's and SGLang's offline engines, for the engine judge's tests (vLLM and SGLang cannot be
installed on the CPU test machine). **They are fakes**: each implements exactly the part of the engine's
documented offline API that :mod:`capreward.judges.engines` uses, with the engine's own names, shapes and
conventions, on a tiny transformers LLaVA run by transformers' own ``generate`` (not capreward's batched
path), one prompt at a time:

- vLLM (``vllm.LLM.generate(prompts, sampling_params, use_tqdm=...)``): prompts ``{"prompt_token_ids",
  "multi_modal_data": {"image"}}`` whose one image placeholder the engine expands to the model's image
  tokens; ``SamplingParams`` (``n``, ``temperature``, ``max_tokens``, ``seed``, ``logprobs`` (top-k plus the
  sampled token; -1: every token, only when the engine was built with ``max_logprobs=-1``; more than
  ``max_logprobs``: ValueError, as vLLM), ``logprob_token_ids`` (the sampled token plus exactly those
  ids), ``detokenize``); ``RequestOutput.outputs[0]`` with ``token_ids`` (the end token included when
  written), ``logprobs`` (per generated token {id: ``Logprob(logprob, rank, decoded_token)``}, raw
  log-probabilities before temperature, vLLM's default ``logprobs_mode``) and ``finish_reason``.
- SGLang (``sglang.Engine.generate(input_ids=, image_data=, sampling_params=, return_logprob=,
  logprob_start_len=, top_logprobs_num=, token_ids_logprob=)``): a list of ``{"text", "output_ids",
  "meta_info"}`` for a batch (a dict for one request), ``meta_info`` holding ``finish_reason``
  (``{"type": "stop" | "length"}``), ``output_token_logprobs`` [(logprob, id, None)],
  ``output_top_logprobs`` and ``output_token_ids_logprobs`` (a list of such tuples per position).

Like the engines, they run the model's own image processor on the image they are given (no padding to a
square: the backend pads). The GPU run tests the real engines where the device image carries them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class SamplingParams:
    """vLLM's ``SamplingParams`` fields the backend sets (same names and meanings)."""

    n: int = 1
    temperature: float = 1.0
    max_tokens: int | None = 16
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True


@dataclass
class OldSamplingParams:
    """vLLM's ``SamplingParams`` before ``logprob_token_ids`` existed."""

    n: int = 1
    temperature: float = 1.0
    max_tokens: int | None = 16
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool = True


class _Model:
    """The tiny transformers LLaVA both fakes run: one prompt at a time through its own ``generate``."""

    def __init__(self, model: Any, processor: Any):
        self.model, self.processor = model, processor
        self.tokenizer = processor.tokenizer
        self.image_token_id = int(model.config.image_token_id)
        self.image_tokens = int(model.config.image_seq_length)
        eos = model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.images_seen: list[tuple[int, int]] = []  # sizes of the images the engine was given
        self.calls = 0

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], image: Any, max_tokens: int, temperature: float, seed: int | None):
        """(generated ids, end token included; raw log-probabilities (T, V) float32 of each step)."""
        placeholders = sum(1 for t in prompt_ids if t == self.image_token_id)
        if placeholders != (1 if image is not None else 0):
            raise ValueError(f"the prompt holds {placeholders} image placeholders for {int(image is not None)} images")
        ids: list[int] = []
        for t in prompt_ids:  # the engine's prompt update: one placeholder -> the model's image tokens
            ids.extend([t] * self.image_tokens if t == self.image_token_id else [t])
        inputs: dict[str, Any] = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        if image is not None:
            self.images_seen.append(image.size)
            inputs["pixel_values"] = self.processor.image_processor(images=image, return_tensors="pt")["pixel_values"]
        sample = temperature > 0
        if sample and seed is not None:
            torch.manual_seed(seed)
        out = self.model.generate(**inputs, max_new_tokens=max_tokens, do_sample=sample,
                                  temperature=temperature if sample else None, top_p=None, top_k=None,
                                  output_logits=True, return_dict_in_generate=True)
        new = out.sequences[0, len(ids):].tolist()
        logprobs = torch.log_softmax(torch.stack([step[0].float() for step in out.logits]), dim=-1)
        return new[: len(logprobs)], logprobs


class FakeLLM:
    """A fake ``vllm.LLM`` (module docstring). ``max_logprobs``: as vLLM's engine argument (default 20)."""

    def __init__(self, model_and_processor: tuple[Any, Any], max_logprobs: int = 20):
        self.core = _Model(*model_and_processor)
        self.max_logprobs = max_logprobs
        self.prompts: list[dict] = []

    def generate(self, prompts, sampling_params=None, *, use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        if isinstance(prompts, dict):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        self.core.calls += 1
        outputs = []
        for k, (prompt, p) in enumerate(zip(prompts, params)):
            self.prompts.append(prompt)
            if p.logprobs is not None and p.logprobs != -1 and self.max_logprobs != -1 and p.logprobs > self.max_logprobs:
                raise ValueError(f"Requested sample logprobs of {p.logprobs}, which is greater than max allowed: {self.max_logprobs}")
            if p.logprobs == -1 and self.max_logprobs != -1:
                raise ValueError("Requested sample logprobs of -1 (all), which needs max_logprobs=-1")
            image = (prompt.get("multi_modal_data") or {}).get("image")
            ids, logprobs = self.core.run(list(prompt["prompt_token_ids"]), image, int(p.max_tokens), float(p.temperature), p.seed)
            steps = None
            if p.logprobs is not None:
                steps = []
                for token, lp in zip(ids, logprobs):
                    order = torch.argsort(lp, descending=True)
                    rank = {int(t): r + 1 for r, t in enumerate(order.tolist())}
                    wanted = getattr(p, "logprob_token_ids", None)
                    if wanted:
                        chosen = list(wanted)
                    elif p.logprobs == -1:
                        chosen = list(range(lp.shape[0]))
                    else:
                        chosen = order[: p.logprobs].tolist()
                    entry = {int(t): Logprob(float(lp[t]), rank[int(t)], None) for t in chosen}
                    entry.setdefault(int(token), Logprob(float(lp[token]), rank[int(token)], None))
                    steps.append(entry)
            finished = bool(ids) and ids[-1] in self.core.eos
            text = self.core.tokenizer.decode(ids, skip_special_tokens=True) if p.detokenize else ""
            outputs.append(RequestOutput(str(k), None, list(prompt["prompt_token_ids"]), None, [
                CompletionOutput(0, text, ids, None, steps, "stop" if finished else "length")]))
        return outputs


class FakeSGLangEngine:
    """A fake ``sglang.Engine`` (module docstring)."""

    def __init__(self, model_and_processor: tuple[Any, Any]):
        self.core = _Model(*model_and_processor)

    def generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, token_ids_logprob=None, stream=False, **kwargs):
        if prompt is not None:
            raise NotImplementedError("this fake takes input_ids only")
        single = bool(input_ids) and isinstance(input_ids[0], int)
        batch = [input_ids] if single else list(input_ids)
        n = len(batch)

        def per_request(value, default):
            if value is None:
                return [default] * n
            return [value] if single else list(value)

        params = per_request(sampling_params, {})
        images = per_request(image_data, None)
        tops = per_request(top_logprobs_num, 0)
        wanted = per_request(token_ids_logprob, None) if token_ids_logprob is not None and (single or not isinstance(token_ids_logprob[0], int)) \
            else [token_ids_logprob] * n
        self.core.calls += 1
        results = []
        for ids_in, p, image, k, ids_wanted in zip(batch, params, images, tops, wanted):
            ids, logprobs = self.core.run(list(ids_in), image, int(p.get("max_new_tokens", 128)),
                                          float(p.get("temperature", 1.0)), p.get("sampling_seed"))
            meta: dict[str, Any] = {"prompt_tokens": len(ids_in), "completion_tokens": len(ids)}
            finished = bool(ids) and ids[-1] in self.core.eos
            meta["finish_reason"] = {"type": "stop", "matched": ids[-1]} if finished else {"type": "length", "length": len(ids)}
            if return_logprob:
                meta["output_token_logprobs"] = [(float(lp[t]), int(t), None) for t, lp in zip(ids, logprobs)]
                if k:
                    meta["output_top_logprobs"] = [
                        [(float(v), int(t), None) for v, t in zip(*lp.topk(k))] for lp in logprobs]
                if ids_wanted:
                    meta["output_token_ids_logprobs"] = [[(float(lp[t]), int(t), None) for t in ids_wanted] for lp in logprobs]
            results.append({"text": self.core.tokenizer.decode(ids, skip_special_tokens=True), "output_ids": ids,
                            "meta_info": meta})
        return results[0] if single else results
