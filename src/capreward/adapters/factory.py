"""Build a capreward reward by name, with the options the adapters expose (CLI flags, env variables)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import registry
from ..default_models import DEFAULT_CLIP
from ..metric_options import FlagFields, typed
from ..names import canonical
from ..terms import parse_weighted_terms

#: The reward built from several others (:func:`build_composite`).
COMPOSITE = "composite"


def reward_names() -> tuple[str, ...]:
    """Every metric of the registry, and ``composite``."""
    return (*registry.names(), COMPOSITE)


def __getattr__(name: str):
    # the tuples this module exported before the registry, now read from it
    if name == "REWARD_NAMES":
        return reward_names()
    if name == "CLIP_BASED":  # the rewards on a CLIP (they take the CLIP options)
        return registry.on_backbone("clip")
    if name == "JUDGE_BASED":  # the rewards that ask a chat judge (local, or a server with ``judge_url``)
        return registry.on_backbone("chat_judge")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_FLEUR = "llava-hf/llava-1.5-13b-hf"
VISUAL_ID_COLUMN = "visual_id"  # the adapters pass label ids under this column name


@dataclass
class SharedRewardOptions:
    """Options of the adapters' rewards (the metrics' own are :class:`RewardOptions` fields too).

    ``clip_model``: CLIP for clip_s/emscore (name/tag, OpenAI-format ``.pt`` path, ...);
    ``fleur_model``: LLaVA judge for fleur; ``idf``: a file with one caption per line (EMScore's idf
    corpus) or None for uniform weights; ``frames``: frames per video; ``w``: CLIP-S scale;
    ``composite``: ``"name=weight,..."`` terms of the composite reward; ``harmonic_mean``: how emscore's
    F and clip_s's RefCLIP-S are formed (``"sign-safe"``, the default, or the papers' ``"released"``
    formula; see :mod:`capreward.metrics.harmonic`).

    Chat judges (``fleur``, ``visce2``, ``gveval``): ``judge_url`` is an OpenAI-compatible server's base URL
    (vLLM: ``http://host:8000/v1``; veRL's reward pool: its ``reward_router_address``), then
    ``judge_model`` is the served model name, ``judge_api_key_env`` the variable holding its key and
    ``judge_top_logprobs_cap`` the most alternatives it serves (vLLM's ``--max-logprobs``); without
    ``judge_url`` the judge runs locally: ``judge_model`` (default ``fleur_model``) is the LLaVA judge
    for VisCE²/G-VEval and FLEUR uses ``fleur_model``. ``claims`` runs on the chat judge; ``qa_utility``
    asks the server at ``judge_url`` text-only questions, or locally the text-only causal LM ``qa_model``;
    its questions come from the samples' ``questions`` column (TRL) or are written once per visual by the
    chat judge (``judge_url`` or ``judge_model``), as in the server and veRL, whose labels carry no
    questions.
    """

    clip_model: str = DEFAULT_CLIP
    fleur_model: str = DEFAULT_FLEUR
    device: str = "cpu"
    precision: str | None = None
    dtype: str | None = None
    idf: str | None = None
    frames: int | None = 10
    w: float | None = None
    composite: str = "emscore=1.0,hallucination=1.0"
    harmonic_mean: str = "sign-safe"
    judge_url: str | None = None
    judge_model: str | None = None
    judge_api_key_env: str | None = "OPENAI_API_KEY"
    judge_top_logprobs_cap: int = 20
    # the metrics' own options (their specs' job flags marked ``adapters``), by flag name; read them as attributes
    metric_options: dict[str, Any] = field(default_factory=dict)


class RewardOptions(FlagFields, SharedRewardOptions):
    """The options of :class:`SharedRewardOptions`, and each metric's own options that the adapters take
    (its spec's :attr:`~capreward.registry.MetricSpec.job_flags` marked ``adapters``: ``gveval_mode``,
    ``ref-free``, ``ref-only`` or ``combined``; ``qa_model``, the text-only causal LM of ``qa_utility``),
    as keyword arguments and attributes (see :mod:`capreward.metric_options`).

    Examples:
        >>> from capreward.adapters.factory import RewardOptions
        >>> RewardOptions(gveval_mode="combined").gveval_mode, RewardOptions().gveval_mode
        ('combined', 'ref-free')
    """

    @staticmethod
    def _flag_filter(flag) -> bool:
        return flag.adapters

    @classmethod
    def from_env(cls, prefix: str = "CAPREWARD_") -> RewardOptions:
        """Options from ``CAPREWARD_CLIP_MODEL``, ``CAPREWARD_FLEUR_MODEL``, ``CAPREWARD_DEVICE``,
        ``CAPREWARD_PRECISION``, ``CAPREWARD_DTYPE``, ``CAPREWARD_IDF``, ``CAPREWARD_FRAMES`` (0 = all),
        ``CAPREWARD_W``, ``CAPREWARD_COMPOSITE``, ``CAPREWARD_HARMONIC_MEAN``, ``CAPREWARD_JUDGE_URL``,
        ``CAPREWARD_JUDGE_MODEL``, ``CAPREWARD_JUDGE_API_KEY_ENV``, ``CAPREWARD_JUDGE_TOP_LOGPROBS_CAP``
        and each metric's own option as ``CAPREWARD_<NAME>`` (``CAPREWARD_GVEVAL_MODE``,
        ``CAPREWARD_QA_MODEL``); unset ones keep their defaults.

        Args:
            prefix: the variables' prefix.

        Returns:
            The options.
        """
        env = os.environ
        opts = cls()
        for name in ("clip_model", "fleur_model", "device", "precision", "dtype", "idf", "composite", "harmonic_mean",
                     "judge_url", "judge_model", "judge_api_key_env"):
            value = env.get(prefix + name.upper())
            if value:
                setattr(opts, name, value)
        for name, (_, flag) in cls._flags().items():
            value = env.get(prefix + name.upper())
            if value:
                opts.metric_options[name] = typed(flag)(value)
        if env.get(prefix + "FRAMES"):
            frames = int(env[prefix + "FRAMES"])
            opts.frames = None if frames == 0 else frames
        if env.get(prefix + "W"):
            opts.w = float(env[prefix + "W"])
        if env.get(prefix + "JUDGE_TOP_LOGPROBS_CAP"):
            opts.judge_top_logprobs_cap = int(env[prefix + "JUDGE_TOP_LOGPROBS_CAP"])
        return opts


def canonical_name(name: str) -> str:
    """``name`` as one of :func:`reward_names`, through the registry's aliases (``clip-s``, ``clipscore``
    … accepted); ValueError naming the choices (and the closest) otherwise."""
    return canonical(name, reward_names(), what="reward")


def read_idf_corpus(path: str | os.PathLike) -> list[str]:
    """Non-empty lines of a text file (EMScore's idf corpus); ValueError if missing or empty."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"idf corpus file {os.fspath(path)!r} does not exist")
    lines = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"idf corpus file {os.fspath(path)!r} has no captions")
    return lines


