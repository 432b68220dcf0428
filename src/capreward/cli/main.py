"""Entry point of the ``capreward`` command: one sub-command per module in this package.

Each sub-command module exposes ``add_parser(subparsers)``, which registers its parser and sets
``func`` (taking the parsed arguments, returning an exit code). Shared here: the help formatter (every
option shows its default), ``--version``, ``--no-progress`` on every sub-command, ``--device auto``,
the media limits of ``--max-pixels`` / ``--max-video-pixels`` for the command's duration
and the translation of user errors (a missing model, a bad manifest) into one line and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from .common import MODEL_HINTS, CLIError, HelpFormatter, media_limit_settings, plain_text, resolve_device

SUBCOMMAND_MODULES = [
    "capreward.cli.demo",
    "capreward.cli.score",
    "capreward.cli.report",
    "capreward.cli.meta_eval",
    "capreward.cli.explain",
    "capreward.cli.serve",
]

DESCRIPTION = "Caption-quality metrics (EMScore, CLIP-S, PAC-S, FLEUR, VisCE2, G-VEval) as scores and rewards."


def package_version() -> str:
    """The installed distribution's version, else the package's ``__version__``."""
    from importlib import metadata

    try:
        return metadata.version("capreward")
    except metadata.PackageNotFoundError:
        import capreward

        return capreward.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capreward", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"capreward {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    for sub in subparsers.choices.values():
        sub.formatter_class = HelpFormatter
        if sub.description:
            sub.description = plain_text(sub.description)
        if not any("--no-progress" in a.option_strings for a in sub._actions):
            sub.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    return parser


@contextlib.contextmanager
def progress_settings(show: bool):
    """Within the block: the status bars of capreward.progress on when ``show``; otherwise no progress bar
    from anything in this process or its children (tqdm, huggingface_hub, transformers). Restored after,
    so that calling :func:`main` in-process leaves no trace."""
    from .. import progress

    saved_env = {k: os.environ.get(k) for k in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    hub_bars_were_off = None
    before = progress.is_enabled()
    if show:
        progress.enable()
    else:
        os.environ["TQDM_DISABLE"] = "1"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        if "huggingface_hub" in sys.modules:
            from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

            hub_bars_were_off = are_progress_bars_disabled()
            disable_progress_bars()
    try:
        yield
    finally:
        progress.enable(before)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if hub_bars_were_off is False:
            from huggingface_hub.utils import enable_progress_bars

            enable_progress_bars()


def flag_of(parser: argparse.ArgumentParser, args: argparse.Namespace, value, candidates: tuple[str, ...]) -> str:
    """The option among ``candidates`` (dest names) whose value is ``value``, as its first long flag."""
    sub = parser._subparsers._group_actions[0].choices[args.command]
    flags = {a.dest: a.option_strings[0] for a in sub._actions if a.option_strings}
    present = [d for d in candidates if d in flags]
    for dest in present:
        if value is not None and str(getattr(args, dest, None)) == str(value):
            return flags[dest]
    return flags[present[0]] if present else "--" + candidates[0].replace("_", "-")


def user_error_message(exc: BaseException, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """One line for a user error (what, in flag terms, and what to do); None for anything else (a bug)."""
    from .._extras import MissingExtraError
    from ..backbones.clip_loading import ModelLoadError
    from ..judges.loading import JudgeLoadError
    from ..jobs.errors import JobError
    from ..jobs.manifest import ManifestError
    from ..metaeval.judgments import JudgmentError

    if isinstance(exc, ModelLoadError):
        flag = flag_of(parser, args, exc.spec, ("clip_model", "pac_model"))
        hint = MODEL_HINTS.get(flag, f"pass {flag} PATH")
        return f"{flag}: {exc.summary}; {hint}"
    if isinstance(exc, JudgeLoadError):
        flag = flag_of(parser, args, exc.spec, ("judge_model", "fleur_model"))
        return f"{flag}: {exc.summary}; {MODEL_HINTS['--judge-model']}"
    if isinstance(exc, (CLIError, JobError, ManifestError, JudgmentError, MissingExtraError)):
        return str(exc)
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        named = argument_naming(parser, args, exc.filename)
        if named:
            return f"{named}: no such file {os.fspath(exc.filename)!r}"
    return None


def argument_naming(parser: argparse.ArgumentParser, args: argparse.Namespace, value) -> str | None:
    """The option (or positional argument) of the command whose value is ``value``, if any: a missing
    file that the user named is a user error, any other is a bug."""
    sub = parser._subparsers._group_actions[0].choices[args.command]
    for action in sub._actions:
        given = getattr(args, action.dest, None)
        if isinstance(given, (str, os.PathLike)) and os.fspath(given) == os.fspath(value):
            return action.option_strings[0] if action.option_strings else action.dest
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "device", None) is not None:
        args.device = resolve_device(args.device)
    try:
        with progress_settings(show=not getattr(args, "no_progress", False)), media_limit_settings(args):
            return int(args.func(args) or 0)
    except Exception as exc:
        message = user_error_message(exc, parser, args)
        if message is None:
            raise
        print(f"capreward {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
