"""Optional dependencies ("extras") and the one-line error when one is missing.

``pip install capreward`` installs what the scorers and rewards import; every other integration lives in
an extra of pyproject.toml (docs/install.md's table lists them). A module that needs one imports it
through :func:`require`, which returns the module or raises :class:`MissingExtraError`, whose message is
one line naming the extra to install::

    lp = require("callbacks", "lightning.pytorch", "pytorch_lightning", used_by="CaptionScoreCallback")
    # ModuleNotFoundError: CaptionScoreCallback needs lightning.pytorch, which is not installed:
    #   pip install 'capreward[callbacks]'

Use it at the top of a module that cannot work without the extra (importing the module then fails at
once, naming the extra) or inside the function that first needs it (the module stays importable).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import CaprewardError

#: Extra name -> what it adds (the extras of pyproject.toml that code asks for by name).
EXTRAS: dict[str, str] = {
    "recipes": "the GRPO captioner recipe and the demo's GRPO run (trl, peft, datasets)",
    "demo": "everything `capreward demo` runs (the recipes extra)",
    "callbacks": "torchmetrics metrics, the Lightning callback and module, the transformers Trainer callback",
    "remote": "OpenAI-compatible remote judges (openai)",
    "metaeval": "meta-evaluation against human judgments (scipy)",
    "plot": "meta-evaluation plots (matplotlib)",
    "ray": "scoring jobs on a Ray Data actor pool (`capreward score --engine ray`)",
    "serve": "the reward server as Ray Serve replicas",
}


class MissingExtraError(CaprewardError, ModuleNotFoundError):
    """An optional dependency is not installed. ``extra``: the capreward extra that installs it;
    ``name``: the module that could not be imported. The message is one line ending with the
    ``pip install`` command."""

    def __init__(self, extra: str, module: str, used_by: str | None = None, missing: str | None = None):
        self.extra = extra
        what = used_by or "this feature"
        lacking = "is not installed" if missing in (None, module) else f"cannot be imported ({missing} is missing)"
        super().__init__(f"{what} needs {module}, which {lacking}: pip install 'capreward[{extra}]'", name=module)


def require(extra: str, *modules: str, used_by: str | None = None) -> ModuleType:
    """Import and return the first of ``modules`` that imports (alternatives, e.g. ``lightning.pytorch``
    then ``pytorch_lightning``). Raises :class:`MissingExtraError` naming ``extra`` (and ``used_by``, the
    feature that asked, e.g. ``"capreward demo"``) when none can be imported because it or one of its
    own dependencies is missing; an installed module that fails for another reason raises as it is."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; extras: {sorted(EXTRAS)}")
    if not modules:
        raise ValueError("require() needs at least one module name")
    missing = None
    for name in modules:
        try:
            return importlib.import_module(name)
        except MissingExtraError:
            raise
        except ModuleNotFoundError as exc:
            missing = missing or exc.name
    top = modules[0].split(".")[0]
    raise MissingExtraError(extra, modules[0], used_by, None if missing and missing.split(".")[0] == top else missing) from None
