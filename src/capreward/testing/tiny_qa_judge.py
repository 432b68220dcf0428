"""A tiny trained text-only judge for the QA-utility reward, for offline tests.

A two-layer LLaMA (:func:`~capreward.testing.tiny_llava.build_tiny_tokenizer` vocabulary, no vision)
trained to answer :data:`~capreward.scorers.claims_prompts.QA_TEMPLATE` about a one-colour world (the
FLEUR toy images: one colour each): the question "What colour is the image?" with the options red,
green, blue, yellow in that order (:func:`colour_questions`). It answers the letter of the colour the
description names; a description naming no colour gets a random letter, one naming two colours one of
the two (so its answer distribution is uniform over what the description allows: an expected accuracy
of 1/4 without a colour, 1/2 with a hallucinated second one). Trained once (a few minutes of one CPU
thread) and cached under ``$CAPREWARD_CACHE`` keyed by this module's source hash.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any
from collections.abc import Callable

import torch

from ..scorers.claims_prompts import LETTERS, prompt_words, qa_prompt
from .tiny_claim_judge import COLOURS, NOUNS, background_claim, claim_caption, empty_claim
from .cache import cache_root, install_directory, locked
from .portable import PORTABLE_LAYOUT, save_portable
from .tiny_llava import build_tiny_tokenizer

QUESTION = "What colour is the image?"


WORDS = tuple(dict.fromkeys(tuple(prompt_words()) + COLOURS + NOUNS + tuple(LETTERS[:4]) + (
    "What", "colour", "is", "the", "background", "chat", "USER", "ASSISTANT", "patch", "a", "there", "image", "in", "corner", "and", "photo", "of")))

_SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
STEPS = 800
#: The tiny judge's chat template (saved with its tokenizer, so any LocalTextJudge on the directory, e.g.
#: ``capreward score --qa-model DIR``, renders prompts as it was trained).
CHAT_TEMPLATE = "A chat.{% for message in messages %} USER: {{ message['content'] }} ASSISTANT:{% endfor %}"


def colour_questions(colour: str) -> list[dict]:
    """The question about an image of ``colour``, as a dataset column holds a sample's questions."""
    return [{"question": QUESTION, "options": list(COLOURS), "answer": COLOURS.index(colour)}]


def qa_example(rng: random.Random) -> tuple[str, str]:
    """(message, answer letter): a description naming 0-2 colours, and the question."""
    roll = rng.random()
    named = [] if roll < 0.2 else rng.sample(COLOURS, 2) if roll < 0.35 else [rng.choice(COLOURS)]
    claims = [background_claim(c, rng) for c in named]
    if not claims or rng.random() < 0.3:
        claims.insert(rng.randrange(len(claims) + 1), empty_claim(rng))
    answer = rng.choice(named or list(COLOURS))
    message = qa_prompt(claim_caption(claims, rng), QUESTION, list(COLOURS))
    return message, LETTERS[COLOURS.index(answer)]


def _build() -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(WORDS)
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=1, eos_token_id=2, initializer_range=0.1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return model, tokenizer


def _train(model: Any, tokenizer: Any, steps: int, log: Callable[[str], None] | None) -> None:
    from ..judges.local_text import LocalTextJudge

    judge = LocalTextJudge((model, tokenizer))
    rng = random.Random(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3, betas=(0.9, 0.98))
            for step in range(steps):
                batch = [qa_example(rng) for _ in range(16)]
                rows = [judge.encode(m) for m, _ in batch]
                targets = [tokenizer.convert_tokens_to_ids(a) for _, a in batch]
                width = max(len(r) for r in rows)
                ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, r in enumerate(rows):
                    ids[i, width - len(r):] = torch.tensor(r)
                    mask[i, width - len(r):] = 1
                positions = (mask.cumsum(1) - 1).clamp(min=0)
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits[:, -1]
                loss = torch.nn.functional.cross_entropy(logits, torch.tensor(targets))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                for group in optimizer.param_groups:  # linear decay to 10%
                    group["lr"] = 4e-3 * (1 - 0.9 * (step + 1) / steps)
                if log is not None and step % 100 == 0:
                    log(f"step {step}: loss {float(loss.detach()):.4f}")
    finally:
        torch.set_num_threads(threads)
        model.eval()
        model.requires_grad_(False)


def qa_judge_name() -> str:
    """Where the trained QA judge lives under the cache root: ``tiny_text/qa-<key>``, the key a hash of this
    module's source, the torch version, the on-disk layout and the steps (no transformers version: the
    directory is written in a layout every supported version reads, :mod:`capreward.testing.portable`)."""
    key = hashlib.sha256(f"{_SOURCE_HASH}|{torch.__version__}|layout{PORTABLE_LAYOUT}|{STEPS}".encode()).hexdigest()[:16]
    return f"tiny_text/qa-{key}"


def tiny_qa_judge_dir(cache_dir: str | os.PathLike | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Directory of the trained QA judge (``save_pretrained`` model and tokenizer), trained on first use."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / qa_judge_name()
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f".{target.name}.lock", what="training the tiny QA judge"):
        if not (target / "config.json").exists():
            import tempfile

            model, tokenizer = _build()
            _train(model, tokenizer, STEPS, log)
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
            save_portable(model, tokenizer, tmp)
            install_directory(tmp, target)
    return target


def tiny_qa_judge(cache_dir: str | os.PathLike | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the trained QA judge (its tokenizer carries :data:`CHAT_TEMPLATE`)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    path = tiny_qa_judge_dir(cache_dir)
    return LlamaForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def qa_backend(cache_dir: str | os.PathLike | None = None) -> Any:
    """:class:`~capreward.judges.LocalTextJudge` over the trained QA judge."""
    from ..judges.local_text import LocalTextJudge

    return LocalTextJudge(tiny_qa_judge(cache_dir), name="tiny-qa")


if __name__ == "__main__":
    print(tiny_qa_judge_dir(log=print))
