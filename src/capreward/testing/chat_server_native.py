"""What the test chat server (:mod:`capreward.testing.chat_server`) answers on the two engines' native
scoring routes, computed by its local model:

- SGLang's ``POST /generate`` (``GenerateReqInput``): ``text`` (one prompt or a batch, the chat template
  applied by the client, images as ``image_data`` beside it), ``sampling_params`` (``max_new_tokens``,
  default 128 as SGLang's, ``temperature``, ``stop``), ``return_logprob``, ``logprob_start_len`` (-1:
  output tokens only), ``top_logprobs_num``, ``token_ids_logprob`` (one list for every prompt or one per
  prompt), ``return_text_in_logprobs``; answered as the tokenizer manager does: ``{"text", "output_ids",
  "meta_info": {"id", "finish_reason": {"type": "stop" | "length", "matched" | "length"},
  "prompt_tokens", "completion_tokens", "cached_tokens", "input_token_logprobs",
  "output_token_logprobs": [[logprob, id, text | None], ...], "input_top_logprobs",
  "output_top_logprobs", "input_token_ids_logprobs", "output_token_ids_logprobs"}}`` (a list of those
  for a batch). A final end-of-sequence token is listed among the output tokens, as SGLang lists it.
- vLLM's ``POST /v1/chat/completions/batch`` (``BatchChatCompletionRequest``): ``messages`` a list of
  conversations, the chat completion's fields for all of them, ``logprob_token_ids`` (the asked ids'
  log-probabilities at each generated position: the sampled token plus every asked id, no top-k cap) and
  ``return_tokens_as_token_ids`` (entries named ``"token_id:N"``); one choice per conversation, ``index``
  its position.

Log-probabilities are the model's (float32 logits, log-softmax in float64), never clamped but for
vLLM's floor of -9999. Prompts of one request that share an image run in one batched prefill.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from collections.abc import Sequence

from ..errors import CaprewardError

#: SGLang's default ``max_new_tokens``.
SGLANG_MAX_NEW_TOKENS = 128
#: Rows per batched prefill of the text judge (its rows share no prefix: each runs whole).
CHUNK = 16
#: Rows per batched prefill of the LLaVA judge, whose rows share their prompt's prefix (run once per
#: chunk): one chunk holds a digit tree (102 prefilled conversations), so its prompt runs once, not seven times.
PREFIX_CHUNK = 128


class BadRequest(CaprewardError, ValueError):
    """Raised to the server, which answers 400 (its own BadRequest is raised instead when it passes one)."""


# ------------------------------------------------------------------------------------ model side
class LlavaRows:
    """Prompt ids and next-token log-probabilities from the server's local LLaVA chat judge."""

    def __init__(self, chat_judge: Any, error: type = BadRequest):
        self.chat = chat_judge
        self.judge = chat_judge.judge
        self.tokenizer = self.judge.tokenizer
        self.eos = set(self.judge.eos_token_ids)
        self.error = error

    def from_text(self, texts: Sequence[str], images: Sequence[Sequence[Any]]) -> tuple[list[list[int]], Any, list[int]]:
        """Ids of raw prompt texts (special-token strings parsed, BOS added: what SGLang's tokenizer
        does), each holding one image placeholder for its one image."""
        keys: dict[int, int] = {}
        pixels: list[Any] = []
        index: list[int] = []
        for n, item in enumerate(images):
            if len(item) != 1:
                raise self.error(f"text[{n}]: this test server's LLaVA judge takes exactly one image per prompt, got {len(item)}")
            key = id(item[0])
            if key not in keys:
                keys[key] = len(pixels)
                pixels.append(item[0])
            index.append(keys[key])
        features = self.judge.image_features(self.judge.preprocess(pixels))
        try:
            ids = [self.judge.encode_prompts([t], int(features.shape[1]), names=[f"text[{n}]"])[0] for n, t in enumerate(texts)]
        except ValueError as exc:
            raise self.error(str(exc)) from exc
        return ids, features, index

    def from_chat(self, requests: Sequence[Any]) -> tuple[list[list[int]], Any, list[int]]:
        """Ids of chat requests rendered by the server's own template (a final assistant message
        continued), as its chat route renders them."""
        ids, features, index, errors = self.chat._prepare(list(requests))
        for n, err in enumerate(errors):
            if err is not None:
                raise self.error(f"messages[{n}]: {err}")
        return ids, features, index

    def next_logp(self, ids: Sequence[Sequence[int]], features: Any, index: Sequence[int]) -> Any:
        """(N, V) float64 log-probabilities of the token after each prompt (batched prefills)."""
        import torch

        rows = []
        with torch.inference_mode():
            for s in range(0, len(ids), PREFIX_CHUNK):
                state = self.judge.start(list(ids[s : s + PREFIX_CHUNK]), features, list(index[s : s + PREFIX_CHUNK]), reserve=1)
                rows.append(torch.log_softmax(state.logits.double().cpu(), dim=-1))
        return torch.cat(rows)

    def greedy(self, ids: Sequence[int], features: Any, image: int, steps: int, stop: Any) -> tuple[list[int], list[Any]]:
        """Greedy tokens after a prompt and the (V,) log-probabilities each was chosen from; ``stop(ids)``
        ends it early."""
        import torch

        chosen: list[int] = []
        rows: list[Any] = []
        with torch.inference_mode():
            state = self.judge.start([list(ids)], features, [image], reserve=max(1, steps))
            for _ in range(steps):
                logp = torch.log_softmax(state.logits.double().cpu(), dim=-1)[0]
                token = int(logp.argmax())
                chosen.append(token)
                rows.append(logp)
                if token in self.eos or stop(chosen) or len(chosen) == steps:
                    break
                state = self.judge.step(state, torch.tensor([token]))
        return chosen, rows

    def prompt_logp(self, ids: Sequence[int], features: Any, image: int) -> Any:
        """(L, V) float64: row t the log-probabilities of the token at position t + 1 (teacher forced)."""
        import torch

        from capreward.judges.cache import growing_cache

        judge = self.judge
        row = torch.tensor([list(ids)], device=judge.device)
        feats = features[image : image + 1] if features is not None else None
        with torch.inference_mode():
            positions = judge._positions(torch.arange(len(ids), device=judge.device)[None], judge._image_starts([list(ids)]))
            cache = growing_cache(None, int(judge.model.config.get_text_config().num_hidden_layers), reserve=1)
            out = judge._forward(judge.embed(row, feats), torch.ones_like(row), positions, cache, logits_to_keep=0)
            return torch.log_softmax(out.logits[0].double().cpu(), dim=-1)


