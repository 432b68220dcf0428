"""A real OpenAI/vLLM-compatible chat-completions HTTP server for tests, with fault injection.

Run as a process (``python chat_server.py --port 8001 --backend local --judge-dir DIR``), or start and
control one from a test with :class:`ChatServer`. It listens on 127.0.0.1 and serves

- ``GET /health`` and ``GET /v1/models`` (readiness);
- ``POST /v1/chat/completions`` following the documented OpenAI / vLLM schema: ``messages`` whose
  ``content`` is a string or a list of ``text`` / ``image_url`` (data-URI) parts, ``max_tokens`` or
  ``max_completion_tokens``, ``temperature``, ``logprobs``, ``top_logprobs`` (at most 20, as vLLM's
  default ``max_logprobs``), ``stop``, and vLLM's assistant prefill (a final assistant message with
  ``continue_final_message=true``, ``add_generation_prompt=false``: the model continues that message, its
  log-probabilities computed by the model for the prefilled text, as vLLM does); the answer has ``choices[0].message.content``, ``finish_reason`` and
  ``logprobs.content[i] = {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}, ...]}``;
- SGLang's native ``POST /generate`` and vLLM's ``POST /v1/chat/completions/batch`` (with
  ``logprob_token_ids``), the two engines' ways of scoring chosen tokens exactly, following their request
  and response schemas (:mod:`capreward.testing.chat_server_native`);
- ``POST /control`` (fault injection), ``GET /stats`` (requests seen per route: ``chat_requests``,
  ``batch_requests``, ``generate_requests`` and of those ``generate_batches``, the ones carrying a batch of
  prompts; faults served) and ``GET /requests`` (the JSON bodies of the
  last 64 requests to a model route, as received: tests check what a client sends).

Backends: ``local`` answers with :class:`~capreward.judges.local_chat.LocalChatJudge` over a saved LLaVA
judge directory (the tiny trained judge in tests), one request at a time; ``text`` with
:class:`~capreward.judges.local_text.LocalTextJudge` over a saved text-only judge directory (the tiny QA
judge); ``echo`` answers ``"echo: <last user text>"`` word by word with fixed log-probabilities and needs
no model (fault tests).

Faults (``POST /control`` with a JSON object, or the same keys as ``--fault`` JSON on the command line,
so that a restarted server can start faulty; they apply to the next requests of any model route):
``{"status": 429, "count": k}`` answers the next k
requests with that HTTP status (with a ``Retry-After`` header when ``"retry_after": s`` is given); ``{"malformed": k}`` answers them 200 with a truncated JSON body;
``{"body": <any JSON>, "count": k}`` answers them 200 with that JSON as it is (a lying server: NaN,
``1000.0`` or ``+5`` log-probabilities, wrong shapes); ``{"oversize": n, "count": k}`` answers them with a
well-formed completion whose text is ``n`` characters, far past any ``max_tokens`` (``"chunked": true``:
sent without Content-Length);
``{"delay": s, "count": k}`` sleeps s seconds before answering them; ``{"latency": s}`` delays every
answer by s seconds; ``{"jitter": s}`` adds a random delay in [0, s] to every answer (so answers finish
out of order); ``{"reset": true}`` clears all faults and the counters of ``GET /stats``. Faults queue up and are used in order.

``--max-logprobs N`` raises the most ``top_logprobs`` a request may ask (vLLM's flag of that name; default
20). ``--api-key KEY`` makes the server require ``Authorization: Bearer KEY`` (as ``vllm serve --api-key``
does); on purpose, its 401 message repeats the key it was given, so that tests can check a client masks
keys a server echoes back.

Only the standard library is imported at module level, so the process starts fast (the ``local``
backend imports torch and the judge when it is chosen).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from collections.abc import Sequence

from capreward.errors import CaprewardError  # absolute: this file also runs as a script

MAX_TOP_LOGPROBS = 20


class BadRequest(CaprewardError, ValueError):
    """The request does not follow the chat-completions schema (answered with HTTP 400)."""


# ------------------------------------------------------------------------------------- backends
class EchoBackend:
    """A model-free backend: answers ``"echo: <last user text>"``; token i (a word, with its leading
    space after the first) has log-probability ``-0.2 - 0.01 * i`` and alternatives ``"alt0".."altk"``
    at ``2 + j`` below it, so the listed probabilities of a position sum below 1, as a model's do.
    Deterministic, so a client can check every answer belongs to its request."""

    name = "echo"

    def answer(self, turns: list[dict], max_tokens: int | None, top_logprobs: int, stop: Sequence[str], chat_template=None,
               continue_final: bool = False, prompt_logprobs: int | None = None) -> dict:
        if prompt_logprobs is not None:
            raise BadRequest("the echo backend does not return prompt_logprobs")
        last = next((t["text"] for t in reversed(turns) if t["role"] in ("user", "system")), "")
        words = ("echo: " + last).split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        finish = "stop"
        if max_tokens is not None and len(pieces) > max_tokens:
            pieces, finish = pieces[:max_tokens], "length"
        text = "".join(pieces)
        for s in stop:
            if s and s in text:
                text, finish = text[: text.index(s)], "stop"
        tokens = []
        for i, piece in enumerate(pieces):
            lp = -0.2 - 0.01 * i
            top = {piece: lp, **{f"alt{j}": lp - 2.0 - j for j in range(max(0, top_logprobs - 1))}}
            tokens.append((piece, lp, dict(list(top.items())[:top_logprobs])))
        return {"text": text, "tokens": tokens, "finish_reason": finish}


class LocalBackend:
    """:class:`~capreward.judges.local_chat.LocalChatJudge` over a saved judge directory, float32 on CPU.

    Like vLLM, it tokenises message text with special-token parsing (a "</s>" in a message is the
    end-of-sequence token), so tests see what a client must escape (``parse_special_tokens=True``)."""

    def __init__(self, judge_dir: str, threads: int = 1):
        import torch

        from capreward.judges.loading import load_llava
        from capreward.judges.local_chat import LocalChatJudge

        torch.set_num_threads(threads)
        model, processor = load_llava(judge_dir, dtype=torch.float32, device=torch.device("cpu"), local_files_only=True)
        self.judge = _prefill_judge(LocalChatJudge)((model, processor), batch_size=1, parse_special_tokens=True)
        self.name = self.judge.name
        self.lock = threading.Lock()  # the model is not thread-safe; requests run one at a time
        from capreward.testing.chat_server_native import LlavaRows

        self.rows = LlavaRows(self.judge, BadRequest)  # SGLang's /generate and vLLM's batched chat

    def answer(self, turns: list[dict], max_tokens: int | None, top_logprobs: int, stop: Sequence[str], chat_template=None,
               continue_final: bool = False, prompt_logprobs: int | None = None) -> dict:
        answer = self._answer(turns, max_tokens, top_logprobs, stop, chat_template, continue_final)
        if prompt_logprobs is not None:  # vLLM's field: every prompt token's log-probability
            from capreward.judges.protocol import ChatRequest, ChatTurn

            request = ChatRequest(turns=tuple(ChatTurn(t["role"], t["text"], tuple(t["images"])) for t in turns),
                                  max_tokens=1, chat_template=chat_template)
            with self.lock:
                answer["prompt_logprobs"] = self.judge.prompt_logprobs(request, int(prompt_logprobs))
        return answer

    def _answer(self, turns: list[dict], max_tokens: int | None, top_logprobs: int, stop: Sequence[str],
                chat_template=None, continue_final: bool = False) -> dict:
        from dataclasses import replace

        from capreward.judges.protocol import ChatRequest, ChatTurn

        if continue_final and chat_template is not None:
            raise BadRequest("this test server continues a final assistant message with its own template only")

        request = ChatRequest(
            turns=tuple(ChatTurn(t["role"], t["text"], tuple(t["images"])) for t in turns),
            max_tokens=max_tokens,
            temperature=0.0,
            top_logprobs=top_logprobs,
            stop=tuple(stop),
            chat_template=chat_template,
        )
        if max_tokens == 1:  # one step: report the token whatever it is (an end of sequence included)
            with self.lock:
                return self.judge.first_token(replace(request, top_logprobs=min(top_logprobs, len(self.judge.judge.tokenizer))))
        with self.lock:
            response = self.judge.generate([replace(request, top_logprobs=min(top_logprobs, len(self.judge.judge.tokenizer)))])[0]
        if response.error is not None:
            raise BadRequest(response.error)
        tokens = [(t.token, t.logprob, t.top) for t in response.tokens]
        return {"text": response.text, "tokens": tokens, "finish_reason": response.finish_reason}


class TextBackend:
    """:class:`~capreward.judges.local_text.LocalTextJudge` over a saved text-only judge directory (the
    tiny QA judge in tests): one user message (and a continued assistant prefill) per conversation, no
    images; message text parsed for special tokens, as vLLM does."""

    def __init__(self, judge_dir: str, threads: int = 1):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from capreward.judges.local_text import LocalTextJudge
        from capreward.testing.chat_server_native import TextRows

        torch.set_num_threads(threads)
        tokenizer = AutoTokenizer.from_pretrained(judge_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(judge_dir, local_files_only=True, dtype=torch.float32)
        self.judge = LocalTextJudge((model, tokenizer))
        self.name = self.judge.name
        self.lock = threading.Lock()
        self.rows = TextRows(self.judge, BadRequest)

    def answer(self, turns: list[dict], max_tokens: int | None, top_logprobs: int, stop: Sequence[str], chat_template=None,
               continue_final: bool = False, prompt_logprobs: int | None = None) -> dict:
        from capreward.judges.protocol import ChatRequest, ChatTurn

        if chat_template is not None or prompt_logprobs is not None:
            raise BadRequest("this test server's text judge takes neither chat_template nor prompt_logprobs")
        request = ChatRequest(turns=tuple(ChatTurn(t["role"], t["text"], tuple(t["images"])) for t in turns))
        tok = self.rows.tokenizer
        with self.lock:
            [ids], _, _ = self.rows.from_chat([request])
            steps = max_tokens if max_tokens is not None else 256
            chosen, rows = self.rows.greedy(ids, None, -1, steps, lambda c: any(x and x in tok.decode(c, skip_special_tokens=True) for x in stop))
        ended = bool(chosen) and chosen[-1] in self.rows.eos
        kept = chosen[:-1] if ended else chosen
        tokens, before = [], list(ids[-3:])
        from capreward.judges.vocab import token_piece

        for j, (t, row) in enumerate(zip(kept, rows)):
            context = (before + kept[:j])[-3:]
            values, alt = row.topk(min(top_logprobs, len(tok))) if top_logprobs else (row[:0], row[:0].long())
            top: dict[str, float] = {}
            for v, a in zip(values.tolist(), alt.tolist()):
                top.setdefault(token_piece(tok, context, a), v)
            tokens.append((token_piece(tok, context, t), float(row[t]), top))
        text = tok.decode(kept, skip_special_tokens=True)
        for x in stop:
            if x and x in text:
                text = text[: text.index(x)]
        return {"text": text, "tokens": tokens, "finish_reason": "stop" if ended or len(kept) < steps else "length"}


# ------------------------------------------------------------------------------ request parsing
def decode_image(url: str) -> Any:
    """A PIL image from a ``data:image/...;base64,`` URL (remote URLs are refused: no network)."""
    from PIL import Image

    if not url.startswith("data:") or ";base64," not in url:
        raise BadRequest("image_url must be a base64 data URI (this server does not fetch URLs)")
    try:
        return Image.open(io.BytesIO(base64.b64decode(url.split(";base64,", 1)[1]))).convert("RGB")
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the client's
        raise BadRequest(f"image_url does not decode as an image: {exc}") from exc


def parse_messages(messages: Any, with_images: bool, decoded: dict[str, Any] | None = None) -> list[dict]:
    """``[{role, text, images}]`` from OpenAI ``messages`` (string content or text/image_url parts);
    ``decoded``: images already decoded by URL, filled here (the conversations of one batched request,
    a digit tree's 102, carry the same image: decoded once)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}] must be an object with role user, assistant or system")
        content = message.get("content")
        texts, images = [], []
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    texts.append(str(part.get("text", "")))
                elif kind == "image_url":
                    url = part.get("image_url", {})
                    url = url.get("url") if isinstance(url, dict) else url
                    url = str(url)
                    if not with_images:
                        images.append(url)
                    elif decoded is None:
                        images.append(decode_image(url))
                    else:
                        if url not in decoded:
                            decoded[url] = decode_image(url)
                        images.append(decoded[url])
                else:
                    raise BadRequest(f"messages[{i}].content[{j}] has unsupported type {kind!r}")
        else:
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
        turns.append({"role": message["role"], "text": "".join(texts), "images": images})
    return turns


def prefill_mode(body: dict, turns: list[dict]) -> bool:
    """Whether the request continues its final assistant message, with vLLM's rules:
    ``continue_final_message`` and ``add_generation_prompt`` (default true) cannot both be true, and a
    continued message must be an assistant message. A final assistant message without
    ``continue_final_message`` is refused (vLLM would open a new assistant turn after it, which the
    LLaVA-style test judge's conversations cannot hold)."""
    continue_final = bool(body.get("continue_final_message", False))
    add_generation_prompt = bool(body.get("add_generation_prompt", True))
    if continue_final and add_generation_prompt:
        raise BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    last_assistant = turns[-1]["role"] == "assistant"
    if continue_final and not last_assistant:
        raise BadRequest("continue_final_message needs a final assistant message")
    if last_assistant and not continue_final:
        raise BadRequest("a final assistant message needs continue_final_message=true, add_generation_prompt=false")
    return continue_final


def _prefill_judge(base: type) -> type:
    """A subclass of :class:`~capreward.judges.local_chat.LocalChatJudge` that renders a conversation
    ending with an assistant message as the generation prompt of the conversation before it followed by
    that message's text (what a chat template with ``continue_final_message`` renders), so the model's
    answer and log-probabilities continue the prefilled text."""
    from dataclasses import replace

    from capreward.judges.caller_text import Data

    class PrefillChatJudge(base):
        def render_parts(self, request):
            if request.turns and request.turns[-1].role == "assistant":
                parts = super().render_parts(replace(request, turns=request.turns[:-1]))
                return list(parts) + [Data(request.turns[-1].text)]
            return super().render_parts(request)

        def first_token(self, request) -> dict:
            """The one-token answer (greedy) with its log-probability and top alternatives, the end of
            sequence included (as vLLM reports a generated EOS token in ``logprobs``, where the local
            judge's answers stop before it)."""
            import torch

            prompt_ids, features, image_index, errors = self._prepare([request])
            if errors[0] is not None:
                raise BadRequest(errors[0])
            with torch.inference_mode():
                state = self.judge.start([prompt_ids[0]], features, [image_index[0]])
                logp = torch.log_softmax(state.logits.float().cpu(), dim=-1)[0]
            chosen = int(logp.argmax())
            before = list(prompt_ids[0][-3:])
            eos = self.judge.eos_token_ids
            values, ids = logp.topk(request.top_logprobs) if request.top_logprobs > 0 else (logp[:0], logp[:0].long())
            top: dict[str, float] = {}
            for alt, value in zip(ids.tolist(), values.tolist()):
                top.setdefault(self._piece(before, alt), value)
            piece = self._piece(before, chosen)
            return {"text": "" if chosen in eos else piece, "tokens": [(piece, float(logp[chosen]), top)],
                    "finish_reason": "stop" if chosen in eos else "length"}

        def prompt_logprobs(self, request, k: int) -> list:
            """vLLM's ``prompt_logprobs`` of ``request``'s prompt: None for the first token, then per token
            ``{token_id: {"logprob", "rank", "decoded_token"}}`` for the prompt's own token and the ``k``
            most likely ones, from one teacher-forced forward over the whole prompt."""
            import torch

            from capreward.judges.cache import growing_cache

            prompt_ids, features, image_index, errors = self._prepare([request])
            if errors[0] is not None:
                raise BadRequest(errors[0])
            judge = self.judge
            ids = [int(t) for t in prompt_ids[0]]
            row = torch.tensor([ids], device=judge.device)
            feats = features[image_index[0]: image_index[0] + 1] if features is not None else None
            with torch.inference_mode():
                positions = judge._positions(torch.arange(len(ids), device=judge.device)[None], judge._image_starts([ids]))
                cache = growing_cache(None, int(judge.model.config.get_text_config().num_hidden_layers), reserve=1)
                out = judge._forward(judge.embed(row, feats), torch.ones_like(row), positions, cache, logits_to_keep=0)
                logp = torch.log_softmax(out.logits[0].float().cpu(), dim=-1)
            entries: list = [None]
            for t in range(1, len(ids)):
                scores = logp[t - 1]
                ranks = {ids[t]: int((scores > scores[ids[t]]).sum()) + 1}
                if k > 0:
                    for r, alt in enumerate(scores.topk(k).indices.tolist()):
                        ranks.setdefault(alt, r + 1)
                before = tuple(ids[max(0, t - 3): t])
                entries.append({str(tok): {"logprob": float(scores[tok]), "rank": rank,
                                           "decoded_token": self._cached_piece(before, tok)}
                                for tok, rank in ranks.items()})
            return entries

        def _cached_piece(self, before: tuple[int, ...], token: int) -> str:
            """:meth:`_piece`, remembered (the prompts of one sample's tree share almost every position)."""
            pieces = self.__dict__.setdefault("_pieces", {})
            key = (before, token)
            if key not in pieces:
                if len(pieces) > 200_000:
                    pieces.clear()
                pieces[key] = self._piece(list(before), token)
            return pieces[key]

    return PrefillChatJudge


def completion_body(model: str, answer: dict, logprobs: bool) -> dict:
    """The ``chat.completion`` JSON object for a backend answer."""
    content = None
    if logprobs:
        content = [
            {
                "token": tok,
                "logprob": lp,
                "bytes": list(tok.encode("utf-8")),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))}
                    for t, v in sorted(top.items(), key=lambda kv: -kv[1])
                ],
            }
            for tok, lp, top in answer["tokens"]
        ]
    n = len(answer["tokens"])
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer["text"]},
                "logprobs": {"content": content} if logprobs else None,
                "finish_reason": answer["finish_reason"],
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n},
        **({"prompt_logprobs": answer["prompt_logprobs"]} if "prompt_logprobs" in answer else {}),
    }


