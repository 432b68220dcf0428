"""Entry point of the ``capreward`` command: one sub-command per module in this package.

Each sub-command module exposes ``add_parser(subparsers)``, which registers its parser and sets
``func`` (taking the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = [
    "capreward.cli.demo",
    "capreward.cli.score",
    "capreward.cli.report",
    "capreward.cli.meta_eval",
    "capreward.cli.explain",
    "capreward.cli.serve",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capreward", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
