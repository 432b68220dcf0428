"""Where a prompt's tokens end in a query decoded from prompt + response token ids.

OpenRLHF's rollout (``SingleTurnAgentExecutor.execute``, openrlhf 0.11) tokenises the prompt with the
policy's tokenizer (``tokenizer(text=prompt, add_special_tokens=False)``), appends the generated ids and
POSTs ``query = tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=False)`` with
``prompts = [prompt]``; OpenRLHF before 0.10 decoded left-padded batches, so pad and BOS tokens precede
the prompt there. The decoded prompt is not always the prompt as sent (a tokenizer that normalises text,
NFKC or lower case, or drops what it cannot encode), and searching the query for the prompt text then
finds nothing, or a copy of it that the response wrote.

:class:`PromptTokens` finds the response start from the prompt's tokens instead: the query must begin,
after leading special tokens (padding, BOS) and the whitespace between them, with the decoded prompt
tokens; the response is everything after them, whatever it repeats. Anything else is not a query of that
prompt (None: the server answers 400).

>>> from capreward.testing import build_tiny_tokenizer
>>> tok = build_tiny_tokenizer(["USER", "ASSISTANT", "Describe"])
>>> tokens = PromptTokens(tok)
>>> prompt = "USER: Describe. ASSISTANT:"
>>> ids = tok(text=prompt, add_special_tokens=False)["input_ids"] + tok(" a dog.", add_special_tokens=False)["input_ids"]
>>> query = tok.decode([tok.pad_token_id, tok.bos_token_id] + ids, skip_special_tokens=False)
>>> query[tokens.response_start(query, prompt):]
' a dog.'
"""

from __future__ import annotations

import functools
import os
from typing import Any


class PromptTokens:
    """The policy's tokenizer, read to find where a prompt's tokens end in a decoded query.

    Args:
        tokenizer: a ``transformers`` tokenizer (what OpenRLHF's rollout used), or a local directory
            holding one (loaded with ``local_files_only``: nothing is downloaded).

    Raises:
        ValueError: ``tokenizer`` is a path that holds no tokenizer.
    """

    def __init__(self, tokenizer: Any):
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", []) if str(t)}
        #: special token strings, longest first (so that ``<s>`` never cuts ``<s_x>``)
        self.specials: tuple[str, ...] = tuple(sorted(specials, key=len, reverse=True))
        self._decoded = functools.lru_cache(maxsize=4096)(self._decode_prompt)

    def _decode_prompt(self, prompt: str) -> str:
        ids = self.tokenizer(text=prompt, add_special_tokens=False)["input_ids"]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def decoded_prompt(self, prompt: str) -> str:
        """The prompt as it reads in a query: its tokens (``add_special_tokens=False``, as OpenRLHF
        tokenises it) decoded with the special tokens kept."""
        return self._decoded(prompt)

    def response_start(self, query: str, prompt: str) -> int | None:
        """The index in ``query`` where ``prompt``'s tokens end, or None when ``query`` does not begin
        with them (after leading special tokens and the whitespace between them)."""
        decoded = self.decoded_prompt(prompt)
        at = self._skip_specials(query)
        for start in (at, len(query) - len(query[at:].lstrip())):  # tokenizers that decode "<s> USER"
            if decoded and query.startswith(decoded, start):
                return start + len(decoded)
            stripped = decoded.lstrip()
            if stripped and stripped != decoded and query.startswith(stripped, start):
                return start + len(stripped)
        return None

    def _skip_specials(self, query: str) -> int:
        at = 0
        while True:
            rest = len(query) - len(query[at:].lstrip())
            token = next((t for t in self.specials if query.startswith(t, rest)), None)
            if token is None:
                return at
            at = rest + len(token)


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer saved in the local directory ``path`` (never downloaded); ValueError naming the
    path when there is none."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise ValueError(f"prompt tokenizer {os.fspath(path)!r} is not a directory holding a tokenizer")
    try:
        return AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"prompt tokenizer {os.fspath(path)!r}: no tokenizer could be loaded ({exc})") from None
