"""A package's public names imported on first use (PEP 562), from one table of name -> defining module.

A package ``__init__`` keeps its ``_LAZY`` table (``tests/test_layers.py`` reads it as the package's
arrows) and takes its module ``__getattr__`` and ``__dir__`` from :func:`lazy_exports`, so that importing
the package imports none of the modules the table names.

Example::

    _LAZY = {"MediaLimits": "capreward.media.limits"}
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY)
"""

from __future__ import annotations

import importlib
import sys
from typing import Any
from collections.abc import Callable, Mapping


def lazy_exports(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, serving the names of ``table`` lazily.

    Args:
        package: the package's dotted name (its ``__name__``); it must already be in ``sys.modules``.
        table: public name -> the dotted module that defines it.

    Returns:
        ``(__getattr__, __dir__)``: the first imports a name's module on first use and returns the name
        (an ``AttributeError`` for a name not in ``table``); the second lists the package's globals and
        ``table``'s names.
    """
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(list(namespace) + list(table))

    return __getattr__, __dir__
