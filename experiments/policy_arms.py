"""Policy-side arms shared by the experiments: captioning with a tiny LLaVA, supervised steps, and
rejection-sampling fine-tuning (online best-of-n distillation) with the same samples GRPO would draw.

Every function takes the policy ``(model, processor)`` (a tiny LLaVA of :mod:`capreward.testing`) and the
user prompt; the prompt is rendered as TRL renders it for the policy (chat template + generation prompt),
so the arms and GRPO see the same text.

- :func:`caption` : greedy and sampled captions of images;
- :func:`supervise` : ``steps`` supervised steps on (image, caption) pairs drawn by a callback;
- :func:`best_of_n_distillation` : per step, ``k`` captions sampled per image by the current policy at
  temperature 1 (GRPO's group), the one the reward ranks first kept, one supervised step on the kept captions.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import torch


def prompt_text(processor: Any, prompt: str) -> str:
    """``prompt`` as TRL renders it for the policy (one user turn with the image, then the generation prompt)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def caption(model: Any, processor: Any, images: Sequence[Any], prompt: str, samples: int = 0, seed: int = 0,
            max_new_tokens: int = 16, greedy: bool = True, batch: int = 64) -> tuple[list[str], list[list[str]]]:
    """Greedy captions (one per image; empty when ``greedy`` is False) and ``samples`` captions per image at
    temperature 1 (no top-k/top-p). Deterministic for ``seed``; the global RNG and the model's mode are kept."""
    text = prompt_text(processor, prompt)
    was_training = model.training
    model.eval()
    devices = [] if not torch.cuda.is_available() else None

    def run(ims: list[Any], **kw: Any) -> list[str]:
        out: list[str] = []
        for lo in range(0, len(ims), batch):
            part = ims[lo:lo + batch]
            enc = processor(images=part, text=[text] * len(part), return_tensors="pt", padding=True)
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, **kw)
            out += [c.strip() for c in processor.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]
        return out

    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            g = run(list(images), do_sample=False) if greedy else []
            flat = run([im for im in images for _ in range(samples)], do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if samples else []
    finally:
        model.train(was_training)
    return g, [flat[i * samples:(i + 1) * samples] for i in range(len(images))] if samples else [[] for _ in images]


class Supervisor:
    """Supervised steps on (image, caption) pairs: AdamW at a constant ``lr``, the loss on the caption's
    tokens and the end of sequence only (the prompt is masked)."""

    def __init__(self, model: Any, processor: Any, prompt: str, lr: float = 3e-3):
        self.model, self.processor = model, processor
        self.text = prompt_text(processor, prompt)
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)

    def step(self, images: Sequence[Any], captions: Sequence[str]) -> float:
        """One optimiser step on the pairs; returns the loss."""
        model, processor = self.model, self.processor
        model.train()
        n_prompt = processor(images=[images[0]], text=[self.text], return_tensors="pt")["input_ids"].shape[1]
        enc = processor(images=list(images), text=[f"{self.text} {c}</s>" for c in captions], return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100
        # left padding: each row's prompt ends ``n_prompt`` tokens after its first real token
        first = enc["attention_mask"].argmax(dim=1)
        for i, f in enumerate(first.tolist()):
            labels[i, : f + n_prompt] = -100
        out = model(**enc, labels=labels)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        self.optimizer.step()
        model.eval()
        return float(out.loss.detach())


def supervise(model: Any, processor: Any, prompt: str, draw: Callable[[random.Random], tuple[list[Any], list[str]]],
              steps: int, seed: int, lr: float = 3e-3) -> list[float]:
    """``steps`` supervised steps, each on the (images, captions) batch ``draw(rng)`` returns; the losses."""
    rng = random.Random(f"supervise-{seed}")
    sup = Supervisor(model, processor, prompt, lr)
    return [sup.step(*draw(rng)) for _ in range(steps)]


def best_of_n_distillation(model: Any, processor: Any, prompt: str, rows: Sequence[dict[str, Any]], reward: Callable[..., list],
                           steps: int, seed: int, k: int = 4, images_per_step: int = 16, lr: float = 3e-3,
                           max_new_tokens: int = 16, columns: Sequence[str] = ()) -> dict[str, list[float]]:
    """Rejection-sampling fine-tuning: each step draws ``images_per_step`` rows of ``rows`` (with their
    ``image`` and the dataset ``columns`` the reward reads), samples ``k`` captions per image from the
    current policy at temperature 1 (GRPO's group: the same samples GRPO would score), scores them with
    ``reward`` (TRL's contract, called by keyword), keeps each image's top caption (first on ties) and
    takes one supervised step on the kept captions. An unscored caption (None) is never kept: an image
    whose ``k`` captions are all unscored is left out of the step, and a step with no image left is skipped
    (its loss NaN), as GRPO learns nothing from a group without a score.

    Returns:
        Per step: ``reward`` (mean over the scored samples), ``kept`` (mean reward of the kept captions),
        ``loss``, ``kept_images`` (how many images the step trained on).
    """
    rng = random.Random(f"best-of-n-{seed}")
    sup = Supervisor(model, processor, prompt, lr)
    log: dict[str, list[float]] = {"reward": [], "kept": [], "loss": [], "kept_images": []}
    for step in range(steps):
        batch = [rng.choice(rows) for _ in range(images_per_step)]
        images = [r["image"] for r in batch]
        _, samples = caption(model, processor, images, prompt, samples=k, seed=seed * 100_003 + step, greedy=False,
                             max_new_tokens=max_new_tokens)
        flat = [c for cs in samples for c in cs]
        kwargs = {c: [r[c] for r in batch for _ in range(k)] for c in columns}
        values = reward(prompts=[prompt] * len(flat), completions=flat, image=[im for im in images for _ in range(k)], **kwargs)
        values = [float("-inf") if v is None else float(v) for v in values]
        best = [max(range(i * k, (i + 1) * k), key=lambda j: (values[j], -j)) for i in range(len(batch))]
        kept = [(i, j) for i, j in enumerate(best) if values[j] != float("-inf")]
        finite = [v for v in values if v != float("-inf")]
        log["reward"].append(sum(finite) / len(finite) if finite else float("nan"))
        log["kept"].append(sum(values[j] for _, j in kept) / len(kept) if kept else float("nan"))
        log["kept_images"].append(len(kept))
        log["loss"].append(sup.step([images[i] for i, _ in kept], [flat[j] for _, j in kept]) if kept else float("nan"))
    return log