class TextRows:
    """The same from a local text-only judge (:class:`~capreward.judges.local_text.LocalTextJudge`)."""

    def __init__(self, text_judge: Any, error: type = BadRequest):
        self.text = text_judge
        self.model = text_judge.model
        self.tokenizer = text_judge.tokenizer
        eos = self.tokenizer.eos_token_id
        self.eos = {eos} if eos is not None else set()
        self.error = error

    def from_text(self, texts: Sequence[str], images: Sequence[Sequence[Any]]) -> tuple[list[list[int]], Any, list[int]]:
        if any(images):
            raise self.error("this test server's text judge takes no images")
        return [list(self.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts], None, [-1] * len(texts)

    def from_chat(self, requests: Sequence[Any]) -> tuple[list[list[int]], Any, list[int]]:
        from capreward.judges.caller_text import render

        out = []
        for n, request in enumerate(requests):
            turns = list(request.turns)
            prefill = turns.pop().text if turns and turns[-1].role == "assistant" else ""
            if len(turns) != 1 or turns[0].role != "user" or turns[0].images:
                raise self.error(f"messages[{n}]: this test server's text judge takes one user message without images")
            text = render(self.text.parts(turns[0].text)) + prefill  # message text parsed for special tokens, as vLLM does
            out.append(list(self.tokenizer(text, add_special_tokens=True)["input_ids"]))
        return out, None, [-1] * len(out)

    def _logits(self, rows: Sequence[Sequence[int]], keep_all: bool = False) -> Any:
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(list(r))
            mask[i, width - len(r):] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=0 if keep_all else 1)
        return out.logits

    def next_logp(self, ids: Sequence[Sequence[int]], features: Any, index: Sequence[int]) -> Any:
        import torch

        rows = []
        with torch.inference_mode():
            for s in range(0, len(ids), CHUNK):
                rows.append(torch.log_softmax(self._logits(ids[s : s + CHUNK])[:, -1].double(), dim=-1))
        return torch.cat(rows)

    def greedy(self, ids: Sequence[int], features: Any, image: int, steps: int, stop: Any) -> tuple[list[int], list[Any]]:
        import torch

        chosen: list[int] = []
        rows: list[Any] = []
        with torch.inference_mode():
            for _ in range(steps):
                logp = torch.log_softmax(self._logits([list(ids) + chosen])[0, -1].double(), dim=-1)
                token = int(logp.argmax())
                chosen.append(token)
                rows.append(logp)
                if token in self.eos or stop(chosen) or len(chosen) == steps:
                    break
        return chosen, rows

    def prompt_logp(self, ids: Sequence[int], features: Any, image: int) -> Any:
        import torch

        with torch.inference_mode():
            return torch.log_softmax(self._logits([list(ids)], keep_all=True)[0].double(), dim=-1)


