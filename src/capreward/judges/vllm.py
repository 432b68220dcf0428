"""A vLLM server as a judge that scores chosen next tokens exactly, in one request per group of queries.

:class:`VLLMJudge` is :class:`~capreward.judges.remote.OpenAIJudge` (chat completions, vLLM's prefill
fields, ``prompt_logprobs``) plus :meth:`VLLMJudge.next_token_logprobs`: every
:class:`~capreward.judges.protocol.NextTokenQuery` of a group (a caption's digit tree: 102 prefilled
conversations) goes in one ``POST /v1/chat/completions/batch`` request (vLLM's batched chat endpoint,
``messages`` a list of conversations, one choice per conversation), each conversation continued from its
prefix (``continue_final_message``, ``add_generation_prompt=false``) for one token, with the asked ids
in ``logprob_token_ids`` (their log-probabilities at that position, whatever their rank) and
``return_tokens_as_token_ids`` (entries named ``"token_id:N"``, so an id is never guessed from text)::

    {"model": "...", "messages": [[...conversation 1..., {"role": "assistant", "content": "<prefix 1>"}], ...],
     "max_tokens": 1, "temperature": 0.0, "logprobs": true, "logprob_token_ids": [id, ...],
     "return_tokens_as_token_ids": true, "continue_final_message": true, "add_generation_prompt": false}

Why not ``prompt_logprobs`` (the log-probability of each prompt token, with the top k, on a prefilled
continuation)? It reads the actual token exactly, but a chat request carries one conversation, so each
digit missing from a position's top k costs one more request (the fallback of
:mod:`capreward.scorers.remote_numbers`); the completions endpoint takes many prompts but no images; and
the batched chat endpoint returns no prompt log-probabilities. ``logprob_token_ids`` on the batched
endpoint reads the exact distribution over the asked tokens at every context of a tree, images
included, in one request (vLLM with the batched chat endpoint and ``logprob_token_ids`` on its OpenAI
routes: 2026 releases; an older server answers 404 or 400, and the readers then fall back to the digit
tree of one-token requests on a plain :class:`~capreward.judges.remote.OpenAIJudge`).
"""

from __future__ import annotations

import re
from typing import Any
from collections.abc import Sequence

from .protocol import NextTokenQuery, assistant_turn
from .remote import MalformedResponse, NextTokenServerJudge, to_messages
from .vocab import load_tokenizer

_TOKEN_ID = re.compile(r"token_id:(\d+)")


class VLLMJudge(NextTokenServerJudge):
    """A `JudgeBackend` on a vLLM server that also scores chosen next tokens exactly
    (:class:`~capreward.judges.protocol.NextTokenScorer`).

    Args:
        base_url: the server's OpenAI root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: the served model name.
        tokenizer: the served model's tokenizer (a ``transformers`` tokenizer or processor, or the local
            directory / cached hub name it is saved in): the ids the exact readers ask for.
        max_batch: the most conversations one next-token request carries (see
            :class:`~capreward.judges.sglang.SGLangJudge`).
        **options: :class:`~capreward.judges.remote.OpenAIJudge`'s (``api_key_env`` defaults to None here:
            a local server).

    Raises:
        OSError: ``tokenizer`` names no saved tokenizer.

    Examples:
        >>> from capreward.judges import VLLMJudge, NextTokenScorer
        >>> from capreward.testing import tiny_judge_dir
        >>> judge = VLLMJudge("http://127.0.0.1:8000/v1", "llava", tiny_judge_dir())
        >>> isinstance(judge, NextTokenScorer), judge.name
        (True, 'llava')
    """

    def __init__(self, base_url: str, model: str, tokenizer: Any, *, max_batch: int = 512, **options: Any):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        options.setdefault("api_key_env", None)
        super().__init__(base_url, model, **options)
        self.tokenizer = load_tokenizer(tokenizer)
        self.max_batch = max_batch

    def __repr__(self) -> str:
        return f"VLLMJudge(base_url={self.base_url!r}, model={self.model!r}, max_concurrency={self.max_concurrency})"

    def _batch_key(self, query: NextTokenQuery) -> Any:
        # one request's conversations share the prefill flags and the template
        return bool(query.prefix), query.request.chat_template

    def _next_token_body(self, chunk: Sequence[NextTokenQuery], encode: Any) -> tuple[str, dict]:
        messages = []
        for query in chunk:
            if query.request.prefilled:
                raise ValueError("a next-token query continues a conversation that ends with a user turn")
            turns = tuple(query.request.turns) + ((assistant_turn(query.prefix),) if query.prefix else ())
            messages.append(to_messages(turns, self.system, encode))
        ids = sorted({int(t) for query in chunk for t in query.token_ids})
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            self.token_limit_param: 1,
            "temperature": 0.0,
            "logprobs": True,
            "logprob_token_ids": ids,
            "return_tokens_as_token_ids": True,
            **self.extra_body,
        }
        if chunk[0].prefix:
            body.update(continue_final_message=True, add_generation_prompt=False)
        if chunk[0].request.chat_template is not None:
            body["chat_template"] = chunk[0].request.chat_template
        return "/chat/completions/batch", body

    def _next_token_maps(self, reply: Any, chunk: Sequence[NextTokenQuery]) -> list[dict]:
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        if [c["index"] for c in choices] != list(range(len(chunk))):
            raise MalformedResponse(f"the server answered choices {[c['index'] for c in choices]} for {len(chunk)} conversations")
        maps = []
        for choice in choices:
            first = choice["logprobs"]["content"][0]
            listed: dict[int, Any] = {}
            for entry in (first, *first.get("top_logprobs", ())):
                match = _TOKEN_ID.fullmatch(str(entry["token"]))
                if match is None:
                    raise MalformedResponse(f"a listed token is {entry['token']!r}, not 'token_id:N'")
                listed.setdefault(int(match.group(1)), entry["logprob"])
            maps.append(listed)
        return maps


__all__ = ["VLLMJudge"]
