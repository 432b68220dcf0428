"""The command-line pages carry each command's ``--help``, generated from its parser when the site is built.

A mkdocs hook (mkdocs.yml ``hooks:``): the marker ``<!-- cli-help -->`` of ``cli/<command>.md`` becomes an
"Options" section holding ``capreward <command> --help`` as ``capreward.cli.main.build_parser()`` formats
it (100 columns), so the options listed cannot drift from the code. Every sub-command must have its page.
"""

from __future__ import annotations

import functools
import os

MARKER = "<!-- cli-help -->"


@functools.cache
def subcommands() -> dict:
    """Sub-command name -> its argparse parser."""
    from capreward.cli.main import build_parser

    parser = build_parser()
    return dict(parser._subparsers._group_actions[0].choices)


def help_text(parser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_help().rstrip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def on_files(files, config, **kwargs):
    for name in subcommands():
        if files.get_file_from_path(f"cli/{name}.md") is None:
            raise ValueError(f"`capreward {name}` has no page docs/cli/{name}.md")
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    uri = page.file.src_uri
    if not uri.startswith("cli/"):
        return markdown
    name = uri[len("cli/"):-len(".md")]
    parsers = subcommands()
    if name not in parsers:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{uri} lacks the {MARKER} marker for `capreward {name} --help`")
    return markdown.replace(MARKER, f"## Options\n\n```text\n{help_text(parsers[name])}\n```")
