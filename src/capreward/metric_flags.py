"""The metrics' own options (their specs' :attr:`~capreward.registry.MetricSpec.job_flags`) as command-line
options, for every program with a command line: ``capreward score`` and ``serve``, and the GRPO recipe
(``python -m capreward.recipes.grpo_captioner``)."""

from __future__ import annotations

import argparse

from . import registry
from .text import capped


def add_metric_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flags) -> None:
    """Add each :class:`~capreward.registry.JobFlag` of ``flags`` (``(spec, flag)`` pairs, e.g.
    :func:`capreward.registry.job_flags`) to ``parser``: its spellings, ``dest`` its name, its default
    (:meth:`~capreward.registry.MetricSpec.job_value`), a switch for ``type="flag"``."""
    types = {"str": str, "int": whole_number(0), "float": real_number()}
    for spec, flag in flags:
        if flag.type == "flag":
            parser.add_argument(*flag.flags, dest=flag.name, action="store_true", help=flag.help)
        else:
            parser.add_argument(*flag.flags, dest=flag.name, type=types[flag.type], default=spec.job_value(flag, None),
                                help=flag.help,
                                choices=list(flag.choices) if flag.choices else None)


def adapter_flags() -> tuple:
    """The metrics' job flags that the adapters take too (``serve``, the recipe): ``(spec, flag)`` pairs."""
    return tuple((spec, flag) for spec, flag in registry.job_flags() if flag.adapters)


def metric_flag_values(args: argparse.Namespace, flags) -> dict:
    """The values of ``flags`` (``(spec, flag)`` pairs) in ``args``, by flag name."""
    return {flag.name: getattr(args, flag.name, None) for _, flag in flags}


def whole_number(minimum: int = 0, maximum: int | None = None):
    """An argparse ``type``: a whole number in ``[minimum, maximum]`` (``-1``, ``2.5``, ``ten`` are an
    argument error: one line, exit status 2, not a Python error per row later)."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(f"invalid value {capped(text)} (a whole number {bound})")
        return value

    parse.__name__ = "whole number"
    return parse


def real_number(minimum: float | None = None, above: float | None = None):
    """An argparse ``type``: a finite number, at least ``minimum`` or greater than ``above`` when given
    (``nan``, ``inf`` and out-of-range values are an argument error)."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (minimum is None or value >= minimum) and (above is None or value > above)
        if not ok:
            bound = f" >= {minimum}" if minimum is not None else f" > {above}" if above is not None else ""
            raise argparse.ArgumentTypeError(f"invalid value {capped(text)} (a finite number{bound})")
        return value

    parse.__name__ = "number"
    return parse
