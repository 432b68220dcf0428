"""The named classes give what they gave before the one-contract redesign (issue #40): every metric's reward
(values, log keys and logged means, reasons, range, signature), torchmetrics Metric (columns, means and
per-sample values, name, bounds) and ``capreward score`` rows, on its tiny model, against
tests/data/contract_baseline.json, which tests/record_contract_baseline.py recorded from the code before
the change (5b8107d) through the same public names.

The one sub-score vocabulary renamed a few keys and added the sub-scores each metric declares; every
difference allowed is listed below (and in docs/adding-a-metric.md), nothing else may differ."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import record_contract_baseline as rec
from contract_cases import BUILTIN, Models

BASELINE = json.loads((Path(__file__).parent / "data" / "contract_baseline.json").read_text(encoding="utf-8"))

#: Reward log keys renamed (old -> new): FLEUR's answer read as a number is ``parsed``, as G-VEval's.
RENAMED_LOGS = {"fleur": {"raw_score": "parsed"}}
#: Reward log keys whose meaning changed: VisCE²'s ``parsed`` is the integer written (was 1/0 whether
#: there was one; the Metric's ``scored`` and the reward's ``unscored_frac`` count the scored captions).
CHANGED_LOGS = {"visce2": {"parsed"}}
#: Metric columns renamed (old -> new): RefCLIP-S is the sub-score ``ref`` everywhere, the headline under
#: the metric's name (PAC-S's ``pac_s``), FLEUR's 1/0 parse rate ``scored`` (as the other judges'), the
#: penalty's counts as the reward logs them.
RENAMED_COLUMNS = {"clip_s": {"ref_clip_s": "ref"}, "pac_s": {"ref_clip_s": "ref", "clip_s": "pac_s"},
                   "fleur": {"parsed": "scored"},
                   "hallucination": {"flagged": "unsupported_tokens", "content": "content_tokens"}}
#: Metric columns gone: the claims' verdict lists (not numbers: they were NaN columns).
DROPPED_COLUMNS = {"claims": {"claims"}}
#: Metric columns whose values changed: a count is NaN for an empty caption (was ``empty_score``).
CHANGED_COLUMNS = {"claims": {"n_claims"}}
#: Signature defaults that changed: the QA-utility reward reads no references (its spec's reference mode).
CHANGED_DEFAULTS = {"qa_utility": {"use_references"}}

#: Behaviour changed on purpose after the redesign, and the options that give the recorded behaviour back
#: (compared with them): the hallucination penalty prices each unsupported word (claim_cost 0.5, issue #41
#: item 1) and pays a caption without content a wrong caption's -1 (item 2); `capreward score` forms
#: EMScore's F and RefCLIP-S / RefPAC-S sign-safely by default (issue #43 item 7, --harmonic-mean).
RESTORED = {"hallucination": {"claim_cost": None, "empty_penalty": -0.5}}
RESTORED_JOB_FLAGS = {"emscore": {"harmonic_mean": "released"}, "clip_s": {"harmonic_mean": "released"},
                      "pac_s": {"harmonic_mean": "released"}}

ID_FIELDS = ("id", "errors", "visual_hash")


@pytest.fixture(scope="module")
def models():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Models()
    torch.set_num_threads(threads)


def same(a, b, tol: float = 1e-5) -> bool:
    """Equal (floats within ``tol``; "nan" as recorded equals NaN), recursively."""
    a, b = rec.plain(a), rec.plain(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= tol * max(1.0, abs(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b))
    return a == b


def parameters(signature: str) -> dict[str, str]:
    """name -> default of a recorded signature's text."""
    inner = signature.strip()[1:-1]
    out, depth, part = {}, 0, ""
    for ch in inner + ",":
        if ch in "([{" and not part.count("'") % 2:
            depth += 1
        elif ch in ")]}" and not part.count("'") % 2:
            depth -= 1
        if ch == "," and depth == 0:
            p = part.strip()
            if p and p not in ("*", "/"):
                name = p.split(":")[0].split("=")[0].strip().lstrip("*")
                out[name] = p.split("=", 1)[1].strip() if "=" in p else ""
            part = ""
        else:
            part += ch
    return out


