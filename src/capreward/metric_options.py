"""Options objects that hold the metrics' own settings beside their shared fields.

:class:`~capreward.jobs.runners.ScoreOptions` (``capreward score``) and
:class:`~capreward.adapters.factory.RewardOptions` (the adapters) are dataclasses of the options every
metric shares, plus ``metric_options``: each metric's own settings (its spec's
:attr:`~capreward.registry.MetricSpec.job_flags`), given as keyword arguments and read as attributes by
the flag's name (``options.gveval_mode``), so no consumer lists them and a metric registered later has
its settings there too. An attribute not given reads the flag's default (the option's default it sets).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable

from . import registry


class FlagFields:
    """Mixin over a dataclass with a ``metric_options`` field: the metrics' flags chosen by
    :meth:`_flag_filter` as keyword arguments and attributes (see the module)."""

    @staticmethod
    def _flag_filter(flag: registry.JobFlag) -> bool:
        return True

    @classmethod
    def _flags(cls) -> dict[str, tuple[registry.MetricSpec, registry.JobFlag]]:
        return {flag.name: (spec, flag) for spec, flag in registry.job_flags() if cls._flag_filter(flag)}

    def __init__(self, *args: Any, metric_options: dict[str, Any] | None = None, **kwargs: Any):
        flags = self._flags()
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in flags}
        shared = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = [k for k in kwargs if k not in shared]
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword argument(s) {unknown}; the metrics' own "
                            f"options: {', '.join(flags)}")
        values: dict[str, Any] = {name: None for name in flags}
        values.update(metric_options or {})
        values.update(own)
        super().__init__(*args, metric_options=values, **kwargs)  # type: ignore[call-arg]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "metric_options":
            raise AttributeError(name)
        flags = self._flags()
        if name not in flags:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        spec, flag = flags[name]
        return spec.job_value(flag, self.metric_options.get(name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "metric_options" and name not in self.__dataclass_fields__ and name in self._flags():
            self.metric_options[name] = value
        else:
            super().__setattr__(name, value)

    def options_of(self, spec: registry.MetricSpec) -> dict[str, Any]:
        """The scorer options ``spec``'s flags of this object set (option -> value, defaults filled)."""
        return {f.option: spec.job_value(f, self.metric_options.get(f.name))
                for f in spec.job_flags if f.option and self._flag_filter(f)}


def typed(flag: registry.JobFlag) -> Callable[[str], Any]:
    """How a text value of ``flag`` (an environment variable) is read."""
    if flag.type == "flag":
        return lambda text: text.strip().lower() in ("1", "true", "yes", "on")
    return {"str": str, "int": int, "float": float}[flag.type]
