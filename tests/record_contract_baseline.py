"""Record what every metric's reward, torchmetrics Metric and ``capreward score`` job give on its tiny model
(tests/contract_cases.py), through the public names only, as tests/data/contract_baseline.json.

Run once on the code before the one-contract redesign (issue #40; commit 5b8107d):
``PYTHONPATH=src python tests/record_contract_baseline.py``. tests/test_conformance.py compares the
generic classes against the file: the same values, log keys (with the renames the one sub-score vocabulary
made, listed there), Metric columns and results-file fields.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from contract_cases import BUILTIN, Models, cases  # noqa: E402

OUT = Path(os.environ.get("CONTRACT_BASELINE", HERE / "data" / "contract_baseline.json"))

#: The named reward class of each metric (public names).
REWARD_CLASSES = {
    "emscore": "capreward.rewards:EMScoreReward", "clip_s": "capreward.rewards:CLIPScoreReward",
    "pac_s": "capreward.rewards:PACScoreReward", "fleur": "capreward.rewards:FLEURReward",
    "hallucination": "capreward.rewards:HallucinationPenalty", "visce2": "capreward.rewards:VisCE2Reward",
    "gveval": "capreward.rewards:GVEvalReward", "claims": "capreward.rewards.claims:ClaimsReward",
    "qa_utility": "capreward.rewards.qa_utility:QAUtilityReward",
}
#: The named torchmetrics Metric of each metric that has one.
METRIC_CLASSES = {
    "emscore": "capreward.torchmetrics:EMScoreMetric", "clip_s": "capreward.torchmetrics:CLIPScoreMetric",
    "fleur": "capreward.torchmetrics:FLEURMetric", "visce2": "capreward.torchmetrics:VisCE2Metric",
    "gveval": "capreward.torchmetrics:GVEvalMetric",
}
#: Reward options tried per metric besides the defaults, and whether the case has references.
REWARD_VARIANTS: dict[str, list[tuple[dict, bool | None]]] = {
    "emscore": [({}, None), ({}, False), ({"field": "coarse"}, None), ({"harmonic_mean": "released"}, None)],
    "clip_s": [({}, None), ({}, False), ({"harmonic_mean": "released"}, None), ({"use_references": False}, None)],
    "pac_s": [({}, None)],
    "hallucination": [({}, None), ({"threshold": 0.3}, None)],
    "fleur": [({}, None), ({}, True)],
    "visce2": [({}, None), ({"use_expected": True}, None), ({"scale": 1.0}, None)],
    "gveval": [({}, None), ({"mode": "combined"}, True)],
    "claims": [({}, None), ({"part": "precision"}, None), ({"part": "recall"}, False)],
    "qa_utility": [({}, None)],
}
METRIC_VARIANTS: dict[str, list[tuple[dict, bool | None]]] = {
    "emscore": [({"visual": "image"}, None), ({"visual": "image"}, False)],
    "clip_s": [({}, None), ({}, False)],
    "pac_s": [({}, None)],
    "hallucination": [({"visual": "image"}, None)],
    "fleur": [({}, None)],
    "visce2": [({}, None), ({"expected": True}, None)],
    "gveval": [({}, None)],
    "claims": [({}, None)],
    "qa_utility": [({}, None)],
}


def load(path: str) -> Any:
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def plain(value: Any) -> Any:
    """JSON-ready: NaN and infinities as strings, tensors and arrays as lists, errors as text."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def key(options: dict, refs: bool | None) -> str:
    return json.dumps({"options": options, "references": refs}, sort_keys=True)


def reward_runs(models: Models, metric: str, tmp: Path, labels: tuple[str, ...] = ("named", "generic"),
                restore: dict | None = None) -> dict:
    """``restore``: options added to every variant (a later, deliberate change of behaviour undone)."""
    from capreward.rewards import MetricReward

    out: dict[str, Any] = {}
    named = load(REWARD_CLASSES[metric])
    out["signature"] = str(inspect.signature(named))
    for options, refs in REWARD_VARIANTS[metric]:
        case = cases(metric, tmp, refs)
        runs = {}
        for label, build in (("named", lambda o: named(**o)), ("generic", lambda o: MetricReward(metric, **o))):
            if label not in labels:
                continue
            try:
                reward = build({**models.scorer_option(metric), **(restore or {}), **options})
                logged: dict = {}
                extra: dict = {}
                values = reward(None, case.captions, log_metric=logged.__setitem__, log_extra=extra.__setitem__,
                                **case.columns())
                runs[label] = {"values": values, "logged": logged, "extra": extra, "name": reward.__name__,
                               "metric_names": list(reward.metric_names()), "value_range": list(reward.value_range())}
            except Exception:  # noqa: BLE001 - what main gives, an error included
                runs[label] = {"error": traceback.format_exc().strip().splitlines()[-1]}
        out[key(options, refs)] = runs
    return out


