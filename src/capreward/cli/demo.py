"""``capreward demo``: what the rewards see, and a GRPO run that optimises them, on tiny local models.

Nothing is downloaded: the CLIP is the tiny one of :mod:`capreward.testing` trained for a few seconds to
know colour words (:mod:`capreward.testing.trained_clip`, cached), so its scores mean something on a
toy task (:mod:`capreward.testing.colour_task`):

1. **Foils.** The sample clips tinted red, green, blue and yellow; each tinted clip gets its true
   caption ("a red image.") and a foil that swaps the colour word. EMScore and CLIP-S score both, and
   the hallucination penalty (threshold calibrated on other true captions) lists the words it flags.
   The clips are those of ``--videos``, else the checkout's ``../shared/data/videos``, else (an installed
   wheel, or no sample clips) two clips synthesised in memory
   (:func:`~capreward.testing.colour_task.synthetic_clips`).
2. **GRPO.** A tiny LLaVA captioner is first taught weakly (SFT on labels naming the image's colour
   family, warm or cool, and one of its two colours at random: it attends to the image and is right
   about half the time), then trained with TRL's ``GRPOTrainer`` (:mod:`capreward.recipes.grpo_captioner`)
   rewarded by EMScore + CLIP-S + the hallucination penalty behind the anti-hacking guards. RL sharpens a policy that already attends to the
   image; from an image-blind start (the earlier demo's SFT on random colours) GRPO settles on the best
   image-blind caption the reward allows instead. Printed: the per-step reward and right-colour share;
   the reward's reference levels (always right, the best image-blind policy, the start); held-out accuracy
   greedy and sampled before and after, beside a control arm (the same start given as many more
   supervised steps on the same labels); what the policy says per image colour; a few sampled captions.

A closing line says what the numbers showed, computed from clean held-out greedy and sampled accuracy
(whichever way they went): a caption counts as right only when it is a clean caption of the task
("a red image": no repeats, no junk tokens; :func:`~capreward.testing.colour_task.right_colour`).

Needs the ``demo`` extra (TRL, PEFT, datasets; ``scripts/bootstrap.sh`` installs it); without it the
command stops at once with one line naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Sequence

VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".webm", ".mov"}


def checkout_root() -> Path | None:
    """The repository checkout this package runs from (``src/capreward`` inside it, a ``pyproject.toml``
    beside ``src``), or None for an installed package."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() and (root / "src" / "capreward").is_dir() else None


def default_video_dir() -> Path | None:
    """``../shared/data/videos`` beside the checkout (where CI and developers keep the sample clips);
    None when the package is installed rather than run from a checkout."""
    root = checkout_root()
    return None if root is None else root.parent / "shared" / "data" / "videos"


def require_demo_extra() -> None:
    """Raise :class:`~capreward._extras.MissingExtraError` (one line naming the ``demo`` extra) unless
    what the GRPO part imports is installed; checked before anything is trained."""
    from .._extras import require

    for module in ("trl", "datasets"):
        require("demo", module, used_by="capreward demo")


def load_recipe():
    """The GRPO recipe, :mod:`capreward.recipes.grpo_captioner` (needs the ``demo`` extra)."""
    require_demo_extra()
    import importlib

    return importlib.import_module("capreward.recipes.grpo_captioner")


