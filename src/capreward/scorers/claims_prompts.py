"""Prompts of the claim-level reward (:mod:`capreward.scorers.claims`) and of the QA-utility reward
(:mod:`capreward.scorers.qa_utility`).

Every prompt is a template whose slots are filled in one pass (:func:`~capreward.judges.caller_text.fill_once`)
and whose slot text is caller text (a claim, a caption, a question): local judges receive it as
:class:`~capreward.judges.caller_text.Data` (never special tokens), servers receive it escaped. Each
question asks for a one-word answer (``yes``/``no``, or an option letter) so the answer's probability is
read at the first answer token, exactly from the logits on a local judge and from the listed
alternatives on a server.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..judges.caller_text import fill_once

#: Bump when a prompt below changes: it is part of every cache key of the claim reward.
CLAIMS_PROMPT_VERSION = "claims-1"

#: Verification of one claim against the visual (FaithScore's / DCScore's per-unit question).
VERIFY_TEMPLATE = "Look at the image. Is this statement about the image true?\nStatement: {claim}\nAnswer yes or no."

#: Coverage of one reference claim by a caption (DCScore's recall matching, asked per unit).
COVERAGE_TEMPLATE = (
    "Read the description. Does the description state this fact?\nDescription: {caption}\nFact: {claim}\n"
    "Answer yes or no."
)

#: The judge's own inventory of the visual (used as reference claims when no references are given).
INVENTORY_PROMPT = "List the facts about the image. Write one short sentence per fact."

#: A judge-based splitter: rewrite a caption as atomic facts, one per line.
SPLIT_TEMPLATE = "Rewrite the description as a list of short atomic facts, one per line.\nDescription: {caption}"

#: The QA-utility question: the caption alone, a multiple-choice question, one letter as the answer.
QA_TEMPLATE = (
    "Answer the question using only the description.\nDescription: {caption}\nQuestion: {question}\n"
    "{options}\nAnswer with the letter of the correct option."
)

#: Question generation for QA utility (a VLM writes questions about the visual; cached per visual).
QA_GENERATION_PROMPT = (
    "Write multiple-choice questions about the image. For each question write one line:\n"
    "question | option A | option B | option C | option D | correct letter"
)

LETTERS = "ABCDEFGHIJ"


def verify_prompt(claim: str) -> str:
    """The verification message for ``claim`` (filled in one pass: a claim holding "{claim}" stays text)."""
    return fill_once(VERIFY_TEMPLATE, {"{claim}": claim})


def coverage_prompt(caption: str, claim: str) -> str:
    """The coverage message: does ``caption`` state the reference ``claim``?"""
    return fill_once(COVERAGE_TEMPLATE, {"{caption}": caption, "{claim}": claim})


def split_prompt(caption: str) -> str:
    """The judge-splitter message for ``caption``."""
    return fill_once(SPLIT_TEMPLATE, {"{caption}": caption})


def qa_options(options: Sequence[str]) -> str:
    """Options as lines "A. ...", "B. ..." (at most :data:`LETTERS` of them)."""
    if not 2 <= len(options) <= len(LETTERS):
        raise ValueError(f"a question needs 2..{len(LETTERS)} options, got {len(options)}")
    return "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))


def qa_prompt(caption: str, question: str, options: Sequence[str]) -> str:
    """The QA-utility message: ``question`` with lettered ``options``, answered from ``caption`` alone."""
    return fill_once(QA_TEMPLATE, {"{caption}": caption, "{question}": question, "{options}": qa_options(options)})


def prompt_words() -> list[str]:
    """Every alphabetic word of these prompts (for a tiny judge's vocabulary)."""
    texts = [VERIFY_TEMPLATE, COVERAGE_TEMPLATE, INVENTORY_PROMPT, SPLIT_TEMPLATE, QA_TEMPLATE, QA_GENERATION_PROMPT]
    return list(dict.fromkeys(w for t in texts for w in re.findall(r"[A-Za-z']+", t) if w not in ("claim", "caption")))