# ------------------------------------------------------------------------------ SGLang /generate
def _per_item(value: Any, n: int, name: str, single: Any, error: type) -> list:
    """A batch field given once for every prompt (``single(value)``) or as a list of one per prompt."""
    if value is None:
        return [None] * n
    if single(value):
        return [value] * n
    if isinstance(value, list) and len(value) == n and all(v is None or single(v) for v in value):
        return list(value)
    raise error(f"{name} must be given once or once per prompt ({n})")


def _triples(rows: Sequence[tuple[float, int]], tokenizer: Any, with_text: bool) -> list:
    return [[lp, tid, tokenizer.decode([tid]) if with_text else None] for lp, tid in rows]


def sglang_generate(rows: Any, body: dict, decode_image: Any, error: type = BadRequest) -> Any:
    """The ``/generate`` answer to ``body`` (one dict, or a list for a batch); see the module docstring."""
    if not isinstance(body, dict):
        raise error("the body must be a JSON object")
    if body.get("input_ids") is not None or body.get("input_embeds") is not None:
        raise error("this test server takes text prompts only (no input_ids)")
    if body.get("stream"):
        raise error("this test server does not stream")
    text = body.get("text")
    batch = isinstance(text, list)
    texts = text if batch else [text]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise error("text must be a string or a non-empty list of strings")
    n = len(texts)
    raw_images = body.get("image_data")
    if raw_images is None:
        images_per: list[list[Any]] = [[] for _ in range(n)]
    elif batch:
        if not isinstance(raw_images, list) or len(raw_images) != n:
            raise error(f"image_data must hold one entry per prompt ({n})")
        images_per = [[] if v is None else (v if isinstance(v, list) else [v]) for v in raw_images]
    else:
        images_per = [raw_images if isinstance(raw_images, list) else [raw_images]]
    decoded: dict[str, Any] = {}  # one decoding per distinct image of the request
    for item in images_per:
        for u in item:
            if str(u) not in decoded:
                decoded[str(u)] = decode_image(str(u))
    images = [[decoded[str(u)] for u in item] for item in images_per]
    sampling = [p or {} for p in _per_item(body.get("sampling_params"), n, "sampling_params", lambda v: isinstance(v, dict), error)]
    want_logprob = _per_item(body.get("return_logprob"), n, "return_logprob", lambda v: isinstance(v, bool), error)
    start = body.get("logprob_start_len")
    start = -1 if start is None else start
    top = int(body.get("top_logprobs_num") or 0)
    ids_list = lambda v: isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)  # noqa: E731
    asked_per = _per_item(body.get("token_ids_logprob"), n, "token_ids_logprob", ids_list, error)
    with_text = bool(body.get("return_text_in_logprobs"))
    tok = rows.tokenizer
    for k, ids in enumerate(asked_per):
        if ids is not None and not all(isinstance(t, int) and 0 <= t < len(tok) for t in ids):
            raise error(f"token_ids_logprob[{k}] must be token ids of this model")
    ids, features, index = rows.from_text(texts, images)
    out = []
    one_step = [k for k in range(n) if int(sampling[k].get("max_new_tokens", SGLANG_MAX_NEW_TOKENS)) == 1 and start == -1]
    first = dict(zip(one_step, rows.next_logp([ids[k] for k in one_step], features, [index[k] for k in one_step]))) if one_step else {}
    for k in range(n):
        params = sampling[k]
        if float(params.get("temperature", 1.0)) != 0.0:
            raise error("this test server only decodes greedily (temperature 0)")
        steps = int(params.get("max_new_tokens", SGLANG_MAX_NEW_TOKENS))
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        hit: list[str] = []

        def stopped(chosen: list[int], stops=stops, hit=hit) -> bool:
            text = tok.decode(chosen, skip_special_tokens=True)
            found = [s for s in stops if s and s in text]
            hit.extend(found[:1])
            return bool(found)

        if k in first:
            logp = first[k]
            chosen, step_rows = [int(logp.argmax())], [logp]
        else:
            chosen, step_rows = rows.greedy(ids[k], features, index[k], steps, stopped)
        last = chosen[-1] if chosen else None
        text = tok.decode(chosen, skip_special_tokens=True)
        if hit:
            text = text[: text.index(hit[0])]
            finish: dict[str, Any] = {"type": "stop", "matched": hit[0]}
        elif last in rows.eos:
            finish = {"type": "stop", "matched": last}
        else:
            finish = {"type": "length", "length": len(chosen)}
        meta: dict[str, Any] = {"id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(ids[k]),
                                "weight_version": "default", "completion_tokens": len(chosen), "cached_tokens": 0,
                                "e2e_latency": 0.0}
        if want_logprob[k]:
            meta["output_token_logprobs"] = _triples([(float(r[t]), t) for r, t in zip(step_rows, chosen)], tok, with_text)
            in_rows: Any = None
            if start >= 0:
                if start >= len(ids[k]):
                    raise error(f"logprob_start_len ({start}) is higher than the number of input tokens ({len(ids[k])})")
                in_rows = rows.prompt_logp(ids[k], features, index[k])
            positions = range(start, len(ids[k])) if start >= 0 else range(0)
            meta["input_token_logprobs"] = [
                [None if p == 0 else float(in_rows[p - 1][ids[k][p]]), ids[k][p], None] for p in positions]
            if top > 0:
                meta["output_top_logprobs"] = [_triples([(float(v), int(i)) for v, i in zip(*r.topk(top))], tok, with_text)
                                               for r in step_rows]
                meta["input_top_logprobs"] = [None if p == 0 else _triples(
                    [(float(v), int(i)) for v, i in zip(*in_rows[p - 1].topk(top))], tok, with_text) for p in positions]
            if asked_per[k] is not None:
                wanted = [int(t) for t in asked_per[k]]
                meta["output_token_ids_logprobs"] = [_triples([(float(r[t]), t) for t in wanted], tok, with_text) for r in step_rows]
                meta["input_token_ids_logprobs"] = [None if p == 0 else _triples(
                    [(float(in_rows[p - 1][t]), t) for t in wanted], tok, with_text) for p in positions]
        out.append({"text": text, "output_ids": chosen, "meta_info": meta})
    return out if batch else out[0]