@pytest.mark.parametrize("metric", BUILTIN)
def test_the_named_reward_gives_what_it_gave(metric, models, tmp_path):
    import inspect

    old = BASELINE[metric]["reward"]
    now = rec.reward_runs(models, metric, tmp_path, labels=("named",), restore=RESTORED.get(metric))
    renamed = RENAMED_LOGS.get(metric, {})
    new_params = parameters(now["signature"])
    for name, default in parameters(old["signature"]).items():
        assert name in new_params, (metric, name)
        if name not in CHANGED_DEFAULTS.get(metric, ()):
            assert new_params[name] == default, (metric, name, default, new_params[name])
    for key, runs in old.items():
        if key == "signature":
            continue
        was, got = runs["named"], now[key]["named"]
        assert "error" not in got, (metric, key, got)
        assert same(got["values"], was["values"]) and got["name"] == was["name"], (metric, key)
        assert same(got["value_range"], was["value_range"]) and got["extra"] == was["extra"], (metric, key)
        declared = set(got["metric_names"])
        assert {renamed.get(k, k) for k in was["metric_names"]} <= declared, (metric, key)
        for k, v in was["logged"].items():
            sub = k.rsplit(f"rewards/{metric}/", 1)[-1]
            if sub in CHANGED_LOGS.get(metric, ()):
                continue
            new_key = f"rewards/{metric}/{renamed.get(sub, sub)}"
            assert same(got["logged"][new_key], v), (metric, key, k)
        from capreward import registry

        spec = registry.get(metric)
        allowed = {*spec.all_sub_scores(None, ("score", "number")), spec.name, "truncated", "clipped", "injection"}
        added = declared - {renamed.get(k, k) for k in was["metric_names"]}
        assert added <= allowed, (metric, key, added)
    assert inspect.signature  # the signatures were compared above


@pytest.mark.parametrize("metric", BUILTIN)
def test_the_metric_gives_what_it_gave(metric, models, tmp_path):
    old = BASELINE[metric]["metric"]
    now = rec.metric_runs(models, metric, tmp_path, restore=RESTORED.get(metric))
    renamed = RENAMED_COLUMNS.get(metric, {})
    if "signature" in old:
        new_params = parameters(now["signature"])
        assert all(new_params.get(n) == d for n, d in parameters(old["signature"]).items()), metric
    for key, runs in old.items():
        if key == "signature":
            continue
        for label, was in runs.items():
            if "error" in was:  # main could not build it (QA utility's Metric without questions)
                continue
            got = now[key][label]
            assert "error" not in got, (metric, key, label, got)
            assert got["name"] == was["name"] and same(got["bounds"], was["bounds"]), (metric, key, label)
            kept = [c for c in was["columns"] if c not in DROPPED_COLUMNS.get(metric, ())]
            assert {renamed.get(c, c) for c in kept} <= set(got["columns"]), (metric, key, label)
            for k, v in was["compute"].items():
                column = k.removeprefix("per_sample/")
                if column in DROPPED_COLUMNS.get(metric, ()) or column in CHANGED_COLUMNS.get(metric, ()):
                    continue
                new = ("per_sample/" if k.startswith("per_sample/") else "") + renamed.get(column, column)
                assert same(got["compute"][new], v), (metric, key, label, k)


@pytest.mark.parametrize("metric", BUILTIN)
def test_the_job_writes_what_it_wrote(metric, models, tmp_path):
    from capreward import registry

    spec = registry.get(metric)
    old = BASELINE[metric]["job"]
    now = rec.job_runs(models, metric, tmp_path, flags=RESTORED_JOB_FLAGS.get(metric), restore=RESTORED.get(metric))
    for refs, rows in old.items():
        for was, got in zip(rows, now[refs]):
            for k, v in was.items():
                assert same(got.get(k), v), (metric, refs, was["id"], k, got.get(k), v)
            added = set(got) - set(was)
            declared = set(spec.fields({"references": refs == "True"})) | set(spec.all_fields())
            assert added <= declared, (metric, refs, added)
