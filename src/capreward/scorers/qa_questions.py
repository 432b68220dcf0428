"""The multiple-choice questions of QA utility, and the one check every door applies to them.

Questions reach :class:`~capreward.scorers.qa_utility.QAUtility` from a dataset column (TRL), a label
(the reward server, veRL's ``extra_info``), veRL's reward manager, or the scorer's own API. Each door used
to check them its own way, and the dataset column not at all: 65 questions, options given as a string,
duplicate or empty options, a 150,000-character option, or JSON text nested 60,000 deep (a
``RecursionError`` out of the reward). :func:`questions_of` is the one check: a list (or JSON text of
one, decoded with bounded nesting) of 1 to :data:`MAX_QUESTIONS` questions of at most
:data:`MAX_QUESTION_CHARS` characters together, each a :class:`Question` with a non-blank question and
2 to 10 distinct, non-blank options given as a list (``"options": "ab"`` is not the two options "a" and
"b"). Anything else is :class:`InvalidQuestions` naming the item; a reward gives that sample None with
the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

from ..errors import CaprewardError
from ..text import capped
from .claims_prompts import LETTERS

#: The most questions one sample may carry, and the most characters of their text together (questions and
#: options): CapRL's datasets have a handful of short questions per image.
MAX_QUESTIONS = 64
MAX_QUESTION_CHARS = 100_000
#: Nesting of a JSON text of questions (a list of objects of lists is 3 deep).
MAX_JSON_DEPTH = 8


class InvalidQuestions(CaprewardError, ValueError):
    """Questions that cannot be asked; the message names the item (``questions[3][1]: ...``)."""


def _plain(value: Any) -> Any:
    """numpy arrays (how parquet-backed datasets hand over lists) as Python lists; others unchanged."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def _same(text: str) -> str:
    return " ".join(text.split()).casefold()


@dataclass(frozen=True)
class Question:
    """A multiple-choice question: ``question``, its ``options`` (2..10, distinct, non-blank) and
    ``answer``, the index of the correct option.

    Args:
        question: the question's text.
        options: the options, in order (a tuple of str).
        answer: the index of the correct option.

    Raises:
        ValueError: fewer than 2 or more than 10 options, a blank or repeated option, or an answer that
            is not an option's index.

    Examples:
        >>> from capreward.scorers.qa_questions import Question
        >>> Question.of({"question": "What colour?", "options": ["red", "blue"], "answer": "B"}).answer
        1
    """

    question: str
    options: tuple[str, ...]
    answer: int

    def __post_init__(self) -> None:
        if not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"a question needs 2..{len(LETTERS)} options, got {len(self.options)}")
        if not 0 <= self.answer < len(self.options):
            raise ValueError(f"answer {self.answer} is not an option index of {capped(self.question)}")
        seen: dict[str, int] = {}
        for k, option in enumerate(self.options):
            if not option.strip():
                raise ValueError(f"option {LETTERS[k]} is blank")
            if (first := seen.setdefault(_same(option), k)) != k:
                raise ValueError(f"options {LETTERS[first]} and {LETTERS[k]} are the same ({capped(option)})")

    @classmethod
    def of(cls, item: Any, where: str = "question") -> Question:
        """A :class:`Question` from itself or a mapping ``{"question", "options", "answer"}``.

        Args:
            item: a Question, or a mapping whose ``options`` are a list of str and ``answer`` a letter or
                an index.
            where: how an error names the item.

        Returns:
            The question.

        Raises:
            ValueError / TypeError: a malformed item, naming ``where``.
        """
        if isinstance(item, Question):
            return item
        if not isinstance(item, Mapping):
            raise TypeError(f"{where} must be a Question or a mapping, got {type(item).__name__}")
        try:
            text, options, answer = item["question"], _plain(item["options"]), _plain(item["answer"])
        except KeyError as exc:
            raise ValueError(f"{where} has no {capped(exc.args[0])}") from None
        if not isinstance(options, (list, tuple)):  # "ab" is no list of the options "a" and "b"
            raise TypeError(f"{where}: options must be a list of strings, got {type(options).__name__}")
        if not isinstance(text, str) or not all(isinstance(o, str) for o in options):
            raise TypeError(f"{where}: question and options must be strings")
        if not text.strip():
            raise ValueError(f"{where}: the question is blank")
        if isinstance(answer, str):
            if len(answer.strip()) != 1 or answer.strip().upper() not in LETTERS[: len(options)]:
                raise ValueError(f"{where}: answer {capped(answer)} is not one of the option letters")
            answer = LETTERS.index(answer.strip().upper())
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise TypeError(f"{where}: answer must be a letter or an index")
        try:
            return cls(text, tuple(options), answer)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def questions_of(value: Any, where: str = "questions") -> list[Question] | None:
    """The questions of one sample, checked as every door checks them (see the module docstring).

    Args:
        value: None (no questions: the judge writes them), a list of questions (:meth:`Question.of`) or
            JSON text of one.
        where: how an error names the sample's questions (``"questions[3]"``, ``"labels[0]"``).

    Returns:
        The questions, or None for None.

    Raises:
        InvalidQuestions: JSON that does not decode or nests too deeply, not a list, an empty list, more
            than :data:`MAX_QUESTIONS` questions or :data:`MAX_QUESTION_CHARS` characters, or a malformed
            question, naming it.
    """
    value = _plain(value)
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > 4 * MAX_QUESTION_CHARS:  # JSON escapes and layout: still far above any real list
            raise InvalidQuestions(f"{where}: questions of {len(value)} characters of JSON; at most {MAX_QUESTION_CHARS} "
                                   "characters of text")
        from ..json_limits import JSONLimitError, JSONLimits, loads

        try:
            value = loads(value, JSONLimits(max_depth=MAX_JSON_DEPTH, max_string_chars=MAX_QUESTION_CHARS,
                                            max_array_length=MAX_QUESTIONS), where=where)
        except JSONLimitError as exc:  # nested too deeply (never a RecursionError), too many questions, ...
            raise InvalidQuestions(f"questions as JSON text: {exc}") from None
        except (ValueError, RecursionError) as exc:
            raise InvalidQuestions(f"{where}: questions are a str but not a JSON list ({str(exc)[:200]})") from None
    if not isinstance(value, (list, tuple)):
        raise InvalidQuestions(f"{where}: questions must be a list of question objects, got {type(value).__name__}")
    if not value:
        raise InvalidQuestions(f"{where}: questions is an empty list (leave it out to have the judge write them)")
    if len(value) > MAX_QUESTIONS:
        raise InvalidQuestions(f"{where}: {len(value)} questions; at most {MAX_QUESTIONS}")
    out, chars = [], 0
    for k, item in enumerate(value):
        try:
            q = Question.of(item, f"{where}[{k}]")
        except (TypeError, ValueError) as exc:
            raise InvalidQuestions(str(exc)) from None
        chars += len(q.question) + sum(len(o) for o in q.options)
        if chars > MAX_QUESTION_CHARS:
            raise InvalidQuestions(f"{where}: questions of more than {MAX_QUESTION_CHARS} characters together")
        out.append(q)
    return out


def parse_questions(text: str) -> list[Question]:
    """Questions from a generator's answer: lines ``question | option ... | letter`` (other lines and
    malformed questions are skipped).

    Args:
        text: the generator's answer.

    Returns:
        The questions, in order.
    """
    out = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 4:
            continue
        try:
            out.append(Question.of({"question": fields[0], "options": fields[1:-1], "answer": fields[-1]}))
        except (ValueError, TypeError):
            continue
    return out[:MAX_QUESTIONS]
