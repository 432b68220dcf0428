"""Entry point of the ``capreward`` command: one sub-command per module in this package.

Each sub-command module exposes ``add_parser(subparsers)``, which registers its parser and sets
``func`` (taking the parsed arguments, returning an exit code). Shared here: the help formatter (every
option shows its default), ``--version``, ``--no-progress`` on every sub-command, ``--device auto``,
the media limits of ``--max-pixels`` / ``--max-video-pixels`` for the command's duration
and the translation of user errors (a missing model, a bad manifest, a full disk) into one line and exit
status 2, and of Ctrl-C into one line (for score and explain: how many rows are safe) and exit status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from .common import MODEL_HINTS, HelpFormatter, clip_model_flags, model_hint, input_limit_settings, plain_text, resolve_device

SUBCOMMAND_MODULES = [
    "capreward.cli.demo",
    "capreward.cli.score",
    "capreward.cli.report",
    "capreward.cli.meta_eval",
    "capreward.cli.explain",
    "capreward.cli.serve",
]

def description() -> str:
    """The top-level help's first line: the metrics of :mod:`capreward.registry`, by title."""
    from .. import registry

    return f"Caption-quality metrics ({', '.join(s.title for s in registry.specs())}) as scores and rewards."


def package_version() -> str:
    """The installed distribution's version, else the package's ``__version__``."""
    from importlib import metadata

    try:
        return metadata.version("capreward")
    except metadata.PackageNotFoundError:
        import capreward

        return capreward.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capreward", description=description(), formatter_class=HelpFormatter)
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
    from anything in this process or its children (tqdm, huggingface_hub, transformers' "Loading weights"
    of the judges). Restored after, so that calling :func:`main` in-process leaves no trace.

    tqdm reads ``TQDM_DISABLE`` only when it is imported, so the environment variables reach child
    processes and late imports; huggingface_hub's switch, which transformers copies when it is imported,
    and transformers' own switch, when it is already imported, are set here."""
    from .. import progress

    saved_env = {k: os.environ.get(k) for k in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    hub_bars_were_off = transformers_bars_were_on = None
    before = progress.is_enabled()
    if show:
        progress.enable()
    else:
        os.environ["TQDM_DISABLE"] = "1"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

        hub_bars_were_off = are_progress_bars_disabled()
        disable_progress_bars()
        if "transformers" in sys.modules:
            from transformers.utils import logging as transformers_logging

            transformers_bars_were_on = transformers_logging.is_progress_bar_enabled()
            transformers_logging.disable_progress_bar()
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
        if transformers_bars_were_on:
            from transformers.utils import logging as transformers_logging

            transformers_logging.enable_progress_bar()


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The sub-command ``command``'s own parser."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


def flag_of(parser: argparse.ArgumentParser, args: argparse.Namespace, value, candidates: tuple[str, ...]) -> str:
    """The option among ``candidates`` (dest names) whose value is ``value``, as its first long flag."""
    sub = command_parser(parser, args.command)
    flags = {a.dest: a.option_strings[0] for a in sub._actions if a.option_strings}
    present = [d for d in candidates if d in flags]
    for dest in present:
        if value is not None and str(getattr(args, dest, None)) == str(value):
            return flags[dest]
    return flags[present[0]] if present else "--" + candidates[0].replace("_", "-")


def user_error_message(exc: BaseException, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """One line for a user error (what, in flag terms, and what to do); None for anything else (a bug).

    A user error is any :class:`~capreward.errors.CaprewardError` (every error capreward raises on
    purpose derives from it, its message naming what to fix); a model or judge that cannot be loaded
    and a missing device are named by their flag; a missing file the user named, by its argument."""
    from ..backbones.clip_loading import ModelLoadError
    from ..devices import DeviceUnavailableError
    from ..errors import CaprewardError
    from ..judges.loading import JudgeLoadError

    if isinstance(exc, ModelLoadError):
        flag = flag_of(parser, args, exc.spec, clip_model_flags())
        hint = model_hint(flag)
        return f"{flag}: {exc.summary}; {hint}"
    if isinstance(exc, JudgeLoadError):
        flag = flag_of(parser, args, exc.spec, ("judge_model", "fleur_model"))
        return f"{flag}: {exc.summary}; {MODEL_HINTS['--judge-model']}"
    if isinstance(exc, DeviceUnavailableError):
        return f"--device: {exc}"
    if isinstance(exc, CaprewardError):
        return str(exc)
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        named = argument_naming(parser, args, exc.filename)
        if named:
            return f"{named}: no such file {os.fspath(exc.filename)!r}"
    return None


def argument_naming(parser: argparse.ArgumentParser, args: argparse.Namespace, value) -> str | None:
    """The option (or positional argument) of the command whose value is ``value``, if any: a missing
    file that the user named is a user error, any other is a bug."""
    sub = command_parser(parser, args.command)
    for action in sub._actions:
        given = getattr(args, action.dest, None)
        if isinstance(given, (str, os.PathLike)) and os.fspath(given) == os.fspath(value):
            return action.option_strings[0] if action.option_strings else action.dest
    return None


#: Commands that append to a resumable results file (``--out``).
RESUMABLE_COMMANDS = ("score", "explain")


def interrupted_message(args: argparse.Namespace) -> str:
    """The one line printed on Ctrl-C: for a resumable job, how many rows are safe in its ``--out`` (the
    batch being written when it came was cut off again) and that the same command resumes."""
    if args.command not in RESUMABLE_COMMANDS or getattr(args, "out", None) is None:
        return f"capreward {args.command}: interrupted"
    from ..jobs.results_file import count_rows

    safe = count_rows(args.out)
    rows = "an unknown number of rows" if safe is None else f"{safe} row{'s' * (safe != 1)}"
    return f"capreward {args.command}: interrupted; {rows} are safe in {args.out}; run the same command to resume"


def main(argv: list[str] | None = None) -> int:
    try:  # building the parser imports every command's module (torch among them): Ctrl-C may come here
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("capreward: interrupted", file=sys.stderr)
        return 130
    try:
        if getattr(args, "device", None) is not None:
            from ..devices import checked_device

            args.device = resolve_device(args.device)
            checked_device(args.device)  # a missing GPU: one line now, not a traceback from the first model
        with progress_settings(show=not getattr(args, "no_progress", False)), input_limit_settings(args):
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(interrupted_message(args), file=sys.stderr)
        return 130
    except Exception as exc:
        message = user_error_message(exc, parser, args)
        if message is None:
            raise
        print(f"capreward {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