def parse_terms(spec: str) -> list[tuple[str, float]]:
    """``"emscore=1,clip_s=0.5"`` → ``[("emscore", 1.0), ("clip_s", 0.5)]`` (a bare name has weight 1;
    ``name:weight`` is accepted too): :func:`capreward.terms.parse_weighted_terms` over
    :func:`reward_names`, names canonical."""
    return parse_weighted_terms(spec, reward_names(), what="reward", where=f" in composite spec {spec!r}",
                                unique=False)


def build_reward(name: str, options: RewardOptions | None = None, *, backbone: Any = None, **overrides: Any):
    """A capreward reward for ``name``: any metric of :mod:`capreward.registry` (its reward class,
    :meth:`~capreward.rewards.MetricReward.class_for`, given the options its spec says it takes), or
    ``composite``.

    Rewards read label ids from the ``visual_id`` column and build their model lazily on first use,
    except a composite, which loads the CLIP its CLIP-based terms share at once. ``backbone``: an
    existing :class:`~capreward.backbones.CLIPBackbone` for the CLIP-based rewards (then
    ``clip_model``/``precision`` are not used). ``overrides`` replace fields of ``options``.

    Args:
        name: a metric name or alias, or ``"composite"``.
        options: the adapters' options (default: :class:`RewardOptions` defaults).
        backbone: a CLIP backbone the CLIP-based rewards share.
        **overrides: fields of ``options`` to replace.

    Returns:
        The reward (a TRL reward function).

    Raises:
        ValueError: no reward has that name (naming the choices).
    """
    opts = options or RewardOptions()
    for key, value in overrides.items():
        if not hasattr(opts, key):
            raise TypeError(f"unknown reward option {key!r}")
        setattr(opts, key, value)
    kind = canonical_name(name)
    if kind == COMPOSITE:
        return build_composite(opts)
    common: dict[str, Any] = dict(visual_id_column=VISUAL_ID_COLUMN)
    spec = registry.get(kind)
    if spec.backbone == "clip":
        model = dict(backbone=backbone) if backbone is not None else dict(
            model=opts.clip_model, precision=opts.precision, device=opts.device)
        common.update(model, frames=opts.frames)
    from ..rewards import MetricReward

    reward = MetricReward.class_for(kind)
    if spec.text_judge:  # a text-only judge reads the caption alone
        # the server and veRL carry no questions in their labels: the chat judge writes them per visual (cached)
        writer = judge_backend(opts) if opts.judge_url or opts.judge_model else None
        return reward(backend=qa_backend(opts), question_backend=writer, **common)
    if spec.backbone == "clip":  # the options each CLIP metric has, read from its spec
        if spec.uses_idf:
            common["idf"] = read_idf_corpus(opts.idf) if opts.idf else False
        if spec.has_option("harmonic_mean"):
            common["harmonic_mean"] = opts.harmonic_mean
        if opts.w is not None and spec.has_option("w") and spec.shares == "clip":  # CLIP-S's scale
            common["w"] = opts.w
        return reward(**common)
    if spec.judge_backend:  # a scorer on any chat judge: the server of judge_url, or the local judge
        tree = dict(tree_top_logprobs=max(10, opts.judge_top_logprobs_cap)) if (
            opts.judge_url and spec.has_option("tree_top_logprobs")) else {}
        return reward(backend=judge_backend(opts), **opts.options_of(spec), **tree, **common)
    if spec.backbone != "chat_judge":  # a metric on no model the adapters configure: its own options only
        return reward(**opts.options_of(spec), **common)
    if opts.judge_url:  # a metric whose scorer needs a local model, on its scorer for a chat server
        remote = spec.load_remote_scorer()
        return reward(scorer=remote(judge_backend(opts), top_logprobs=min(20, opts.judge_top_logprobs_cap)), **common)
    return reward(model=opts.fleur_model, device=opts.device, **({} if opts.dtype is None else {"dtype": opts.dtype}),
                  **common)


