"""A local text-only judge: a causal language model answering prompts about a caption with exact
first-token distributions (the QA-utility reward's answerer), or greedy text."""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Sequence

import torch

from .caller_text import Data, control_token_ids, encode_parts, fill_parts
from .prompts import LLAVA_V1_SYSTEM, render_chat_template
from .protocol import ChatRequest, ChatResponse, SyncBackendMixin


class LocalTextJudge(SyncBackendMixin):
    """A local causal language model (no vision) that answers with exact first-token distributions: the
    text judge of the QA-utility reward (:class:`~capreward.scorers.qa_utility.QAUtility`), which reads
    the probability of each option letter.

    Prompts are rendered with the tokenizer's chat template when it has one (message text inserted as
    data), else the Vicuna v1 format (``system USER: message ASSISTANT:``); message text is encoded
    without special tokens. :meth:`generate` greedy-decodes (for question generation on a text judge).

    Args:
        model: ``(model, tokenizer)``, or a directory / hub name loaded with ``AutoModelForCausalLM``.
        batch_size: messages per forward pass of :meth:`next_token_probs`.
        name: the judge's name in logs and cache keys (default ``local-text:<model path>``).
        system: the system line of the Vicuna v1 format (used without a chat template).

    Examples:
        >>> from capreward.judges import LocalTextJudge
        >>> from capreward.testing.tiny_llava import build_tiny_tokenizer
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> tokenizer = build_tiny_tokenizer(["a", "red", "image", "A", "B"])
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, pad_token_id=tokenizer.pad_token_id))
        >>> judge = LocalTextJudge((model, tokenizer), name="tiny")
        >>> probs = judge.next_token_probs(["a red image", "a red image A"])
        >>> probs.shape == (2, len(tokenizer)), [round(float(p), 6) for p in probs.sum(dim=1)]
        (True, [1.0, 1.0])
    """

    def __init__(self, model: Any, *, batch_size: int = 32, name: str | None = None, system: str = LLAVA_V1_SYSTEM):
        if isinstance(model, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)  # never a folder's own code
            model = AutoModelForCausalLM.from_pretrained(model, trust_remote_code=False)
        else:
            model, tokenizer = model
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.system = system
        self.name = name or f"local-text:{getattr(model.config, '_name_or_path', '') or 'model'}"
        self._control = control_token_ids(tokenizer)

    def parts(self, message: str) -> list[str | Data]:
        template = getattr(self.tokenizer, "chat_template", None)
        if template:
            marker = "\ue000message\ue001"
            text = render_chat_template(template, [{"role": "user", "content": marker}],
                                        bos_token=self.tokenizer.bos_token or "", eos_token=self.tokenizer.eos_token or "")
            bos = self.tokenizer.bos_token or ""
            text = text[len(bos):] if bos and text.startswith(bos) else text
            return fill_parts(text, {marker: message})
        return [f"{self.system} USER: ", Data(message), " ASSISTANT:"]

    def encode(self, message: str) -> list[int]:
        return encode_parts(self.tokenizer, self.parts(message), self._control)

    @torch.inference_mode()
    def next_token_probs(self, messages: Sequence[str]) -> torch.Tensor:
        """The probabilities of the first answer token of each message (left-padded batches; positions
        count real tokens only, so a row does not depend on its batch).

        Args:
            messages: the user messages (text only).

        Returns:
            An (N, V) float64 tensor on the CPU, one distribution over the vocabulary per message.
        """
        out = []
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for start in range(0, len(messages), self.batch_size):
            rows = [self.encode(m) for m in messages[start : start + self.batch_size]]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, width - len(r):] = torch.tensor(r)
                mask[i, width - len(r):] = 1
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                position_ids=positions.to(device), logits_to_keep=1).logits[:, -1, :]
            out.append(torch.softmax(logits.double(), dim=-1).cpu())
        return torch.cat(out) if out else torch.zeros((0, 0), dtype=torch.float64)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """Greedy answers (text only) to single-turn text requests.

        Args:
            requests: chat requests whose last turn's text is the message (``max_tokens`` bounds the
                answer; 256 when unset).

        Returns:
            One :class:`~capreward.judges.protocol.ChatResponse` per request, its text stripped.
        """
        responses = []
        eos = self.tokenizer.eos_token_id
        for request in requests:
            ids = torch.tensor([self.encode(request.turns[-1].text)])
            new: list[int] = []
            with torch.inference_mode():
                for _ in range(request.max_tokens or 256):
                    logits = self.model(input_ids=torch.tensor([ids[0].tolist() + new])).logits[0, -1]
                    token = int(logits.argmax())
                    if token == eos:
                        break
                    new.append(token)
            text = str(self.tokenizer.decode(new, skip_special_tokens=True))
            responses.append(ChatResponse(text.strip(), finish_reason="stop"))
        return responses