@contextlib.contextmanager
def quiet_third_parties():
    """Keep third-party warnings, log records and progress bars off the terminal (our own lines stay):
    Python warnings are ignored, transformers/TRL/datasets log errors only, datasets' bars are off, and so
    are our own model-loading status lines (the demo's tiny models load in an instant, many times).
    (datasets comes with the demo extra; the foil table alone runs without it.)"""
    import transformers

    try:
        import datasets
    except ImportError:
        datasets = None

    from .. import progress

    # capreward.rewards logs each unscored sample (an empty completion here; it gets -1 instead)
    loggers = ("transformers", "trl", "datasets", "accelerate", "peft", "capreward.rewards")
    levels = {name: logging.getLogger(name).level for name in loggers}
    tf_verbosity = transformers.logging.get_verbosity()
    bars = datasets is not None and datasets.is_progress_bar_enabled()
    tf_bars = transformers.utils.logging.is_progress_bar_enabled()  # loading/saving weights (the KL reference)
    status_lines = progress.is_enabled()
    progress.enable(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        for name in levels:
            logging.getLogger(name).setLevel(logging.ERROR)
        if datasets is not None:
            datasets.disable_progress_bars()
        try:
            yield
        finally:
            transformers.logging.set_verbosity(tf_verbosity)
            if tf_bars:
                transformers.utils.logging.enable_progress_bar()
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            if bars:
                datasets.enable_progress_bars()
            progress.enable(status_lines)


@contextlib.contextmanager
def one_thread():
    """Toy-sized tensors: extra threads only add contention on a shared machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ part 1
@dataclass
class FoilScores:
    """Per tinted clip (parallel lists): the true caption's and the foil's EMScore (full F), CLIP-S and
    hallucination penalty, and the words the penalty flagged; ``threshold`` is the calibrated one."""

    names: list[str]
    colours: list[str]
    truth: list[str]
    foils: list[str]
    foil_colours: list[str]
    emscore: tuple[list[float], list[float]]
    clip_s: tuple[list[float], list[float]]
    penalty: tuple[list[float], list[float]]
    flagged: tuple[list[list[str]], list[list[str]]]
    threshold: float

    def facts(self) -> dict[str, int]:
        """Counts over the n clips: the true caption outranks (strictly) its foil on EMScore and on
        CLIP-S; the foil's swapped colour word is flagged; a true caption's colour word is flagged."""
        n = len(self.truth)
        return {
            "n": n,
            "emscore_right": sum(t > f for t, f in zip(*self.emscore)),
            "clip_s_right": sum(t > f for t, f in zip(*self.clip_s)),
            "foil_word_flagged": sum(c in fl for c, fl in zip(self.foil_colours, self.flagged[1])),
            "true_word_flagged": sum(c in fl for c, fl in zip(self.colours, self.flagged[0])),
        }


def score_foils(clip_model: Any, clips: Sequence[Any], names: Sequence[str], frames: int | None = 10) -> FoilScores:
    """Tint ``clips`` (decoded uint8 frames) with each task colour and score true captions and colour
    foils with EMScore, CLIP-S and the hallucination penalty, all on one shared CLIP backbone."""
    from ..backbones import CLIPBackbone
    from ..rewards import HallucinationPenalty
    from ..scorers.clipscore import CLIPScore
    from ..scorers.emscore import EMScore
    from ..testing.colour_task import colour_foils

    task = colour_foils(clips, names)
    backbone = CLIPBackbone(clip_model)
    em = EMScore(backbone=backbone, frames=None)
    cs = CLIPScore(backbone=backbone, frames=None)
    penalty = HallucinationPenalty(model=clip_model, frames=None)
    # quantile 0: the lowest similarity of a right colour word (generic words such as "picture" are not
    # content, so the calibration's content words are its colour words alone, and any higher quantile
    # flags the least similar right one by construction)
    threshold = penalty.calibrate(task.calibration, task.videos, quantile=0.0)
    # the clips are already sampled to ``frames`` frames; the scorers take every frame they are given
    em_t, em_f = (em.score(c, videos=task.videos).score.tolist() for c in (task.truth, task.foils))
    cs_t, cs_f = (cs.score(c, videos=task.videos).clip_s.tolist() for c in (task.truth, task.foils))
    reports = [penalty.reports(c, task.videos) for c in (task.truth, task.foils)]
    return FoilScores(
        names=task.names, colours=task.colours, truth=task.truth, foils=task.foils, foil_colours=task.foil_colours,
        emscore=(em_t, em_f), clip_s=(cs_t, cs_f),
        penalty=([r.penalty for r in reports[0]], [r.penalty for r in reports[1]]),
        flagged=([list(r.flagged) for r in reports[0]], [list(r.flagged) for r in reports[1]]),
        threshold=threshold,
    )


def format_foils(s: FoilScores) -> str:
    """One line per caption: clip, tint, true/foil, caption, EMScore, CLIP-S, penalty, flagged words."""
    head = f"{'clip':<24} {'tint':<7} {'':<5} {'caption':<16} {'EMScore':>8} {'CLIP-S':>7} {'penalty':>8}  flagged"
    lines = [head, "-" * (len(head) + 8)]
    for i in range(len(s.truth)):
        for k, (kind, caption) in enumerate((("true", s.truth[i]), ("foil", s.foils[i]))):
            clip = s.names[i][:24] if k == 0 else ""
            tint = s.colours[i] if k == 0 else ""
            flagged = ", ".join(s.flagged[k][i]) or "-"
            lines.append(
                f"{clip:<24} {tint:<7} {kind:<5} {caption:<16} {s.emscore[k][i]:8.3f} {s.clip_s[k][i]:7.3f} "
                f"{s.penalty[k][i]:8.2f}  {flagged}"
            )
    return "\n".join(lines)


def foils_summary(s: FoilScores) -> str:
    f = s.facts()
    return (
        f"true caption above its foil: EMScore {f['emscore_right']}/{f['n']}, CLIP-S {f['clip_s_right']}/{f['n']}; "
        f"swapped colour word flagged in {f['foil_word_flagged']}/{f['n']} foils, "
        f"true colour word flagged in {f['true_word_flagged']}/{f['n']} true captions"
    )


def read_clips(video_dir: Path, frames: int) -> tuple[list[Any], list[str]]:
    """The clips of ``video_dir`` decoded to ``frames`` frames each, and their file names (none when the
    folder does not exist)."""
    from ..media import load_video

    paths = sorted(p for p in video_dir.glob("*") if p.suffix.lower() in VIDEO_SUFFIXES)
    return [load_video(p, frames=frames) for p in paths], [p.name for p in paths]


def demo_clips(videos: str | None, frames: int) -> tuple[list[Any], list[str], str]:
    """The clips the foil table tints, their names and a line saying where they came from: the folder
    ``videos`` when given (possibly none), else the checkout's sample clips, else two clips synthesised
    in memory (an installed wheel has no ``../shared``)."""
    from ..testing.colour_task import synthetic_clips

    if videos is not None:
        clips, names = read_clips(Path(videos), frames)
        return clips, names, f"clips from {videos}"
    folder = default_video_dir()
    if folder is not None and folder.is_dir():
        clips, names = read_clips(folder, frames)
        if clips:
            return clips, names, f"sample clips from {folder}"
    clips, names = synthetic_clips(frames)
    return clips, names, "no sample clips at hand (../shared/data/videos): two clips synthesised in memory"


# ------------------------------------------------------------------------------------------ part 2
#: Held-out images (disjoint seeds from the SFT pool and the GRPO images), and samples per image.
EVAL_IMAGES = 32
EVAL_SAMPLES = 4
#: Known-good captions the hallucination penalty is calibrated on (images disjoint from every other stage).
CALIBRATION_ROWS = 128
#: How much the clean sampled accuracy must rise (start -> after) for the closing line to say "taught".
SAMPLED_RISE = 0.10


@dataclass(frozen=True)
class GRPOSettings:
    """The optimiser side of the demo's GRPO run (the recipe's flags): learning rate and schedule,
    warm-up share, the KL coefficient ``beta`` to the start policy, LoRA rank (0: full fine-tuning),
    completion length, images x completions per step."""

    lr: float = 1e-3
    scheduler: str = "cosine"
    warmup: float = 0.1
    beta: float = 0.04
    lora_r: int = 0
    lora_alpha: int = 16
    max_completion_length: int = 6
    batch_size: int = 64
    num_generations: int = 4

    def recipe_argv(self, out: str, seed: int, steps: int) -> list[str]:
        """The GRPO recipe's command line for these settings."""
        return ["--tiny", "--quiet", "--out", out, "--seed", str(seed), "--steps", str(steps), "--lr", repr(self.lr),
                "--lr-scheduler", self.scheduler, "--warmup-ratio", repr(self.warmup), "--beta", repr(self.beta),
                "--batch-size", str(self.batch_size), "--num-generations", str(self.num_generations),
                "--max-completion-length", str(self.max_completion_length), "--lora-r", str(self.lora_r),
                "--lora-alpha", str(self.lora_alpha)]