# ---------------------------------------------------------------------------------------- server
class Faults:
    """The queue of injected faults and the request counters (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: deque[dict] = deque()
        self.latency = 0.0
        self.jitter = 0.0
        self.rng = random.Random(0)
        self.in_flight = 0
        self.stats = {"chat_requests": 0, "batch_requests": 0, "generate_requests": 0, "generate_batches": 0,
                      "answered": 0, "faults": 0, "max_in_flight": 0, "memo_hits": 0}
        self.bodies: deque[Any] = deque(maxlen=64)  # the last chat request bodies, for GET /requests

    def add(self, spec: dict) -> None:
        with self.lock:
            if spec.get("reset"):
                self.queue.clear()
                self.bodies.clear()
                self.latency = self.jitter = 0.0
                self.stats = dict.fromkeys(self.stats, 0)
            if "latency" in spec:
                self.latency = float(spec["latency"])
            if "jitter" in spec:
                self.jitter = float(spec["jitter"])
            if "status" in spec:
                fault = {"status": int(spec["status"]), "retry_after": spec.get("retry_after")}
                self.queue.extend(dict(fault) for _ in range(int(spec.get("count", 1))))
            if "malformed" in spec:
                self.queue.extend({"malformed": True} for _ in range(int(spec["malformed"])))
            if "body" in spec:
                self.queue.extend({"body": spec["body"]} for _ in range(int(spec.get("count", 1))))
            if "oversize" in spec:
                fault = {"oversize": int(spec["oversize"]), "chunked": bool(spec.get("chunked", False))}
                self.queue.extend(dict(fault) for _ in range(int(spec.get("count", 1))))
            if "delay" in spec:
                self.queue.extend({"delay": float(spec["delay"])} for _ in range(int(spec.get("count", 1))))

    def next(self, route: str = "chat") -> tuple[dict | None, float]:
        """The fault for the request that just arrived on ``route`` (``"chat"``, ``"batch"``: vLLM's
        batched chat, ``"generate"``: SGLang's) and its delay (None: answer normally); counted in
        ``stats[route + "_requests"]``."""
        with self.lock:
            self.stats[f"{route}_requests"] += 1
            fault = self.queue.popleft() if self.queue else None
            if fault is not None:
                self.stats["faults"] += 1
            return fault, self.latency + self.rng.uniform(0.0, self.jitter)

    def enter(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


class Memo:
    """Answers already given, by route and request body: a deterministic backend (greedy, float32) answers
    the same body the same way, so a suite that sends the same requests again (a reward re-reading the
    captions its scorer read) is answered without the model. Bounded: the oldest answer goes first."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.answers: dict[str, Any] = {}

    @staticmethod
    def key(path: str, body: Any) -> str:
        return path + "\n" + json.dumps(body, sort_keys=True)

    def get(self, key: str) -> Any:
        with self.lock:
            return self.answers.get(key)

    def put(self, key: str, payload: Any) -> None:
        with self.lock:
            if len(self.answers) >= self.size:
                del self.answers[next(iter(self.answers))]
            self.answers[key] = payload


def make_handler(backend: Any, model: str, faults: Faults, api_key: str | None = None, quiet: bool = True,
                 max_logprobs: int = MAX_TOP_LOGPROBS, memo: Memo | None = None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        memo_key: str | None = None  # the request's key in ``memo`` while it is answered by the model

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            if not quiet:
                super().log_message(format, *args)

        def _send(self, status: int, payload: Any = None, raw: bytes | None = None, headers: dict | None = None) -> None:
            body = raw if raw is not None else json.dumps(payload).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _send_answer(self, payload: Any) -> None:
            """A request answered: counted in ``stats["answered"]``, ``payload`` sent with status 200."""
            with faults.lock:
                faults.stats["answered"] += 1
            if memo is not None and self.memo_key is not None:
                memo.put(self.memo_key, payload)
            self._send(200, payload)

        def _send_chunked(self, status: int, body: bytes, chunk: int = 1 << 16) -> None:
            """Answer with ``Transfer-Encoding: chunked`` (no Content-Length: a client learns the size only
            by reading)."""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for at in range(0, len(body), chunk):
                    piece = body[at : at + chunk]
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: what a cap does
                self.close_connection = True

        def _fault(self, fault: dict) -> bool:
            """Answer with an injected fault; False when ``fault`` only delays the answer."""
            if "status" in fault:
                status = fault["status"]
                wait = fault.get("retry_after")
                headers = {"Retry-After": f"{float(wait):g}"} if wait is not None else None
                self._error(status, f"injected fault: HTTP {status}", "InjectedFault", headers)
                return True
            if "malformed" in fault:
                self._send(200, raw=b'{"id": "chatcmpl-broken", "choices": [{"index": 0, "mess')
                return True
            if "body" in fault:  # a lie: whatever JSON the test chose, as a 200 answer
                self._send(200, raw=json.dumps(fault["body"]).encode())
                return True
            if "oversize" in fault:  # a well-formed completion far past any max_tokens
                text = "9" * fault["oversize"]
                body = json.dumps(completion_body(model, {"text": text, "tokens": [], "finish_reason": "stop"}, False)).encode()
                if fault["chunked"]:
                    self._send_chunked(200, body)
                else:
                    self._send(200, raw=body)
                return True
            if "delay" in fault:
                time.sleep(fault["delay"])
            return False

        def _error(self, status: int, message: str, kind: str, headers: dict | None = None) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}}, headers=headers)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            if self.path in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "capreward"}]})
            elif self.path == "/requests":
                with faults.lock:
                    self._send(200, list(faults.bodies))
            elif self.path == "/stats":
                with faults.lock:
                    self._send(200, dict(faults.stats, pending_faults=len(faults.queue), in_flight=faults.in_flight))
            else:
                self._error(404, f"no route {self.path}", "NotFoundError")

        def _read_json(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                return json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError as exc:
                raise BadRequest(f"the body is not JSON: {exc}") from exc

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            try:
                body = self._read_json()
                if self.path == "/control":
                    faults.add(body)
                    self._send(200, {"ok": True})
                elif self.path in ROUTES:
                    with faults.lock:
                        faults.bodies.append(body)
                        fresh = not faults.queue and not faults.latency and not faults.jitter
                    self.memo_key = Memo.key(self.path, body) if memo is not None and fresh else None
                    known = None if self.memo_key is None else memo.get(self.memo_key)  # type: ignore[union-attr]
                    if known is not None:
                        with faults.lock:
                            faults.stats["memo_hits"] += 1
                            faults.stats[ROUTES[self.path] + "_requests"] += 1
                        self.memo_key = None
                        return self._send_answer(known)
                    faults.enter()
                    try:
                        getattr(self, "_" + ROUTES[self.path])(body)
                    finally:
                        faults.leave()
                        self.memo_key = None
                else:
                    self._error(404, f"no route {self.path}", "NotFoundError")
            except BadRequest as exc:
                self._error(400, str(exc), "BadRequestError")
            except Exception as exc:  # noqa: BLE001 - a backend failure is the server's (HTTP 500)
                self._error(500, f"{type(exc).__name__}: {exc}", "InternalServerError")

        def _admitted(self, route: str) -> bool:
            """The API key checked and the route's injected fault served; False when the request is
            answered already."""
            if api_key is not None:
                given = self.headers.get("Authorization", "")
                if given != f"Bearer {api_key}":
                    self._error(401, f"invalid API key: {given.removeprefix('Bearer ')}", "AuthenticationError")
                    return False
            fault, delay = faults.next(route)
            if delay:
                time.sleep(delay)
            return not (fault is not None and self._fault(fault))

        def _native(self) -> Any:
            rows = getattr(backend, "rows", None)
            if rows is None:
                raise BadRequest(f"the {backend.name} backend does not serve {self.path}")
            return rows

        def _generate(self, body: dict) -> None:
            """SGLang's native ``/generate`` (:func:`~capreward.testing.chat_server_native.sglang_generate`)."""
            from capreward.testing.chat_server_native import sglang_generate

            if not self._admitted("generate"):
                return None
            if isinstance(body, dict) and isinstance(body.get("text"), list):
                with faults.lock:
                    faults.stats["generate_batches"] += 1  # requests carrying a batch of prompts
            rows = self._native()
            with backend.lock:
                answer = sglang_generate(rows, body, decode_image, BadRequest)
            self._send_answer(answer)

        def _batch(self, body: dict) -> None:
            """vLLM's ``/v1/chat/completions/batch`` (:func:`~capreward.testing.chat_server_native.vllm_batch`)."""
            from capreward.judges.protocol import ChatRequest, ChatTurn
            from capreward.testing.chat_server_native import vllm_batch

            if not self._admitted("batch"):
                return None
            if body.get("model") != model:
                return self._error(404, f"the model {body.get('model')!r} does not exist", "NotFoundError")
            rows = self._native()
            conversations = body.get("messages")
            if not isinstance(conversations, list) or not conversations or not all(isinstance(c, list) for c in conversations):
                raise BadRequest("'messages' must be a non-empty list of conversations")
            if body.get("chat_template") is not None:
                raise BadRequest("this test server's batch route renders with its own template only")
            requests = []
            decoded: dict[str, Any] = {}  # one image of many conversations decoded once
            for conversation in conversations:
                turns = parse_messages(conversation, with_images=True, decoded=decoded)
                prefill_mode(body, turns)
                requests.append(ChatRequest(turns=tuple(ChatTurn(t["role"], t["text"], tuple(t["images"])) for t in turns)))
            with backend.lock:
                answer = vllm_batch(rows, requests, body, model, max_logprobs, BadRequest)
            self._send_answer(answer)

        def _chat(self, body: dict) -> None:
            if not self._admitted("chat"):
                return None
            request_model = body.get("model")
            if request_model != model:
                return self._error(404, f"the model {request_model!r} does not exist", "NotFoundError")
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))  # None: no limit
            logprobs = bool(body.get("logprobs"))
            top = int(body.get("top_logprobs") or 0)
            if top and not logprobs:
                raise BadRequest("top_logprobs requires logprobs=true")
            if not 0 <= top <= max_logprobs:
                raise BadRequest(f"top_logprobs must be in [0, {max_logprobs}], got {top}")
            if float(body.get("temperature", 1.0)) != 0.0 and not isinstance(backend, EchoBackend):
                raise BadRequest("this test server only decodes greedily (temperature 0)")
            stop = body.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            turns = parse_messages(body.get("messages"), with_images=not isinstance(backend, EchoBackend))
            chat_template = body.get("chat_template")  # vLLM's extra field: render the prompt with it
            if chat_template is not None and not isinstance(chat_template, str):
                raise BadRequest("chat_template must be a string")
            continue_final = prefill_mode(body, turns)
            prompt_logprobs = body.get("prompt_logprobs")  # vLLM's extra field
            if prompt_logprobs is not None and (not isinstance(prompt_logprobs, int) or prompt_logprobs < 0):
                raise BadRequest("prompt_logprobs must be a non-negative integer")
            answer = backend.answer(turns, None if max_tokens is None else int(max_tokens), top, stop, chat_template,
                                    continue_final, prompt_logprobs)
            self._send_answer(completion_body(model, answer, logprobs))

    return Handler


