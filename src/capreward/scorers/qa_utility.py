"""QA utility (CapRL's reward): how well a vision-free judge answers questions about the visual from the
caption alone.

Xing et al., "CapRL: Stimulating Dense Image Caption Capabilities via Reinforcement Learning" (2025):
a text-only LLM answers multiple-choice questions about the image given only the caption; the reward is
its accuracy. :class:`QAUtility` asks :data:`~capreward.scorers.claims_prompts.QA_TEMPLATE` per
(caption, question) and reads the probability of each option letter at the first answer token; the
sample's value is the **expected accuracy**: the mean over its questions of P(correct letter)
(normalised over the option letters by default). CapRL samples answers several times and averages;
the expectation is that average's limit, exact on a local judge (a softmax over the vocabulary, no
sampling) and read from the listed log-probabilities on a server.

Questions come per sample (a dataset column: a list of :class:`~capreward.scorers.qa_questions.Question`
or dicts with ``question``, ``options`` (a list) and ``answer``, a letter or an index, or JSON text of
such a list; checked by :func:`~capreward.scorers.qa_questions.questions_of`, the one check of every
door: a sample whose questions fail it gets NaN and the reason), or are generated once per visual by a VLM
(``question_backend``; :data:`~capreward.scorers.claims_prompts.QA_GENERATION_PROMPT`, one
``question | A | B | C | D | letter`` line each) and cached by the visual's content. Caption, question
and options are data in the prompt: never special tokens on a local judge, escaped for a server.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Sequence

import numpy as np

from ..errors import SampleError, kind_of
from ..caption_reading import read_caption
from ..judges.caller_text import is_blank
from ..judges.injection import injection_reasons
from ..judges.local_text import LocalTextJudge
from ..judges.protocol import ChatRequest, JudgeBackend, NextTokenQuery, answer_problem, scores_next_tokens, user_turn
from ..media import media_key
from ..metrics.logprobs import MalformedAnswer, listed_probabilities
from .claims import _Cache
from .claims_prompts import CLAIMS_PROMPT_VERSION, LETTERS, QA_GENERATION_PROMPT, qa_prompt
from .qa_questions import InvalidQuestions, Question, parse_questions, questions_of
from .fleur import judge_visuals
from .contract import Scores, floats
from .validation import caption_list

log = logging.getLogger(__name__)




def letter_token_ids(tokenizer: Any, n: int) -> list[list[int]]:
    """For each of the first ``n`` option letters, the ids of the tokens that read as that letter."""
    vocab = tokenizer.get_vocab()
    out: list[list[int]] = [[] for _ in range(n)]
    for piece, i in vocab.items():
        bare = piece.replace("▁", "").replace("Ġ", "").strip()
        if len(bare) == 1 and bare in LETTERS[:n] and tokenizer.decode([i]).strip() == bare:
            out[LETTERS.index(bare)].append(int(i))
    for k, ids in enumerate(out):
        if not ids:
            raise ValueError(f"the judge's tokenizer has no token that reads as {LETTERS[k]!r}")
    return out


# ---------------------------------------------------------------------------------------- the scorer
@dataclass
class QAUtilityResult:
    """Per-sample results for N candidates: ``score`` (N,) expected accuracy in [0, 1] (NaN: no score,
    ``error`` says why); ``n_questions`` (N,); ``answers`` per sample, the probability of each question's
    correct option; ``injection`` as the other judge scorers report it."""

    score: np.ndarray
    n_questions: np.ndarray
    answers: list[list[float]]
    error: list[SampleError | None]
    injection: list[str | None]

    def __len__(self) -> int:
        return len(self.error)


class QAUtility:
    """Expected multiple-choice accuracy of a text-only judge reading only the caption.

    Args:
        backend: a :class:`~capreward.judges.LocalTextJudge` (exact) or any chat backend answering text-only requests (a
            server: the listed log-probabilities of the first answer token).
        question_backend: a VLM backend that writes questions about a visual when a sample has none
            (generated once per visual, cached); None: every sample must bring its questions.
        normalise: P(correct letter) over the option letters' total (default) or over the vocabulary.
        max_questions: questions used per sample (the first ones).
        top_logprobs: alternatives asked of a server.
        cache_size: answers and question sets kept in memory.
        question_max_tokens: the generation budget of a question set.

    Raises:
        ValueError: ``max_questions`` below 1.

    Examples:
        >>> from capreward.scorers.qa_utility import QAUtility
        >>> from capreward.testing.tiny_qa_judge import colour_questions, qa_backend
        >>> qa = QAUtility(qa_backend())
        >>> r = qa.score(["a red ball.", "a photo."], questions=[colour_questions("red")] * 2)
        >>> bool(r.score[0] > 0.9 > 0.5 > r.score[1])
        True
    """

    name = "qa_utility"

    def __init__(
        self,
        backend: Any,
        *,
        question_backend: JudgeBackend | None = None,
        normalise: bool = True,
        max_questions: int = 16,
        top_logprobs: int = 20,
        cache_size: int = 65536,
        question_max_tokens: int = 512,
    ):
        if max_questions < 1:
            raise ValueError(f"max_questions must be at least 1, got {max_questions}")
        self.backend = backend
        self.question_backend = question_backend
        self.normalise = bool(normalise)
        self.max_questions = int(max_questions)
        self.top_logprobs = int(top_logprobs)
        self.cache = _Cache(cache_size)
        self.question_max_tokens = int(question_max_tokens)
        self.judge_calls = 0

    @property
    def exact(self) -> bool:
        return isinstance(self.backend, LocalTextJudge)

    def generated_questions(self, images: Sequence[Any] | None, videos: Sequence[Any] | None, n: int) -> list[tuple[list[Question] | None, str | None]]:
        """Questions written by ``question_backend`` for each sample's visual (once per visual, cached)."""
        if self.question_backend is None:
            raise ValueError("samples without questions need question_backend= (a VLM that writes them)")
        visuals, index = judge_visuals(images, videos, n)
        found: dict[int, tuple[list[Question] | None, str | None]] = {}
        todo = []
        for u, visual in enumerate(visuals):
            vk = media_key(visual)
            key = self.cache.key("questions", self.question_backend.name, CLAIMS_PROMPT_VERSION, str(vk)) if vk else None
            got = self.cache.get(key) if key else None
            if got is not None:
                found[u] = (got, None)
            else:
                todo.append((u, key))
        if todo:
            requests = [ChatRequest(turns=(user_turn(QA_GENERATION_PROMPT, [visuals[u]]),), max_tokens=self.question_max_tokens)
                        for u, _ in todo]
            for (u, key), response in zip(todo, self.question_backend.generate(requests)):
                if not response.ok:
                    found[u] = (None, SampleError(None, kind_of(response.error, "judge_unavailable"), "",
                                                  f"question generation failed: {response.error}"))
                    continue
                qs = parse_questions(response.text)
                if qs and key:
                    self.cache.put(key, qs)
                found[u] = (qs, None) if qs else (None, SampleError(None, "judge_unreadable", "",
                                                                    "the question generator wrote no parsable question"))
        return [found[index[i]] for i in range(n)]

    def _probabilities(self, items: list[tuple[str, Question]]) -> list[tuple[float, str | None]]:
        """P(correct option) for each (caption, question), or NaN and why."""
        out: list[tuple[float, str | None] | None] = [None] * len(items)
        keys = [self.cache.key("qa", self.backend.name, CLAIMS_PROMPT_VERSION, c, q.question, *q.options, str(q.answer))
                for c, q in items]
        todo: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            got = self.cache.get(key)
            if got is not None:
                out[i] = got
            else:
                todo.setdefault(key, []).append(i)
        order = list(todo)
        messages = [qa_prompt(items[todo[k][0]][0], items[todo[k][0]][1].question, items[todo[k][0]][1].options) for k in order]
        self.judge_calls += len(messages)
        results = self._ask(messages, [items[todo[k][0]][1] for k in order], [items[todo[k][0]][0] for k in order])
        for key, value in zip(order, results):
            if value[1] is None:
                self.cache.put(key, value)
            for i in todo[key]:
                out[i] = value
        return out  # type: ignore[return-value]

    def _ask(self, messages: list[str], questions: list[Question], groups: Sequence[Any] | None = None) -> list[tuple[float, str | None]]:
        """P(correct option) per message: exact on a local text judge and on a backend that scores next
        tokens (the option letters' token ids, one request per group: ``groups[i]``, the caption), else from
        the listed alternatives of a one-token answer."""
        if not messages:
            return []
        if not self.exact and scores_next_tokens(self.backend):
            return self._ask_next_tokens(messages, questions, groups)
        if self.exact:
            probs = self.backend.next_token_probs(messages)
            n_max = max(len(q.options) for q in questions)
            letters = letter_token_ids(self.backend.tokenizer, n_max)
            out: list[tuple[float, str | None]] = []
            for row, q in zip(probs, questions):
                per = [float(row[letters[k]].sum()) for k in range(len(q.options))]
                total = sum(per) if self.normalise else 1.0
                out.append((per[q.answer] / total, None) if total > 0 else (0.0, SampleError(None, "judge_unreadable", "", "no probability on any option letter")))
            return out
        requests = [ChatRequest(turns=(user_turn(m),), max_tokens=1, temperature=0.0, top_logprobs=self.top_logprobs)
                    for m in messages]
        out = []
        for response, q in zip(self.backend.generate(requests), questions):
            if not response.ok or not response.tokens:
                out.append((math.nan, SampleError(None, kind_of(response.error, "judge_unavailable"), "", response.error)
                            if not response.ok else
                            SampleError(None, "judge_unreadable", "", "the backend returned no token log-probabilities")))
                continue
            first = response.tokens[0]
            per = [0.0] * len(q.options)
            seen = set()
            try:
                problem = answer_problem(response)
                if problem is not None:
                    raise MalformedAnswer(problem)
                listed = listed_probabilities(first.ranked or tuple(first.top.items()), "the answer token's alternatives")
            except MalformedAnswer as exc:
                out.append((math.nan, SampleError(None, "judge_unreadable", "", f"malformed answer: {exc}")))
                continue
            for text, prob in listed:
                bare = text.strip().rstrip(".):")
                if text in seen or len(bare) != 1 or bare not in LETTERS[: len(q.options)]:
                    continue
                seen.add(text)
                per[LETTERS.index(bare)] += prob
            total = sum(per) if self.normalise else 1.0
            # no listed letter: no option was chosen, which is worth what a wrong answer is (0)
            out.append((per[q.answer] / total if total > 0 else 0.0, None))
        return out

    def _ask_next_tokens(self, messages: list[str], questions: list[Question], groups: Sequence[Any] | None) -> list[tuple[float, str | None]]:
        n_max = max(len(q.options) for q in questions)
        letters = letter_token_ids(self.backend.tokenizer, n_max)
        groups = list(groups) if groups is not None else [None] * len(messages)
        queries = []
        for m, q, g in zip(messages, questions, groups):
            ids = tuple(t for k in range(len(q.options)) for t in letters[k])
            queries.append(NextTokenQuery(ChatRequest(turns=(user_turn(m),), max_tokens=1), "", ids, g))
        out: list[tuple[float, str | None]] = []
        for answer, q in zip(self.backend.next_token_logprobs(queries), questions):
            if not answer.ok:
                out.append((math.nan, SampleError(None, kind_of(answer.error, "judge_unavailable"), "", answer.error)))
                continue
            p, at, per = answer.probabilities(), 0, []
            for k in range(len(q.options)):
                per.append(sum(p[at : at + len(letters[k])]))
                at += len(letters[k])
            total = sum(per) if self.normalise else 1.0
            out.append((per[q.answer] / total, None) if total > 0 else
                       (0.0, SampleError(None, "judge_unreadable", "", "no probability on any option letter")))
        return out

    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None,
               questions: Sequence[Sequence[Any] | None] | None = None) -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`; references are not read): the
        expected accuracy, ``n_questions`` and ``answers`` (P(correct option) per question)."""
        res = self.score(list(captions), questions=questions, images=images, videos=videos)
        n = len(res.error)
        subs: dict[str, list[Any]] = {"n_questions": [int(c) for c in res.n_questions], "answers": [list(map(float, a)) for a in res.answers]}
        return Scores(score=floats(res.score, n), sub_scores=subs, errors=list(res.error), result=res)

    def score(
        self,
        candidates: Sequence[str],
        *,
        questions: Sequence[Sequence[Any] | None] | None = None,
        images: Sequence[Any] | None = None,
        videos: Sequence[Any] | None = None,
    ) -> QAUtilityResult:
        """Expected accuracy of each caption on its questions (``questions[n]``; a sample without
        questions gets the ones ``question_backend`` writes for ``images[n]`` / ``videos[n]``). A
        sample whose questions are malformed or over the bounds
        (:func:`~capreward.scorers.qa_questions.questions_of`) gets NaN and the reason.

        Args:
            candidates: the captions.
            questions: per caption, its questions (:class:`Question` s or mappings with ``question``,
                ``options`` and ``answer``, a letter or an index), or None for generated ones.
            images: per caption, the image questions are generated for (with ``question_backend``).
            videos: per caption, the video questions are generated for.

        Returns:
            A :class:`QAUtilityResult`: expected accuracy per caption, its question count, the
            probability of each question's correct option, per-sample errors and injection flags.

        Raises:
            TypeError / ValueError: malformed inputs (lengths that differ, captions that are not text),
                naming the item.
        """
        candidates = caption_list(candidates)
        n = len(candidates)
        if questions is not None and len(questions) != n:
            raise ValueError(f"{n} candidates but {len(questions)} question lists")
        per_sample: list[list[Question] | None] = [None] * n
        errors: list[SampleError | None] = [None] * n
        for i in range(n):
            try:  # a list, or JSON text of one (a dataset column): checked as every door checks them
                per_sample[i] = questions_of(questions[i] if questions is not None else None, f"questions[{i}]")
            except InvalidQuestions as exc:  # this sample gets no score, with the reason
                per_sample[i], errors[i] = [], SampleError(i, "input", "", str(exc))
        missing = [i for i in range(n) if per_sample[i] is None]
        if missing:
            if images is None and videos is None:
                raise ValueError(f"sample {missing[0]} has no questions and no visual to write them for")
            generated = self.generated_questions(
                [images[i] for i in missing] if images is not None else None,
                [videos[i] for i in missing] if videos is not None else None, len(missing))
            for i, (qs, why) in zip(missing, generated):
                per_sample[i], errors[i] = qs, SampleError.of(why, i)
        items, owner = [], []
        for i, c in enumerate(candidates):
            if is_blank(c):
                errors[i] = SampleError(i, "input", "", "empty caption")
            if errors[i] is not None or not per_sample[i]:
                errors[i] = errors[i] or SampleError(i, "input", "", "no questions for this sample")
                continue
            caption = read_caption(c).text
            for q in (per_sample[i] or [])[: self.max_questions]:
                items.append((caption, q))
                owner.append(i)
        values = self._probabilities(items)
        answers: list[list[float]] = [[] for _ in range(n)]
        for i, (p, why) in zip(owner, values):
            answers[i].append(p)
            if why is not None and errors[i] is None:
                errors[i] = SampleError(i, kind_of(why, "judge_unreadable"), "", f"question not answered: {why}")
        score = np.full(n, np.nan)
        counts = np.zeros(n, dtype=np.int64)
        for i in range(n):
            counts[i] = len(answers[i])
            if errors[i] is None and answers[i]:
                score[i] = float(np.mean(answers[i]))
        for i, e in enumerate(errors):
            if e is not None:
                log.info("qa_utility sample %d: %s", i, e)
        return QAUtilityResult(score, counts, answers, errors, injection_reasons(candidates))