#: The demo's settings.
DEMO_SETTINGS = GRPOSettings()


@dataclass
class GRPOResult:
    """Per GRPO step (parallel lists): the reward's mean and its components' means (name -> list), the
    right-colour share and mean caption length of the sampled captions; the held-out evaluations of the
    start (``before``), of the GRPO policy (``after``) and of the control arm (``control``: the same start
    given as many more supervised steps as GRPO steps); the reference reward levels; the SFT loss and
    wall time; ``start_state``: the start policy's weights (the arms of the fair-control experiment start
    from them)."""

    reward: list[float]
    components: dict[str, list[float]]
    right: list[float]
    words: list[float]
    sft_loss: float
    seconds: float
    before: Any = None
    after: Any = None
    control: Any = None
    levels: dict[str, Any] = field(default_factory=dict)
    example: list[str] = field(default_factory=list)
    start_state: dict[str, Any] | None = field(default=None, repr=False)

    def window(self) -> int:
        """Steps averaged at each end when comparing the start and the end of the run."""
        return max(1, len(self.reward) // 4)

    def start_end(self, values: Sequence[float]) -> tuple[float, float]:
        k = self.window()
        return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


def guards_for_the_task() -> Any:
    """The anti-hacking guards for the task's captions ("a red image": no final period, so the truncation
    guard checks for dangling words only; three words before the length guard starts)."""
    from ..rewards import Guards

    return Guards(require_punctuation=False, max_words=3, length_scale=2)


def build_reward(clip_model: Any, calibration_rows: Sequence[dict[str, Any]]) -> Any:
    """The demo's GRPO reward: EMScore (weight 1) + CLIP-S (0.5) + the hallucination penalty (0.5,
    threshold: the lowest right-colour similarity of the true captions "a <colour> image" of
    ``calibration_rows``, :data:`CALIBRATION_ROWS` of them in the demo), behind the guards
    (:func:`guards_for_the_task`), with empty completions at -1
    (:class:`~capreward.testing.colour_task.EmptyIsWorst`). From an image-blind start GRPO drives it from
    0.12 to 0.51 while the right colour stays at 24 % (the best image-blind policy it allows); from the
    weakly supervised start it teaches the colour."""
    from ..rewards import CLIPScoreReward, CompositeReward, EMScoreReward, HallucinationPenalty
    from ..testing.colour_task import TASK_COLOURS, EmptyIsWorst

    # idf over the task's caption form: "a" and "image" occur in every caption (idf 0), so EMScore
    # weighs the colour word and the penalty counts only it as content (without idf, dropping "a"
    # raises EMScore and the policy learns to drop it)
    corpus = [f"a {c} image" for c in TASK_COLOURS]
    penalty = HallucinationPenalty(model=clip_model)
    # the lowest rate the rows can hold, 1 / (n + 1): the threshold is the lowest right-colour similarity of
    # the n known-good captions. Wrong colours sit far below it (every one of 400 held-out wrong captions is
    # flagged at n = 16 or 128), while a right caption falsely flagged loses its whole credit behind the
    # composite's verifier: with n = 16 (rate 1/17) 12-15 % of held-out right "red" captions were flagged
    # (this CLIP is least sure of red), with n = 128 3-4 % (:data:`CALIBRATION_ROWS`)
    rate = 1.0 / (len(calibration_rows) + 1)
    penalty.calibrate([f"a {r['colour']} image" for r in calibration_rows], [r["image"] for r in calibration_rows],
                      kind="image", quantile=rate)
    composite = CompositeReward(
        [(EMScoreReward(model=clip_model, idf=corpus), 1.0), (CLIPScoreReward(model=clip_model), 0.5), (penalty, 0.5)],
        guards=guards_for_the_task(), name="composite",
    )
    return EmptyIsWorst(composite)


#: The earlier demo's reward is the same composite (the Goodhart monitor's test runs it from the blind start).
composite_reward = build_reward


def reference_levels(reward: Any, rows: Sequence[dict[str, Any]], start: Any) -> dict[str, Any]:
    """The reward's value on the held-out ``rows`` for reference policies: ``right`` (always the right
    caption "a <colour> image"), ``blind`` (the best image-blind policy: the one caption, of every 1-3 word
    sequence over the task's answer words, with the highest mean over the images; an image-blind policy's
    expected reward is a mean of such captions, so none does better) and its caption ``blind_caption``,
    and ``start`` (the start policy's sampled captions, :class:`ColourEval` ``start``)."""
    import itertools

    from ..testing.colour_task import TASK_COLOURS

    images = [r["image"] for r in rows]
    mean = lambda values: statistics.fmean(v for v in values if v is not None)  # noqa: E731
    right = mean(reward(None, [f"a {r['colour']} image" for r in rows], image=images))
    words = ("a", "image") + TASK_COLOURS
    candidates = [" ".join(c) for n in (1, 2, 3) for c in itertools.product(words, repeat=n)]
    # one image per colour is enough to rank the candidates (images of a colour score alike); the winner
    # is then scored on every held-out image
    probe = [next(r for r in rows if r["colour"] == c) for c in dict.fromkeys(r["colour"] for r in rows)]
    flat = reward(None, [c for c in candidates for _ in probe], image=[r["image"] for _ in candidates for r in probe])
    k = len(probe)
    best = max(range(len(candidates)), key=lambda i: mean(flat[i * k:(i + 1) * k]))
    blind = mean(reward(None, [candidates[best]] * len(rows), image=images))
    sampled = [c for caps in start.sampled for c in caps]
    start_level = mean(reward(None, sampled, image=[im for im, caps in zip(images, start.sampled) for _ in caps]))
    return {"right": right, "blind": blind, "blind_caption": candidates[best], "start": start_level}


def run_grpo(clip_model: Any, steps: int, out: str, seed: int = 0, sft_steps: int = 80,
             eval_images: int = EVAL_IMAGES, control: bool = True, settings: GRPOSettings = DEMO_SETTINGS,
             levels: bool = True, reward: Any = None, callbacks: Sequence[Any] = (), start_labels: str = "weak") -> GRPOResult:
    """The weakly supervised start, then GRPO, then its control arm, all measured on held-out images.

    1. SFT the tiny LLaVA policy for ``sft_steps`` steps on weak labels
       (:func:`~capreward.testing.colour_task.weak_label`: the image's colour family, warm or cool, one of
       its two colours at random): it attends to the image but is right about half the time
       (``start_labels="random"``: colours drawn whatever the image, an image-blind start).
    2. ``steps`` GRPO steps (``settings``, :data:`DEMO_SETTINGS` by default: 16 images x 4 completions
       per step) through :mod:`capreward.recipes.grpo_captioner`, rewarded by :func:`build_reward` (or
       ``reward``, a TRL reward callable, for experiments; ``callbacks`` go to the trainer).
    3. With ``control``, the control arm: the same start given ``steps`` more supervised steps (16 images
       each, the same weak labels): the same number of optimiser steps and images spent on supervision.

    Held-out evaluation (``eval_images`` images no stage trains on): greedy and 4 sampled captions per
    image; with ``levels`` the reward's reference levels (:func:`reference_levels`)."""
    from ..testing import TinyLlavaSpec, build_tiny_llava
    from ..testing.colour_task import (WORDS, ColourTally, caption_colours, colour_rows, grpo_dataset, random_label,
                                      sft_colours, weak_label)

    import torch

    start = time.perf_counter()
    torch.manual_seed(seed)  # the same run whether or not the foil table ran first
    recipe = load_recipe()
    spec = TinyLlavaSpec(words=WORDS, seed=seed)
    model, processor = build_tiny_llava(spec)
    labels = {"weak": weak_label, "random": random_label}[start_labels]
    sft_loss = sft_colours(model, processor, sft_steps, seed, label=labels)
    start_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    held_out = colour_rows(eval_images, seed + 5000)
    before = caption_colours(model, processor, held_out, EVAL_SAMPLES, seed)
    reward = ColourTally(reward if reward is not None else build_reward(clip_model, colour_rows(CALIBRATION_ROWS, seed + 3000)))
    args = recipe.parse_args(settings.recipe_argv(out, seed, steps))
    result = recipe.train(
        args, reward_funcs=[reward], model_and_processor=(model, processor),
        dataset=grpo_dataset(colour_rows(32, seed), keep_colour=True), save=False, callbacks=callbacks,
    )
    after = caption_colours(result["trainer"].model, processor, held_out, EVAL_SAMPLES, seed,
                            max_new_tokens=settings.max_completion_length)
    control_eval = None
    if control:
        twin, _ = build_tiny_llava(spec)
        twin.load_state_dict(start_weights)
        sft_colours(twin, processor, steps, seed + 1, label=weak_label)
        control_eval = caption_colours(twin, processor, held_out, EVAL_SAMPLES, seed)
    level_values = reference_levels(reward.reward, held_out, before) if levels else {}
    rows = result["trajectory"]
    names = [k for k in rows[0] if k not in ("step", "total")] if rows else []
    return GRPOResult(
        reward=[r["total"] for r in rows],
        components={n: [r[n] for r in rows] for n in names},
        right=reward.right,
        words=reward.words,
        sft_loss=sft_loss,
        seconds=time.perf_counter() - start,
        before=before, after=after, control=control_eval, levels=level_values, start_state=start_weights,
    )


#: Short column titles of the GRPO table (log names -> titles).
COLUMN_TITLES = {"emscore": "EMScore", "clip_s": "CLIP-S", "hallucination": "penalty", "guard/repetition": "repeat",
                 "guard/truncation": "trunc", "guard/length": "length", "guard/injection": "inject"}


def format_grpo(r: GRPOResult, rows: int = 16) -> str:
    """The per-step figures as at most ``rows`` lines: each line averages a block of consecutive steps
    (one step per line for short runs): the reward, each logged component/guard mean, the share of
    sampled training captions naming the right colour and their mean length in words."""
    names = list(r.components)
    titles = [COLUMN_TITLES.get(n, n) for n in names]
    width = max([8] + [len(t) + 1 for t in titles])
    head = f"{'steps':>7} {'reward':>8}" + "".join(f"{t:>{width}}" for t in titles) + f"{'right':>7}{'words':>7}"
    lines = [head, "-" * len(head)]
    n = len(r.reward)
    size = max(1, -(-n // rows))
    for lo in range(0, n, size):
        hi = min(n, lo + size)

        def mean(values, lo=lo, hi=hi):
            part = values[lo:hi]
            return statistics.fmean(part) if part else math.nan

        label = f"{lo + 1}" if hi - lo == 1 else f"{lo + 1}-{hi}"
        cells = "".join(f"{mean(r.components[name]):>{width}.3f}" for name in names)
        lines.append(f"{label:>7} {mean(r.reward):>8.3f}{cells}{mean(r.right):>7.0%}{mean(r.words):>7.1f}")
    return "\n".join(lines)


def format_levels(levels: dict[str, Any], after: float | None = None) -> str:
    """The reference reward levels on the held-out images (and the GRPO policy's, when given)."""
    line = (f"reference levels of this reward on the held-out images: always right {levels['right']:.3f}; "
            f"best image-blind policy {levels['blind']:.3f} ({levels['blind_caption']!r} whatever the image); "
            f"the start's samples {levels['start']:.3f}")
    return line + (f"; after GRPO {after:.3f}" if after is not None else "")


def format_evaluation(r: GRPOResult, samples: int = 2) -> str:
    """Clean held-out accuracy greedy and sampled (and the malformed share of the sampled captions) for the
    start, GRPO and the control arm; per image colour the
    most frequent greedy caption of each and its share right; and a few sampled captions before and after."""
    arms = [("start (weak SFT)", r.before), ("after GRPO", r.after)]
    if r.control is not None:
        arms.append(("control: more SFT", r.control))
    lines = [f"{'held-out images':<18}{'greedy right':>13}{'sampled right':>15}{'malformed':>11}"]
    lines += [f"{name:<18}{e.greedy_right:>13.0%}{e.sampled_right:>15.0%}{e.sampled_malformed:>11.0%}" for name, e in arms]
    lines.append("(right: a clean caption of the image's colour, \"a red image\"; malformed: sampled captions"
                 " that are not a clean caption of the task: repeats, junk tokens, cut off)")
    lines.append("per image colour, the most frequent greedy caption (share right):")
    per = [(name, e.per_colour()) for name, e in arms]
    for colour in r.before.per_colour():
        cells = "   ".join(f"{name.split(' ')[0].rstrip(':')} {p[colour][0]!r} ({p[colour][1]:.0%})" for name, p in per)
        lines.append(f"  {colour:<7} {cells}")
    lines.append("sampled captions, start -> after GRPO:")
    seen = []
    for i, colour in enumerate(r.before.colours):
        if colour in seen:
            continue
        seen.append(colour)
        lines.append(f"  {colour:<7} {r.before.sampled[i][:samples]} -> {r.after.sampled[i][:samples]}")
    return "\n".join(lines)


def taught(before: Any, after: Any, control: Any = None) -> bool:
    """The closing line's rule: GRPO taught the task when the clean held-out greedy accuracy after it is
    at least 75 % and above the start's, the clean sampled accuracy rose by at least
    :data:`SAMPLED_RISE`, and (given a control arm) both are above the control arm's. Accuracy counts
    clean captions of the task only (:func:`~capreward.testing.colour_task.right_colour`)."""
    greedy = after.greedy_right >= 0.75 and after.greedy_right > before.greedy_right
    sampled = after.sampled_right >= before.sampled_right + SAMPLED_RISE
    if control is not None:
        greedy = greedy and after.greedy_right > control.greedy_right
        sampled = sampled and after.sampled_right > control.sampled_right
    return greedy and sampled


def grpo_summary(r: GRPOResult) -> str:
    """The closing line, computed from clean held-out greedy *and* sampled accuracy (:func:`taught`),
    with the control arm's and the training reward's start and end beside them."""
    if not r.reward or r.before is None or r.after is None:
        return "GRPO logged no reward"
    r0, r1 = r.start_end(r.reward)
    b, a = r.before.greedy_right, r.after.greedy_right
    bs, as_ = r.before.sampled_right, r.after.sampled_right
    line = (f"GRPO: clean held-out greedy right colour {trend(b, a, '.0%')}, {b:.0%} -> {a:.0%} "
            f"(sampled {bs:.0%} -> {as_:.0%}; chance 25%)")
    c = r.control
    if c is not None:
        line += f"; control arm (as many more supervised steps) {c.greedy_right:.0%} (sampled {c.sampled_right:.0%})"
    line += f"; training reward {r0:.3f} -> {r1:.3f}"
    if taught(r.before, r.after, c):
        line += (". The reward taught the task: the policy writes the image's colour in clean captions where its"
                 " supervision could not" + (" (the control arm stayed below)" if c is not None else ""))
    elif a > b or as_ > bs:
        short = []
        if a < 0.75:
            short.append("greedy below 75 %")
        if as_ < bs + SAMPLED_RISE:
            short.append(f"sampled up by less than {SAMPLED_RISE:.0%}")
        if c is not None and not (a > c.greedy_right and as_ > c.sampled_right):
            short.append("not above the control arm")
        line += ". Clean correctness rose, but not enough to call it taught (" + "; ".join(short) + ")"
    elif r1 > r0:
        line += ". The reward rose but clean held-out correctness did not: this run did not teach the task"
    else:
        line += ". Neither the reward nor clean held-out correctness rose"
    return line


def trend(before: float, after: float, fmt: str) -> str:
    """"rose", "fell" or "stayed level", judged on the values as printed with ``fmt``."""
    a, b = format(before, fmt), format(after, fmt)
    if a == b:
        return "stayed level"
    return "rose" if after > before else "fell"


# ------------------------------------------------------------------------------------------ command
def run(args: argparse.Namespace) -> int:
    from ..testing.trained_clip import TrainedClipFactory, trained_clip_path

    if args.steps > 0:
        require_demo_extra()
    with quiet_third_parties(), one_thread():
        start = time.perf_counter()
        print("capreward demo: tiny CLIP trained on colour words (cached after the first run); nothing is downloaded")
        trained_clip_path(log=None)
        clip = TrainedClipFactory()
        summary = []
        if not args.no_table:
            clips, names, source = demo_clips(args.videos, args.frames)
            if not clips:
                print(f"no videos found in {args.videos} (pass --videos DIR)")
                return 1
            print(f"\n1. Colour foils: {len(names)} clips x 4 tints, {args.frames} frames each; "
                  f"true caption vs the same caption with the colour swapped ({source})")
            foils = score_foils(clip, clips, names, args.frames)
            print(format_foils(foils))
            print(f"(penalty threshold {foils.threshold:.3f}: the lowest content-word similarity of true captions)")
            summary.append(foils_summary(foils))
            print(summary[-1])
        if args.steps > 0:
            out = args.out or tempfile.mkdtemp(prefix="capreward-demo-")
            print(f"\n2. GRPO (TRL): tiny LLaVA captioner, {args.steps} steps x 64 captions of solid-colour images; "
                  "reward = EMScore + 0.5 CLIP-S + 0.5 penalty + guards")
            print("   Start: weakly supervised (SFT on labels that name the image's colour family, warm or cool, and"
                  " one of its two colours at random: right half the time). RL sharpens a policy that already"
                  " attends to the image; from an image-blind start it finds the best blind caption instead"
                  " (the earlier demo: right colour 24% -> 24%).")
            grpo = run_grpo(clip, args.steps, out, seed=args.seed)
            print(format_grpo(grpo))
            print("(each line: the mean over those steps of the 16 images x 4 sampled training captions)")
            print(format_levels(grpo.levels))
            print(format_evaluation(grpo))
            summary.append(grpo_summary(grpo))
            print(summary[-1])
        print(f"\nWhat the numbers showed ({time.perf_counter() - start:.0f} s):")
        for line in summary:
            print(f"- {line}")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="colour foils scored by EMScore/CLIP-S/penalty, then a short GRPO run; tiny local models",
                              description=__doc__)
    p.add_argument("--videos", default=None,
                   help="folder of video clips to tint (default: ../shared/data/videos beside the checkout; "
                        "two synthesised clips when there is none)")
    p.add_argument("--frames", type=int, default=10, help="frames sampled per video (default: %(default)s)")
    p.add_argument("--no-table", action="store_true", help="skip the colour-foil table")
    p.add_argument("--steps", type=int, default=80, help="GRPO steps; 0 skips the GRPO part (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the policy and data (default: %(default)s)")
    p.add_argument("--out", default=None, help="GRPO output folder (default: a temporary one)")
    p.set_defaults(func=run)