def judge_backend(opts: RewardOptions) -> Any:
    """The chat judge of ``opts``: an :class:`~capreward.judges.remote.OpenAIJudge` on ``judge_url``, or
    a local :class:`~capreward.judges.local_chat.LocalChatJudge` on ``judge_model`` (default
    ``fleur_model``)."""
    if opts.judge_url:
        from ..judges.remote import OpenAIJudge

        if not opts.judge_model:
            raise ValueError("judge_url needs judge_model: the served model name (vLLM's --served-model-name)")
        return OpenAIJudge(opts.judge_url, opts.judge_model, api_key_env=opts.judge_api_key_env,
                           top_logprobs_cap=opts.judge_top_logprobs_cap)
    from ..judges.local_chat import LocalChatJudge
    from ..judges.local import LocalJudge

    kwargs: dict[str, Any] = {"device": opts.device}
    if opts.dtype is not None:
        kwargs["dtype"] = opts.dtype
    return LocalChatJudge(LocalJudge(opts.judge_model or opts.fleur_model, **kwargs))


def qa_backend(opts: RewardOptions) -> Any:
    """The text-only judge of ``qa_utility``: the server at ``judge_url``, or a local
    :class:`~capreward.judges.LocalTextJudge` on ``qa_model``."""
    if opts.judge_url:
        return judge_backend(opts)
    if not opts.qa_model:
        raise ValueError("qa_utility needs a text judge: qa_model (a causal LM name or directory) or judge_url")
    from ..judges.local_text import LocalTextJudge

    return LocalTextJudge(opts.qa_model)


def build_composite(opts: RewardOptions):
    """``CompositeReward`` of the terms in ``opts.composite`` with the default guards (repetition,
    truncation, over-length); its CLIP-based terms share one CLIP backbone."""
    from ..backbones import CLIPBackbone
    from ..rewards import CompositeReward

    terms = parse_terms(opts.composite)
    if any(kind == COMPOSITE for kind, _ in terms):
        raise ValueError("a composite reward cannot contain another composite")
    shared = None
    if sum(registry.get(kind).backbone == "clip" for kind, _ in terms) > 1:
        shared = CLIPBackbone(opts.clip_model, device=opts.device, precision=opts.precision)
    return CompositeReward([(build_reward(kind, opts, backbone=shared), weight) for kind, weight in terms])
