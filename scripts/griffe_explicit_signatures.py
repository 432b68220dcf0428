"""A griffe extension for the API reference: a class fixed to one metric (a subclass of
``capreward.rewards.MetricReward`` or ``capreward.torchmetrics.RegisteredMetric`` that sets ``metric``)
shows the signature it has at run time, generated from its scorer's (``model``, ``idf``, ``frames`` ...),
instead of the generic ``__init__(metric, /, **options)`` griffe reads from the source.
"""

from __future__ import annotations

import importlib
import inspect

import griffe

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}
#: The packages whose classes may be fixed to a metric.
PACKAGES = ("rewards", "torchmetrics")


def _default(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"<{type(value).__name__}>"


def _parameter(p: inspect.Parameter) -> griffe.Parameter:
    annotation = p.annotation if isinstance(p.annotation, str) else None
    default = None if p.default is inspect.Parameter.empty else _default(p.default)
    return griffe.Parameter(p.name, annotation=annotation, kind=_KINDS[p.kind], default=default)


class ExplicitSignatures(griffe.Extension):
    """Give each class fixed to a metric an ``__init__`` with its run-time signature."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: object) -> None:
        if pkg.name != "capreward":
            return
        for name in PACKAGES:
            if name in pkg.members:
                self._walk(pkg.members[name])

    def _walk(self, module: griffe.Object) -> None:
        for member in list(module.members.values()):
            if member.is_alias:
                continue
            if member.is_module:
                self._walk(member)
            elif member.is_class and "metric" in member.members and not member.members["metric"].is_alias:
                value = getattr(member.members["metric"], "value", None)
                if isinstance(value, str) and value != "None":
                    self._explicit(member)

    @staticmethod
    def _explicit(cls: griffe.Class) -> None:
        runtime = getattr(importlib.import_module(cls.module.path), cls.name)
        signature = inspect.signature(runtime)
        params = griffe.Parameters(griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword),
                                   *(_parameter(p) for p in signature.parameters.values()))
        init = griffe.Function("__init__", parameters=params, lineno=cls.lineno, endlineno=cls.lineno)
        cls.set_member("__init__", init)
