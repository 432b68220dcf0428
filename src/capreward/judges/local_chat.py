"""The chat protocol (:mod:`capreward.judges.protocol`) on a local LLaVA-style judge.

:class:`LocalChatJudge` turns :class:`~capreward.judges.protocol.ChatRequest` s into LLaVA v1
conversations, runs them in batches through :class:`~capreward.judges.local.LocalJudge` (prefill with
prefix sharing, then decoding on the device, :meth:`~capreward.judges.local.LocalJudge.generate_from`) and answers with the text, each token's log-probability
and its top alternatives, as an OpenAI-compatible server would. Its responses also carry the generated
token ids (:class:`LocalChatResponse`), which :meth:`LocalChatJudge.integer_distributions` uses to read the
*exact* distribution over the answers "0".."100" at a score position, digit by digit (local tokenizers
split numbers into digits, so no single token carries "85").
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import SampleError, exception_kind
from ..metrics.gveval import NUM_SCORES, digit_tree_distribution
from .decoding import DecodeOutput
from .local import LocalJudge
from .caller_text import Data, fill_parts, render
from .prompts import IMAGE_PLACEHOLDER, render_chat_template
from .protocol import ChatRequest, ChatResponse, SyncBackendMixin, TokenLogprob, visual_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalChatResponse(ChatResponse):
    """A :class:`ChatResponse` that also holds the generated token ids (``tokens[i]`` is ``token_ids[i]``)."""

    token_ids: tuple[int, ...] = ()


def _row(offset: int | Sequence[int], i: int) -> int:
    """The index in the caller's list of request ``i`` of a batch: ``offset + i`` for a batch of
    consecutive requests, ``offset[i]`` for one given by its indices (image and video requests batched
    apart)."""
    return offset + i if isinstance(offset, int) else offset[i]


class LocalChatJudge(SyncBackendMixin):
    """A `JudgeBackend` on a local model.

    Args:
        judge: a `LocalJudge`, or anything ``LocalJudge`` accepts as its model (a name, a directory, a
            ``(model, processor)`` pair).
        batch_size: requests per prefill.
        seed: for sampled decoding (``temperature > 0``).
        name: the model identifier used in cache keys (default: the model's ``name_or_path``).
        parse_special_tokens: encode message text as servers such as vLLM do (see below; tests only).

    Reported log-probabilities are those of the model's distribution (before temperature), as vLLM
    reports them.

    Conversations must alternate user/assistant turns, start and end with a user turn, and hold exactly
    one image, in the first user turn (LLaVA-1.5's format), or, for a family that takes video
    (Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision), one video (:attr:`~capreward.judges.protocol.ChatTurn.videos`: its frames go
    through the family's video processor and fill the template's video slot); other requests get a
    response with ``error`` set. Image and video requests run in separate batches (:meth:`batches`). Generation stops at the end-of-sequence token, a ``stop`` string or ``max_tokens``.

    Message text is data: the conversation's structure (roles, turn ends, the image slot) comes from the
    template only, and the text of every turn is encoded without special tokens (a caption's "</s>" is
    four characters, its "<image>" no image slot). ``parse_special_tokens=True`` encodes message text as
    servers such as vLLM do (special-token strings in it become special tokens); it exists to model such
    a server in tests (`capreward.testing.chat_server`), never to score with.

    Examples:
        >>> import random
        >>> from capreward.testing import fleur_task_image
        >>> red = fleur_task_image("red", random.Random(0))
        >>> from capreward.judges import ChatRequest, LocalChatJudge, user_turn
        >>> from capreward.testing import tiny_vlm_judge
        >>> judge = LocalChatJudge(tiny_vlm_judge())      # (model, processor) of a local LLaVA
        >>> [answer] = judge.generate([ChatRequest(turns=(user_turn("What colour is the square?", [red]),), max_tokens=8)])
        >>> isinstance(answer.text, str)
        True
    """

    def __init__(
        self,
        judge: Any,
        *,
        batch_size: int = 8,
        seed: int = 0,
        name: str | None = None,
        parse_special_tokens: bool = False,
    ):
        self.judge = judge if isinstance(judge, LocalJudge) else LocalJudge(judge)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        config_name = getattr(self.judge.model.config, "_name_or_path", "") or "local-llava"
        self.name = name or f"local:{config_name}"
        self.parse_special_tokens = bool(parse_special_tokens)

    # ------------------------------------------------------------------------------------ prompts
    def render(self, request: ChatRequest) -> str:
        """The LLaVA v1 prompt text of ``request`` (ends with ``"ASSISTANT:"``). Raises ValueError when the
        conversation does not fit the format (see the class docstring)."""
        return render(self.render_parts(request))

    def render_parts(self, request: ChatRequest) -> list[str | Data]:
        """`render()` as prompt parts: template text as ``str``, the text of every turn as
        `Data`."""
        turns = request.turns
        if not turns:
            raise ValueError("the request has no turns")
        n_images = sum(len(t.images) for t in turns)
        n_videos = sum(len(t.videos) for t in turns)
        if n_images + n_videos != 1 or not (turns[0].images or turns[0].videos):
            raise ValueError(
                f"a local judge needs exactly one image or video, in the first user turn (got {n_images} images, "
                f"{n_videos} videos)"
            )
        pairs: list[tuple[str, str | None]] = []
        for i, turn in enumerate(turns):
            expected = "user" if i % 2 == 0 else "assistant"
            if turn.role != expected:
                raise ValueError(f"turn {i} has role {turn.role!r}; turns must alternate user/assistant from a user turn")
            if expected == "user":
                pairs.append((turn.text, None))
            else:
                pairs[-1] = (pairs[-1][0], turn.text)
        if turns[-1].role != "user":
            raise ValueError("the last turn must be a user turn")
        video = n_videos == 1
        if request.chat_template is not None:
            if video:
                raise ValueError("a request with a chat_template cannot carry a video (its template writes images)")
            return self._render_template(request)
        return self.judge.conversation_parts(pairs, video=video)

    def _render_template(self, request: ChatRequest) -> list[str | Data]:
        """The prompt ``request.chat_template`` renders (as a server honouring vLLM's ``chat_template``
        field would), images as the judge's placeholder; a leading BOS is dropped (the tokenizer adds it).

        The template is rendered once with a unique marker in place of each turn's text, then each marker
        is replaced by that text as `Data`: a single pass, so turn text is never read as template."""
        marker = f"\ue000{uuid.uuid4().hex}:"
        messages, texts = [], {}
        for k, turn in enumerate(request.turns):
            key = f"{marker}{k}\ue001"
            texts[key] = turn.text
            parts: list[dict] = [{"type": "image"} for _ in turn.images]
            parts.append({"type": "text", "text": key})
            messages.append({"role": turn.role, "content": parts if turn.images else key})
        tok = self.judge.tokenizer
        bos = tok.bos_token or ""
        assert request.chat_template is not None  # render_parts calls this only for a request with one
        text = render_chat_template(request.chat_template, messages, bos_token=bos, eos_token=tok.eos_token or "")
        text = text.replace(IMAGE_PLACEHOLDER, self.judge.image_placeholder)
        text = text[len(bos) :] if bos and text.startswith(bos) else text
        return fill_parts(text, texts)

    def _prepare(self, requests: Sequence[ChatRequest], offset: int | Sequence[int] = 0):
        """Prompt ids and image (or video) features for the valid requests; errors for the others
        (``requests`` are the caller's requests from index ``offset`` on, or at the indices ``offset``,
        which errors name). The requests of one call carry images only or videos only (:meth:`batches`);
        equal visuals (by pixels) are encoded once and share their prefix."""
        judge = self.judge
        prompts, visuals, image_index, errors, video = self._read_requests(requests, offset)
        features = None
        if visuals:
            try:
                pixels = judge.preprocess_videos(visuals) if video else judge.preprocess(visuals)
            except ValueError as exc:  # videos of different frame counts or grids: every request of the batch
                return [None] * len(requests), None, image_index, [e or str(exc) for e in errors]
            features = judge.image_features(pixels)
        n_image = int(features.shape[1]) if features is not None else 0
        prompt_ids = self._encode_requests(requests, offset, prompts, errors, n_image)
        return prompt_ids, features, image_index, errors

    def _read_requests(self, requests: Sequence[ChatRequest], offset: int | Sequence[int]):
        """The text side of :meth:`_prepare`: each request's prompt parts (None and an error when it does not
        fit the format), its distinct visuals (equal pixels once), each request's visual index, and whether
        the batch holds videos."""
        images: list[Any] = []
        image_keys: dict[Any, int] = {}
        image_index: list[int] = []
        prompts: list[str | list[str | Data] | None] = []
        errors: list[SampleError | None] = []
        kinds = {r.visual_kind == "video" for r in requests}
        if len(kinds) > 1:
            raise ValueError("one batch holds image and video requests: split them (LocalChatJudge.batches)")
        for request in requests:
            try:
                parts = self.render_parts(request)
                prompts.append(render(parts) if self.parse_special_tokens else parts)
                errors.append(None)
            except ValueError as exc:
                prompts.append(None)
                errors.append(SampleError(_row(offset, len(errors)), exception_kind(exc), "", str(exc)))
                image_index.append(-1)
                continue
            first = request.turns[0]
            visual: Any
            if first.videos:
                visual = tuple(frame.convert("RGB") for frame in first.videos[0])
                key = visual_key(tuple(first.videos[0]))
            else:
                visual = first.images[0].convert("RGB")
                key = visual_key(first.images[0])
            if key not in image_keys:
                image_keys[key] = len(images)
                images.append(visual)
            image_index.append(image_keys[key])
        return prompts, images, image_index, errors, kinds == {True}

    def _encode_requests(self, requests, offset, prompts, errors, n_image: int) -> list[list[int] | None]:
        """Prompt ids of the valid requests (the visual placeholder expanded to ``n_image`` tokens), in one
        tokenizer call; a prompt that cannot be encoded or that leaves no room for its answer in the
        judge's context gets its error in ``errors`` (changed in place) and None."""
        judge = self.judge
        names = [f"request {offset + i}" for i in range(len(requests))] if isinstance(offset, int) else [f"request {i}" for i in offset]
        prompt_ids: list[list[int] | None] = [None] * len(requests)
        valid = [i for i, p in enumerate(prompts) if p is not None]
        encoded = {}
        try:  # one tokenizer call for the batch; should one prompt fail, each alone names its own error
            encoded = dict(zip(valid, judge.encode_prompts([prompts[i] for i in valid], n_image)))
        except ValueError:
            for i in valid:
                try:
                    encoded[i] = judge.encode_prompts([prompts[i]], n_image, names=[names[i]])[0]
                except ValueError as exc:  # this request only
                    errors[i] = SampleError(_row(offset, i), "input", "", str(exc))
        for i, ids in encoded.items():
            wanted = requests[i].max_tokens if requests[i].max_tokens is not None else 1
            if len(ids) + wanted > judge.context_length:
                errors[i] = SampleError(_row(offset, i), "limit", "", (
                    f"prompt of {len(ids)} tokens plus max_tokens={wanted} exceeds the judge's "
                    f"context of {judge.context_length} positions"
                ))
            else:
                prompt_ids[i] = ids
        return prompt_ids

    # ---------------------------------------------------------------------------------- generation
    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """Answer every request (see the class docstring for the conversations it accepts).

        Args:
            requests: the conversations to continue.

        Returns:
            One :class:`~capreward.judges.protocol.ChatResponse` per request, ``result[i]`` for
            ``requests[i]``; a request that cannot be answered has ``error`` set (the call does not raise).
        """
        requests = list(requests)
        out: list[ChatResponse | None] = [None] * len(requests)
        for rows in self.batches(requests):
            offset = rows[0] if rows == list(range(rows[0], rows[0] + len(rows))) else rows
            for i, response in zip(rows, self._generate_batch([requests[i] for i in rows], offset)):
                out[i] = response
        return cast(list[ChatResponse], out)  # every request is in one batch

    def batches(self, requests: Sequence[ChatRequest]) -> list[list[int]]:
        """Indices of ``requests`` in batches of at most ``batch_size`` that hold image requests only or
        video requests only (a batch's visuals go through one processor call), in order."""
        groups: dict[bool, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.visual_kind == "video", []).append(i)
        out: list[list[int]] = []
        for rows in sorted(groups.values()):
            out.extend(rows[s : s + self.batch_size] for s in range(0, len(rows), self.batch_size))
        return sorted(out)

    @torch.inference_mode()
    def _generate_batch(self, requests: list[ChatRequest], offset: int | list[int]) -> list[ChatResponse]:
        judge = self.judge
        prompt_ids, features, image_index, errors = self._prepare(requests, offset)
        rows = [i for i, p in enumerate(prompt_ids) if p is not None]
        responses: list[ChatResponse] = [ChatResponse(text="", error=e) for e in errors]
        if not rows:
            return responses
        # max_tokens=None: no limit but the context (as a server without a max_tokens field)
        budgets = [
            requests[i].max_tokens if requests[i].max_tokens is not None else judge.context_length - len(prompt_ids[i])
            for i in rows
        ]
        k = max(requests[i].top_logprobs for i in rows)
        generator = torch.Generator(device=judge.device)
        generator.manual_seed(self.seed + (offset if isinstance(offset, int) else offset[0]))
        state = judge.start([prompt_ids[i] for i in rows], features, [image_index[i] for i in rows])
        out = judge.generate_from(state, budgets, temperatures=[requests[i].temperature for i in rows],
                                  generator=generator, logprobs=True, top_logprobs=k)
        return self._responses(requests, rows, prompt_ids, out, responses)

    def _responses(self, requests, rows, prompt_ids, out: DecodeOutput, responses: list) -> list[ChatResponse]:
        """``responses`` with those of ``rows`` filled from the decoded ``out`` (row r of ``out`` is request
        ``rows[r]``): the answer cut at a stop string, each token's text piece, log-probability and top
        alternatives."""
        assert out.logprobs is not None  # _generate_batch asks for them
        for r, i in enumerate(rows):
            request = requests[i]
            tokens = out.tokens[r]
            reason = "stop" if out.finished[r] else "length"
            tokens, text, stopped = self._apply_stop(tokens, request.stop)
            if stopped:
                reason = "stop"
            context = list(prompt_ids[i][-3:])
            logprobs = []
            for j, tok in enumerate(tokens):
                before = context + tokens[max(0, j - 3) : j] if j < 3 else tokens[j - 3 : j]
                ranked: list[tuple[str, float]] = []
                if out.top_ids is not None and out.top_logprobs is not None and request.top_logprobs > 0:
                    for alt, lp in zip(out.top_ids[r][j][: request.top_logprobs], out.top_logprobs[r][j][: request.top_logprobs]):
                        ranked.append((self._piece(before, alt), lp))
                top: dict[str, float] = {}
                for piece, lp in ranked:
                    top.setdefault(piece, lp)
                logprobs.append(TokenLogprob(self._piece(before, tok), out.logprobs[r][j], top, tuple(ranked)))
            responses[i] = LocalChatResponse(
                text=text, tokens=tuple(logprobs), finish_reason=reason, token_ids=tuple(int(t) for t in tokens)
            )
        return responses

    def _piece(self, before: list[int], token: int) -> str:
        """The text ``token`` adds after the tokens ``before`` (keeps its leading space, as OpenAI-style
        token strings do)."""
        tok = self.judge.tokenizer
        head = tok.decode(before, skip_special_tokens=True)
        full = tok.decode(list(before) + [int(token)], skip_special_tokens=True)
        if full.startswith(head):
            return full[len(head) :]
        return tok.decode([int(token)], skip_special_tokens=True)

    def _apply_stop(self, tokens: list[int], stop: Sequence[str]) -> tuple[list[int], str, bool]:
        """Cut the answer at the first stop string: the text ends before it; the tokens end with the one
        that completed it."""
        text = self.judge.decode(tokens)
        hits = [text.find(s) for s in stop if s and s in text]
        if not hits:
            return tokens, text, False
        cut = min(hits)
        for n in range(1, len(tokens) + 1):
            if len(self.judge.decode(tokens[:n])) > cut:
                return tokens[:n], text[:cut].rstrip(), True
        return tokens, text[:cut].rstrip(), True

    # ---------------------------------------------------------------------- exact score distribution
    def number_prefix(self, token_ids: Sequence[int], marker: str | None = None) -> list[int] | None:
        """The generated tokens before the number to read: after the first token at which the decoded
        answer contains ``marker`` (None: from the start), up to the first digit token. Returns None when
        there is no marker or no digit after it."""
        digits = set(self.judge.digit_token_ids())
        ids = [int(t) for t in token_ids]
        start = 0
        if marker is not None:
            found = next((n for n in range(1, len(ids) + 1) if marker in self.judge.decode(ids[:n])), None)
            if found is None:
                return None
            start = found
        at = next((j for j in range(start, len(ids)) if ids[j] in digits), None)
        return None if at is None else ids[:at]

    @torch.inference_mode()
    def integer_distributions(
        self, requests: Sequence[ChatRequest], prefixes: Sequence[Sequence[int]], max_branch_rows: int = 64
    ) -> np.ndarray:
        """Exact probabilities (N, 101) float64 of each answer "0".."100" being written next.

        Row n continues ``requests[n]`` with the generated tokens ``prefixes[n]`` (e.g. up to "$"), then
        asks for the probability that the model writes the digits of k and then any non-digit token, for
        every k in 0..100 (`digit_tree_distribution()`). The tree needs, per
        row, the state after the prefix, after each first digit (10 branches), after each two-digit number
        (90 branches) and after "100"; the branches share the prompt's image prefix (held once per image) and
        each holds a copy of its row's own tokens only, ``max_branch_rows`` rows at a time. Rows sum to
        at most 1. Raises ValueError naming the request that cannot be run.
        """
        judge = self.judge
        if len(prefixes) != len(requests):
            raise ValueError(f"{len(prefixes)} prefixes for {len(requests)} requests")
        out = np.zeros((len(requests), NUM_SCORES), dtype=np.float64)
        for rows in self.batches(requests):
            prompt_ids, features, image_index, errors = self._prepare([requests[i] for i in rows], rows)
            for j, err in enumerate(errors):
                if err is not None:
                    raise ValueError(f"request {rows[j]}: {err}")
            ids = [list(p) + [int(t) for t in prefixes[rows[j]]] for j, p in enumerate(prompt_ids)]
            state = judge.start(ids, features, image_index, reserve=4)
            out[rows] = self._tree(state, max_branch_rows)
        return out

    def _tree(self, state, max_branch_rows: int) -> np.ndarray:
        """The digit tree for every row of ``state``. Level-1 branches (row, first digit) are run
        ``max_branch_rows`` at a time and each chunk's level-2 branches right after it, so at most one
        chunk of each level holds copies of its rows' own tokens at any time."""
        judge = self.judge
        digits = torch.tensor(judge.digit_token_ids(), device=state.logits.device)
        digit_list = [int(d) for d in digits.tolist()]
        n = state.batch_size
        chunk = max(1, int(max_branch_rows))

        def digit_probs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """p(each digit) (.., 10) and p(end) = p(any non-digit) (..,), float64."""
            p = torch.softmax(logits.double(), dim=-1).index_select(-1, digits)
            return p, (1.0 - p.sum(-1)).clamp(min=0.0)

        def fork(parent, rows: list[int], tokens: list[int]):
            """Copies of ``rows`` of ``parent`` (repeats allowed), each fed one token."""
            child = judge.select(parent, rows, reserve=2)
            return judge.step(child, torch.tensor(tokens, device=digits.device))

        first, _ = digit_probs(state.logits)  # (n, 10)
        second = torch.zeros((n, 10, 10), dtype=torch.float64)
        end1 = torch.zeros((n, 10), dtype=torch.float64)
        end2 = torch.zeros((n, 10, 10), dtype=torch.float64)
        third_zero = torch.zeros(n, dtype=torch.float64)
        end3 = torch.zeros(n, dtype=torch.float64)
        level1 = [(r, a) for r in range(n) for a in range(10)]  # row r followed by digit a
        for s1 in range(0, len(level1), chunk):
            part = level1[s1 : s1 + chunk]
            one = fork(state, [r for r, _ in part], [digit_list[a] for _, a in part])
            p1, e1 = digit_probs(one.logits)
            for m, (r, a) in enumerate(part):
                second[r, a], end1[r, a] = p1[m].cpu(), e1[m].cpu()
            # Level 2: (row, a, b) for a >= 1 ("05" is not a number), children of this chunk only.
            level2 = [(m, b) for m, (_, a) in enumerate(part) if a > 0 for b in range(10)]
            for s2 in range(0, len(level2), chunk):
                sub = level2[s2 : s2 + chunk]
                two = fork(one, [m for m, _ in sub], [digit_list[b] for _, b in sub])
                p2, e2 = digit_probs(two.logits)
                for k, (m, b) in enumerate(sub):
                    r, a = part[m]
                    end2[r, a, b] = float(e2[k])
                    if a == 1 and b == 0:  # "10" -> "100"
                        third_zero[r] = float(p2[k, 0])
                        three = fork(two, [k], [digit_list[0]])
                        end3[r] = float(digit_probs(three.logits)[1][0])
                del two
            del one
        out = np.zeros((n, NUM_SCORES), dtype=np.float64)
        for r in range(n):
            out[r] = digit_tree_distribution(
                first[r].cpu().numpy(), end1[r].numpy(), second[r].numpy(), end2[r].numpy(), float(third_zero[r]), float(end3[r])
            )
        return out
