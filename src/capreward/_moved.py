"""Old import paths of modules that moved to a place that says what they hold.

``import capreward.adapters.openrlhf`` (and ``from capreward.adapters.openrlhf import make_server``) keeps
working: a meta-path finder answers each old name with the module at its new place, the same module
object, so ``isinstance`` checks and monkeypatching see one module. Installed by ``capreward/__init__``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old module name -> new module name
MOVED = {
    "capreward.adapters.openrlhf": "capreward.server.http",
    "capreward.adapters.batching": "capreward.server.batching",
    "capreward.adapters.connections": "capreward.server.connections",
    "capreward.callbacks.tm_metrics": "capreward.torchmetrics.metrics",
    "capreward.callbacks.tm_judges": "capreward.torchmetrics.judges",
    "capreward.scorers.partial": "capreward.scorers.bad_items",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new place (imported once, under its new name)."""

    def __init__(self, target: str):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec  # the import system set the alias's spec: give the module its own back


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds each old name of :data:`MOVED` as its new module."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
