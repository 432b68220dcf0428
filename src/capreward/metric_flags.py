"""The metrics' own options (their specs' :attr:`~capreward.registry.MetricSpec.job_flags`) as command-line
options, for every program with a command line: ``capreward score`` and ``serve``, and the GRPO recipe
(``python -m capreward.recipes.grpo_captioner``)."""

from __future__ import annotations

import argparse

from . import registry


def add_metric_flags(parser: argparse.ArgumentParser, flags) -> None:
    """Add each :class:`~capreward.registry.JobFlag` of ``flags`` (``(spec, flag)`` pairs, e.g.
    :func:`capreward.registry.job_flags`) to ``parser``: its spellings, ``dest`` its name, its default
    (:meth:`~capreward.registry.MetricSpec.job_value`), a switch for ``type="flag"``."""
    types = {"str": str, "int": int, "float": float}
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
