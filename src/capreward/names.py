"""One name per metric, and one separator before a sub-score, at every entry point.

The canonical names (:data:`METRICS`) are what every entry point accepts and writes: ``capreward score
--metrics``, ``serve --reward``, ``explain --metric``, veRL's ``CAPREWARD_REWARD``, the reward classes'
``__name__`` (TRL's ``rewards/<name>/…``), the torchmetrics metrics' default names (``val/<name>`` in
Lightning, ``eval_<name>`` in the Trainer) and the fields of results files. :data:`ALIASES` is the one
table of other spellings, accepted wherever a name is read: :func:`canonical` maps any of them (case
and ``-``/``_`` insensitive) to the canonical name.

A sub-score is named ``<metric>/<sub-score>`` everywhere (:data:`SEP`): ``rewards/emscore/video/full_f``
in TRL, ``val/emscore/video/full_f`` in Lightning, ``eval_emscore/video/full_f`` in the Trainer,
``emscore/video/full_f`` in results files, ``video/full_f`` inside one metric's own output.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import registry
from .registry import normalize

# ``METRICS`` (every metric's one name, in the registry's order) and ``ALIASES`` (other spellings, as
# normalised by :func:`normalize` -> the name they stand for) are views of :mod:`capreward.registry`,
# read when accessed, so a metric registered later is in them.


def __getattr__(name: str):
    if name == "METRICS":
        return registry.names()
    if name == "ALIASES":
        return registry.aliases()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The separator between a metric and its sub-score, and between the parts of a sub-score.
SEP = "/"


def spelling(name: str) -> str:
    """``name`` normalised and, when it is an alias, the name it stands for (``CLIPScore`` → ``clip_s``);
    any other name comes back normalised (for a choices check to refuse)."""
    key = normalize(name)
    return registry.aliases().get(key, key)


def canonical(name: str, choices: Sequence[str] | None = None, what: str = "metric") -> str:
    """The canonical name of ``name`` (an alias or any spelling of a name in ``choices``; default: every
    registered metric).

    Raises ValueError naming ``name`` and ``choices`` (with the closest, "did you mean ...") when it is
    none of them.
    """
    if not isinstance(name, str):
        raise TypeError(f"a {what} name must be a str, got {type(name).__name__}")
    choices = registry.names() if choices is None else tuple(choices)
    key = spelling(name)
    if key not in choices:
        raise registry.UnknownMetric(registry.unknown_message(name, choices, what))
    return key


def sub_score(*parts: str) -> str:
    """``parts`` joined by :data:`SEP`: ``sub_score("emscore", "video", "full_f")`` = ``"emscore/video/full_f"``."""
    return SEP.join(parts)


def aliases_of(name: str) -> list[str]:
    """The aliases that :func:`canonical` maps to ``name``."""
    return [alias for alias, target in registry.aliases().items() if target == name]


__all__ = ["SEP", "aliases_of", "canonical", "normalize", "spelling", "sub_score"]
