"""What every ``capreward`` sub-command shares: the help formatter, ``--device``, the media size limits,
user errors."""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator

from ..errors import CaprewardError
from ..metric_flags import real_number, whole_number  # noqa: F401 (the CLI's number types)
from ..text import capped

#: What to try when a model is missing, per flag (the tiny local models in capreward.testing).
MODEL_HINTS = {
    "--clip-model": (
        "pass --clip-model PATH (an OpenAI-format .pt file, ARCH//open_clip_checkpoint.pt or an open_clip folder); "
        "to try things out without weights: python -c \"from capreward.testing import save_tiny_clip_openai; "
        "save_tiny_clip_openai('tiny_clip.pt')\" then --clip-model tiny_clip.pt"
    ),
    "--judge-model": (
        "pass --judge-model DIR (a folder written by save_pretrained or `hf download --local-dir`); "
        "to try things out without weights: python -c \"from capreward.testing import tiny_judge_dir; "
        "print(tiny_judge_dir())\" (trains a tiny LLaVA judge in about a minute) and pass the printed folder"
    ),
}


def model_hint(flag: str) -> str:
    """What to try when the model of ``flag`` cannot be loaded: :data:`MODEL_HINTS`, or the hint of the
    metric's job flag (:attr:`capreward.registry.JobFlag.hint`), or ``pass FLAG PATH``."""
    if flag in MODEL_HINTS:
        return MODEL_HINTS[flag]
    from .. import registry

    hints = {f.flags[0]: f.hint for _, f in registry.job_flags() if f.hint}
    return hints.get(flag, f"pass {flag} PATH")


def clip_model_flags() -> tuple[str, ...]:
    """The dest names of the options that name a CLIP: ``clip_model`` and the metrics' CLIP job flags."""
    from .. import registry

    return ("clip_model", *(f.name for _, f in registry.job_flags() if f.record == "clip_model"))