# ------------------------------------------------------------------------- vLLM batched chat
def _name(tokenizer: Any, token: int, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids else tokenizer.decode([token])


def _entry(tokenizer: Any, token: int, logprob: float, as_ids: bool) -> dict:
    name = _name(tokenizer, token, as_ids)
    return {"token": name, "logprob": max(float(logprob), -9999.0), "bytes": list(name.encode("utf-8", errors="replace"))}


def vllm_batch(rows: Any, requests: Sequence[Any], body: dict, model: str, max_logprobs: int, error: type = BadRequest) -> dict:
    """The ``/v1/chat/completions/batch`` answer: one choice per conversation (``requests``, already
    parsed, a final assistant turn continued), one generated token each (this test server scores; it
    does not write long answers on this route)."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens != 1:
        raise error("this test server's batch route generates one token (max_tokens=1)")
    if float(body.get("temperature", 1.0)) != 0.0:
        raise error("this test server only decodes greedily (temperature 0)")
    logprobs = bool(body.get("logprobs"))
    top = int(body.get("top_logprobs") or 0)
    asked = body.get("logprob_token_ids")
    tok = rows.tokenizer
    if asked is not None:
        if not logprobs:
            raise error("logprob_token_ids requires logprobs=true")
        if not isinstance(asked, list) or not asked or not all(isinstance(t, int) and 0 <= t < len(tok) for t in asked):
            raise error("logprob_token_ids must be a non-empty list of token ids of this model")
    if not 0 <= top <= max_logprobs:
        raise error(f"top_logprobs must be in [0, {max_logprobs}], got {top}")
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    ids, features, index = rows.from_chat(requests)
    logp = rows.next_logp(ids, features, index)
    choices = []
    for k, row in enumerate(logp):
        token = int(row.argmax())
        content = None
        if logprobs:
            entry = _entry(tok, token, float(row[token]), as_ids)
            if asked:
                listed = [token] + [t for t in dict.fromkeys(asked) if t != token]
                entry["top_logprobs"] = [_entry(tok, t, float(row[t]), as_ids) for t in listed]
            else:
                values, alt = row.topk(top) if top else (row[:0], row[:0].long())
                entry["top_logprobs"] = [_entry(tok, int(t), float(v), as_ids) for v, t in zip(values, alt)]
            content = [entry]
        eos = token in rows.eos
        choices.append({"index": k, "message": {"role": "assistant", "content": "" if eos else tok.decode([token], skip_special_tokens=True)},
                        "logprobs": {"content": content} if logprobs else None,
                        "finish_reason": "stop" if eos else "length", "stop_reason": None})
    prompt_tokens = sum(len(i) for i in ids)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(choices),
                                          "total_tokens": prompt_tokens + len(choices)}}
