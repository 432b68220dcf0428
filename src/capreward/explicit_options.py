"""Explicit constructor options: the signature a metric's reward or torchmetrics Metric shows, built from
its scorer's own signature, and the check that refuses an unknown option at construction.

The generic reward (:class:`~capreward.rewards.MetricReward`) and Metric
(:class:`~capreward.torchmetrics.RegisteredMetric`) take the scorer's options as keywords. So that
``inspect.signature``, ``help()`` and editors show them, each class given a metric carries a
``__signature__`` listing its own options and every option of the scorer it builds (following a
scorer's ``**kwargs`` into the constructor it forwards them to, as :class:`~capreward.scorers.clipscore.PACScore`
does to :class:`~capreward.scorers.clipscore.CLIPScore`); a keyword that is none of them raises
:class:`~capreward.registry.UnknownOption` naming the nearest valid one.

Example:
    >>> from capreward.explicit_options import check_options
    >>> check_options("EMScoreReward", ["idff"], ["idf", "frames", "model"])
    Traceback (most recent call last):
    ...
    capreward.registry.UnknownOption: EMScoreReward() got an unexpected keyword argument 'idff' (did you mean 'idf'?); its options: frames, idf, model
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any
from collections.abc import Callable, Iterable

from .registry import UnknownOption

_KW = inspect.Parameter.KEYWORD_ONLY
_VAR_KW = inspect.Parameter.VAR_KEYWORD
_VAR_POS = inspect.Parameter.VAR_POSITIONAL


def constructor_parameters(cls: type) -> tuple[list[inspect.Parameter], bool]:
    """The parameters of ``cls``'s constructor (``self`` left out), following ``**kwargs`` into the
    constructors of its base classes while one forwards them, then into the class its
    ``forwards_kwargs_to`` attribute names (the hallucination penalty's EMScore).

    Returns:
        The parameters in order (first definition of a name wins), and whether the chain still ends in
        ``**kwargs`` (then any keyword may be meant for the scorer and none can be refused).
    """
    found: dict[str, inspect.Parameter] = {}
    open_kwargs = True
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        open_kwargs = False
        for p in list(inspect.signature(init).parameters.values())[1:]:
            if p.kind is _VAR_KW:
                open_kwargs = True
            elif p.kind is not _VAR_POS and p.name not in found:
                found[p.name] = p
        if not open_kwargs:
            break
    target = getattr(cls, "forwards_kwargs_to", None)
    if open_kwargs and isinstance(target, type):  # the class names where its **kwargs go
        more, open_kwargs = constructor_parameters(target)
        for p in more:
            found.setdefault(p.name, p)
    return list(found.values()), open_kwargs


def keyword_only(params: Iterable[inspect.Parameter]) -> list[inspect.Parameter]:
    """``params`` as keyword-only parameters (their defaults and annotations kept)."""
    return [p.replace(kind=_KW) if p.kind is not _VAR_KW else p for p in params]


def merged_signature(*groups: Iterable[inspect.Parameter], var_keyword: inspect.Parameter | None = None) -> inspect.Signature:
    """One signature from ``groups`` of parameters (a name given twice keeps its first place), positional
    ones first, then keyword-only, then ``var_keyword`` if given."""
    seen: dict[str, inspect.Parameter] = {}
    for group in groups:
        for p in group:
            if p.kind in (_VAR_KW, _VAR_POS) or p.name in seen:
                continue
            seen[p.name] = p
    positional = [p for p in seen.values() if p.kind is not _KW]
    keywords = [p for p in seen.values() if p.kind is _KW]
    # a positional parameter without a default may not follow one with a default
    fixed, has_default = [], False
    for p in positional:
        if p.default is inspect.Parameter.empty and has_default:
            p = p.replace(kind=_KW)
            keywords.insert(0, p)
            continue
        has_default = has_default or p.default is not inspect.Parameter.empty
        fixed.append(p)
    return inspect.Signature(fixed + keywords + ([var_keyword] if var_keyword is not None else []))


def check_options(owner: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """Refuse the first name of ``given`` that is not in ``valid``.

    Args:
        owner: what is being built (the class name), named in the message.
        given: the keyword arguments passed.
        valid: every keyword the constructor takes.

    Raises:
        UnknownOption: (a TypeError, as Python's own for an unexpected keyword) naming the option, the
            nearest valid one and all of them.
    """
    valid = sorted(set(valid))
    for name in given:
        if name in valid:
            continue
        near = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise UnknownOption(f"{owner}() got an unexpected keyword argument {name!r}{hint}; its options: {', '.join(valid)}")


def class_for(named: dict[str, type], generic: type, metric: str) -> Callable[..., Any]:
    """The class ``named`` holds for ``metric`` (any spelling), else ``generic`` fixed to it: a callable
    taking the same options (how ``reward_for`` and ``metric_for`` build any metric).

    Args:
        named: metric name -> the class fixed to it (``MetricReward.named``).
        generic: the generic class (its first argument the metric's name).
        metric: a metric name or alias.

    Returns:
        The named class, or ``functools.partial(generic, name)``.
    """
    import functools

    from . import registry

    name = registry.get(metric).name
    return named[name] if name in named else functools.partial(generic, name)


class ClassSignature:
    """A class attribute ``__signature__`` computed per class by ``make(cls)`` on first access (cached),
    so :func:`inspect.signature` and ``help()`` show a subclass's generated signature. Instances have
    none (``inspect.signature(instance)`` stays the signature of their ``__call__``)."""

    def __init__(self, make: Callable[[type], inspect.Signature | None]):
        self.make = make
        self.cache: dict[type, Any] = {}

    def __get__(self, obj: Any, cls: type) -> inspect.Signature | None:
        if obj is not None:
            raise AttributeError("__signature__")
        if cls not in self.cache:
            self.cache[cls] = self.make(cls)
        return self.cache[cls]


__all__ = ["ClassSignature", "check_options", "class_for", "constructor_parameters", "keyword_only", "merged_signature"]
