"""What a judge's tokenizer says about the answers the scorers read: the ids of the digit tokens, and
the text one generated token adds to an answer.

Local judges read these ids from the model's own tokenizer; a remote backend that scores chosen tokens
exactly (:class:`~capreward.judges.protocol.NextTokenScorer`) holds a copy of the served model's
tokenizer and asks for the same ids, so a remote exact score is the local one.
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Sequence


def digit_token_ids(tokenizer: Any) -> list[int]:
    """Token ids of the digits 0-9: ``encode(str(d))[-1]``, as FLEUR's released code takes them, each
    checked to decode to exactly its digit (digits are single tokens).

    Args:
        tokenizer: a ``transformers`` tokenizer.

    Returns:
        Ten distinct ids, for "0".."9".

    Raises:
        ValueError: the tokenizer writes a digit with no token of its own (it writes numbers whole), or
            two digits share an id.
    """
    ids = []
    for d in range(10):
        tid = tokenizer.encode(str(d))[-1]
        text = tokenizer.decode([tid]).strip()
        if text != str(d):
            raise ValueError(
                f"the tokenizer has no single token for the digit {d} (encode({str(d)!r})[-1] = {tid} "
                f"decodes to {text!r}); digit-distribution metrics need a tokenizer that splits digits"
            )
        ids.append(int(tid))
    if len(set(ids)) != 10:
        raise ValueError(f"digit token ids are not distinct: {ids}")
    return ids


def token_piece(tokenizer: Any, before: Sequence[int], token: int) -> str:
    """The text ``token`` adds after the tokens ``before`` (its leading space kept, as OpenAI-style token
    strings show it: a SentencePiece "▁The" after a word is " The").

    Args:
        tokenizer: a ``transformers`` tokenizer.
        before: the ids written just before (a few are enough).
        token: the id.

    Returns:
        The text, special tokens dropped.
    """
    head = tokenizer.decode(list(before), skip_special_tokens=True)
    full = tokenizer.decode(list(before) + [int(token)], skip_special_tokens=True)
    if full.startswith(head):
        return full[len(head):]
    return tokenizer.decode([int(token)], skip_special_tokens=True)


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object: ``tokenizer`` itself, or the one saved in a local directory (or the local
    cache of a hub name; nothing is downloaded).

    Args:
        tokenizer: a ``transformers`` tokenizer or processor, or a directory / model name.

    Returns:
        The tokenizer (a processor's ``tokenizer``).

    Raises:
        OSError: no tokenizer is saved there (and none is cached for that name).
    """
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.fspath(tokenizer), local_files_only=True)
    return getattr(tokenizer, "tokenizer", tokenizer)