class CLIError(CaprewardError):
    """A mistake in the command's input; printed as one line, exit status 2."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            default = "on" if action.default else "off"
        elif action.default is None:
            default = "none"
        else:
            default = "%(default)s"
        return f"{text} (default: {default})".strip()


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; anything else unchanged."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """The one ``--device`` option of every sub-command that runs a model."""
    parser.add_argument("--device", default="auto",
                        help="torch device: auto (cuda when a GPU is visible, else cpu), cpu, cuda, cuda:1, ...")


def pixel_count(text: str) -> int:
    """An argparse ``type``: a positive number of pixels (digits, ``_`` allowed as a separator)."""
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0 or not text.strip().replace("_", "").isdigit():
        raise argparse.ArgumentTypeError(f"invalid pixel count {text!r} (a positive integer, e.g. 33554432)")
    return value


def add_media_limit_options(parser: argparse.ArgumentParser) -> None:
    """``--max-pixels`` and ``--max-video-pixels`` of every sub-command that reads images or videos;
    defaults: the limits in force (``CAPREWARD_MAX_PIXELS`` / ``CAPREWARD_MAX_VIDEO_PIXELS``, else the
    library's). Applied for the command's duration by :func:`input_limit_settings`."""
    from ..media.limits import get_media_limits

    limits = get_media_limits()
    parser.add_argument("--max-pixels", type=pixel_count, default=limits.max_pixels, metavar="N",
                        help="largest image or video frame (width x height) read; larger ones are refused, "
                             "naming the item (JPEGs are decoded at a reduced scale instead when one fits)")
    parser.add_argument("--max-video-pixels", type=pixel_count, default=limits.max_video_pixels, metavar="N",
                        help="most pixels of the frames sampled from one video, all together")
    parser.add_argument("--max-video-frames", type=pixel_count, default=limits.max_video_frames, metavar="N",
                        help="most frames one video file may hold, read from its header before it is indexed")
    parser.add_argument("--max-model-pixels", type=pixel_count, default=limits.max_model_pixels, metavar="N",
                        help="frame budget of one video: frames encoded x the encoder's input pixels "
                             "(e.g. 224x224); checked before decoding, whatever --frames asks")


def add_caption_budget_options(parser: argparse.ArgumentParser) -> None:
    """``--max-caption-chars`` and ``--max-caption-claims`` of every sub-command that scores captions;
    defaults: the budget in force (``CAPREWARD_MAX_CAPTION_CHARS`` / ``CAPREWARD_MAX_CAPTION_CLAIMS``,
    else :mod:`capreward.caption_budget`'s). Applied for the command's duration by
    :func:`input_limit_settings`."""
    from ..caption_budget import get_caption_budget

    budget = get_caption_budget()
    parser.add_argument("--max-caption-chars", type=whole_number(1), default=budget.max_chars, metavar="N",
                        help="characters of one caption; a longer one is not read (its row or sample gets the "
                             "reason), see capreward.caption_budget")
    parser.add_argument("--max-caption-claims", type=whole_number(1), default=budget.max_claims, metavar="N",
                        help="distinct claims one caption may hold (the rule splitter's count); more: not read")


def add_resume_options(parser: argparse.ArgumentParser, output: str = "a results file") -> None:
    """``--accept-unrecorded-settings`` and ``--quarantine-bad-lines`` of the commands that append to a
    resumable results file (``output``: how the help names it)."""
    parser.add_argument("--accept-unrecorded-settings", action="store_true",
                        help=f"resume {output} that has rows but no <out>.settings.json (written before settings "
                             "were recorded), recording this run's settings as theirs: only if they are the same")
    parser.add_argument("--quarantine-bad-lines", action="store_true",
                        help="on resume, move lines of --out that are not result rows (invalid JSON or UTF-8, no "
                             "id) to <out>.quarantine and go on; without it such a line stops the run with the file "
                             "left as it is (a torn last line, from a killed run, is always repaired)")


@contextlib.contextmanager
def input_limit_settings(args: argparse.Namespace) -> Iterator[None]:
    """Within the block: the media limits and the caption budget of ``args`` (those the command has
    options for), process-wide (see :mod:`capreward.media.limits` and :mod:`capreward.caption_budget`);
    the previous ones after it."""
    from ..caption_budget import caption_budget
    from ..media.limits import media_limits

    names = ("max_pixels", "max_video_pixels", "max_video_frames", "max_model_pixels")
    media = {n: getattr(args, n, None) for n in names}
    budget = {n: getattr(args, f"max_caption_{n.split('_')[1]}", None) for n in ("max_chars", "max_claims")}
    with contextlib.ExitStack() as stack:
        if any(v is not None for v in media.values()):
            stack.enter_context(media_limits(**media))
        if any(v is not None for v in budget.values()):
            stack.enter_context(caption_budget(**budget))
        yield


def plain_text(doc: str) -> str:
    """A docstring made readable on a terminal: no reStructuredText markup."""
    doc = re.sub(r":(?:class|func|data|meth|attr|mod):`~?([^`]+)`", r"\1", doc)
    return doc.replace("``", "")


def metric_name(name: str) -> str:
    """A metric or reward name in its one spelling (:mod:`capreward.names`: lower case, underscores, the
    aliases mapped: ``clip-s`` and ``clipscore`` → ``clip_s``), the same as the fields it writes and the
    Python API; a name that is none of them comes back normalised, for the choices check to refuse."""
    from ..names import spelling

    return spelling(name)


def spelled_aliases(choices: tuple[str, ...]) -> str:
    """``"clipscore, clip_score -> clip_s; ..."``: the aliases of :mod:`capreward.names` for ``choices``."""
    from ..names import aliases_of

    return "; ".join(f"{', '.join(aliases_of(c))} -> {c}" for c in choices if aliases_of(c))


def metric_list(choices: tuple[str, ...]):
    """An argparse ``type`` for a comma-separated list of metric names, each checked against ``choices``."""

    def parse(text: str) -> list[str]:
        names = [metric_name(m) for m in text.split(",") if m.strip()]
        unknown = [m for m in names if m not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"invalid metric {', '.join(map(capped, unknown)) or 'list'} (choose from {', '.join(choices)})")
        return names

    return parse