def metric_runs(models: Models, metric: str, tmp: Path, restore: dict | None = None) -> dict:
    """``restore``: as for :func:`reward_runs`."""
    from capreward.torchmetrics import RegisteredMetric

    out: dict[str, Any] = {}
    named = load(METRIC_CLASSES[metric]) if metric in METRIC_CLASSES else None
    if named is not None:
        out["signature"] = str(inspect.signature(named))
    for options, refs in METRIC_VARIANTS[metric]:
        case = cases(metric, tmp, refs)
        runs = {}
        builders = [("generic", lambda o: RegisteredMetric(metric, **o))]
        if named is not None:
            builders.insert(0, ("named", lambda o: named(**o)))
        for label, build in builders:
            try:
                m = build({**models.scorer_option(metric), **(restore or {}), **options, "per_sample": True, "sub_scores": True})
                m.update(case.captions, case.images, case.references)
                runs[label] = {"columns": list(m.columns), "name": m.name, "compute": plain(m.compute()),
                               "bounds": [float(m.plot_lower_bound), float(m.plot_upper_bound)]}
            except Exception:  # noqa: BLE001
                runs[label] = {"error": traceback.format_exc().strip().splitlines()[-1]}
        out[key(options, refs)] = runs
    return out


def job_runs(models: Models, metric: str, tmp: Path, flags: dict | None = None, restore: dict | None = None) -> dict:
    """``flags``: job flag values (``ScoreOptions`` fields); ``restore``: scorer options added to the
    metric's scorer (a later, deliberate change of a default undone)."""
    from capreward.jobs.manifest import read_manifest
    from capreward.jobs.runners import ManifestScorer, ScoreOptions

    class TinyJob(ManifestScorer):
        def local_judge(self):
            return models.fleur

        def chat_backend(self):
            return models.claim if metric == "claims" else models.vlm

        def scorer_for(self, spec):
            scorer = super().scorer_for(spec)
            for name, value in (restore or {}).items():
                setattr(scorer, name, value)
            return scorer

    out: dict[str, Any] = {}
    for refs in (True, False):
        case = cases(metric, tmp, refs)
        manifest = tmp / f"{metric}_{refs}.jsonl"
        manifest.write_text("".join(json.dumps(r) + "\n" for r in case.rows()), encoding="utf-8")
        try:
            options = ScoreOptions(metrics=[metric], clip_model=models.clip, batch_size=8,
                                   **({"pac_model": models.clip} if metric == "pac_s" else {}),
                                   **({"qa_model": models.qa_dir} if metric == "qa_utility" else {}), **(flags or {}))
            job = TinyJob(options)
            rows = list(read_manifest(manifest))
            results = job.score_rows(rows)
            out[str(refs)] = [{k: plain(v) for k, v in r.items() if k not in ("caption", "image", "references",
                                                                               "questions")}
                              for r in results]
        except Exception:  # noqa: BLE001
            out[str(refs)] = {"error": traceback.format_exc().strip().splitlines()[-1]}
    return out


def main() -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    models = Models()
    record: dict[str, Any] = {}
    only = sys.argv[1:] or BUILTIN
    if OUT.exists():
        record = json.loads(OUT.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for metric in only:
            print(metric, flush=True)
            record[metric] = {"reward": plain(reward_runs(models, metric, tmp)),
                              "metric": plain(metric_runs(models, metric, tmp)),
                              "job": plain(job_runs(models, metric, tmp))}
            OUT.parent.mkdir(exist_ok=True)  # written after each metric: a long run keeps what it did
            OUT.write_text(json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