#: POST routes answered by a model, and the handler method of each.
ROUTES = {"/v1/chat/completions": "chat", "/v1/chat/completions/batch": "batch", "/generate": "generate"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the stdlib's 5 refuses connections under a burst of concurrent clients


def serve(port: int, backend: Any, model: str, faults: Faults, host: str = "127.0.0.1", api_key: str | None = None,
          max_logprobs: int = MAX_TOP_LOGPROBS, memo: bool = False) -> None:
    """Serve until SIGTERM/SIGINT (``memo``: answer a repeated request body from :class:`Memo`)."""
    handler = make_handler(backend, model, faults, api_key, max_logprobs=max_logprobs, memo=Memo() if memo else None)
    server = _Server((host, port), handler)
    # A test server holds nothing worth a slow interpreter shutdown (torch can take seconds): exit now.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="OpenAI-compatible chat-completions test server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", choices=("echo", "local", "text"), default="echo")
    parser.add_argument("--judge-dir", help="saved LLaVA judge directory (backend local) or text judge directory (backend text)")
    parser.add_argument("--model", default=None, help="served model name (default: the backend's name)")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    parser.add_argument("--max-logprobs", type=int, default=MAX_TOP_LOGPROBS,
                        help="the most top_logprobs a request may ask (vLLM's --max-logprobs, default 20)")
    parser.add_argument("--fault", action="append", default=[], help="a fault spec as JSON (see POST /control)")
    parser.add_argument("--memo", action="store_true",
                        help="answer a repeated request body (same route) with the answer it got, without the model")
    args = parser.parse_args(argv)
    if args.memo and args.api_key is not None:
        parser.error("--memo answers without checking a key: not with --api-key")
    if args.backend in ("local", "text"):
        if not args.judge_dir:
            parser.error(f"--backend {args.backend} needs --judge-dir")
        backend: Any = LocalBackend(args.judge_dir) if args.backend == "local" else TextBackend(args.judge_dir)
    else:
        backend = EchoBackend()
    faults = Faults()
    for spec in args.fault:
        faults.add(json.loads(spec))
    serve(args.port, backend, args.model or backend.name, faults, args.host, args.api_key, args.max_logprobs, args.memo)


# ------------------------------------------------------------------------------ test-side control
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ChatServer:
    """Starts, controls, kills and restarts a server process on 127.0.0.1.

    ``backend``: ``"echo"`` or ``"local"`` (then ``judge_dir``). ``port``: None picks a free one (kept
    across restarts). ``faults``: fault specs the process starts with. ``log_path``: where its
    stdout/stderr go (default: discarded). ``memo``: answer a repeated request body from the answers
    already given (a deterministic backend's answer to the same body; not with ``api_key``, nor while
    faults or latency are set). Use as a context manager; ``base_url`` is what
    :class:`~capreward.judges.remote.OpenAIJudge` takes.
    """

    def __init__(
        self,
        backend: str = "echo",
        *,
        judge_dir: str | os.PathLike | None = None,
        model: str = "test-judge",
        port: int | None = None,
        faults: Sequence[dict] = (),
        log_path: str | os.PathLike | None = None,
        start_timeout: float = 120.0,
        api_key: str | None = None,
        max_logprobs: int = MAX_TOP_LOGPROBS,
        memo: bool = False,
    ):
        self.api_key = api_key
        self.memo = memo
        self.max_logprobs = int(max_logprobs)
        self.backend, self.judge_dir, self.model = backend, judge_dir, model
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.faults = list(faults)
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def command(self, faults: Sequence[dict] | None = None) -> list[str]:
        cmd = [sys.executable, os.path.abspath(__file__), "--port", str(self.port), "--backend", self.backend]
        cmd += ["--model", self.model]
        if self.judge_dir is not None:
            cmd += ["--judge-dir", str(self.judge_dir)]
        if self.api_key is not None:
            cmd += ["--api-key", self.api_key]
        cmd += ["--max-logprobs", str(self.max_logprobs)]
        if self.memo:
            cmd.append("--memo")
        for spec in self.faults if faults is None else faults:
            cmd += ["--fault", json.dumps(spec)]
        return cmd

    def start(self, faults: Sequence[dict] | None = None, wait: bool = True) -> ChatServer:
        """Start the process (with ``faults``, default the constructor's) and, with ``wait``, block until
        ``/health`` answers. Raises RuntimeError when it exits or does not answer in time."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"the server on port {self.port} is already running")
        out: Any = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(self.command(faults), stdout=out, stderr=subprocess.STDOUT)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the chat server exited with status {self.process.returncode} (log: {self.log_path})")
            try:
                self.get("/health", timeout=1.0)
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.05)
        raise RuntimeError(f"the chat server on port {self.port} did not become ready in {self.start_timeout} s")

    def kill(self) -> None:
        """SIGKILL the process (no clean shutdown: connections in flight break) and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Terminate the process cleanly (SIGKILL after 10 s)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, faults: Sequence[dict] | None = None, wait: bool = True) -> ChatServer:
        """Kill and start again on the same port."""
        self.kill()
        return self.start(faults, wait)

    def get(self, path: str, timeout: float = 5.0) -> Any:
        with urllib.request.urlopen(f"http://{self.host}:{self.port}{path}", timeout=timeout) as response:
            return json.loads(response.read())

    def control(self, **spec: Any) -> dict:
        """Inject faults (see the module docstring), e.g. ``control(status=429, count=3)``."""
        request = urllib.request.Request(
            f"http://{self.host}:{self.port}/control",
            data=json.dumps(spec).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5.0) as response:
            return json.loads(response.read())

    def stats(self) -> dict:
        return self.get("/stats")

    def requests(self) -> list[dict]:
        """The JSON bodies of the last 64 requests to a model route, oldest first."""
        return self.get("/requests", timeout=60.0)

    def __enter__(self) -> ChatServer:
        if self.process is None or self.process.poll() is not None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


if __name__ == "__main__":
    main()
