"""Issue 43 item 5: an error echoes at most a bounded part of what it refuses. A 1 MB unknown metric
name, manifest key, label key or path was echoed whole (in a 400 answer, a log line, a one-line CLI
error); each now shows its first characters and its length."""

from __future__ import annotations

import json
import re

import pytest

from capreward import registry
from capreward.adapters.factory import RewardOptions, build_reward
from capreward.adapters.labels import LabelError, parse_label
from capreward.jobs.manifest import ManifestError, read_manifest
from capreward.jobs.runners import ScoreOptions
from capreward.text import ECHO_CHARS, capped

HUGE = "z" * 1_000_000
#: What a message may hold besides the echo: its own words and the metric names it lists.
WORDS = 1_000


def short(exc: BaseException) -> str:
    text = str(exc)
    assert len(text) < WORDS + ECHO_CHARS, len(text)
    assert re.search(r"\(100000\d characters\)", text), text[:300]
    return text


def test_capped_shows_the_start_and_the_length():
    assert capped("emscor") == "'emscor'"
    assert capped(HUGE) == repr("z" * ECHO_CHARS) + "... (1000000 characters)"
    assert len(capped(list(range(10**6)))) <= ECHO_CHARS + 3


def test_an_unknown_metric_name_is_not_echoed_whole():
    with pytest.raises(registry.UnknownMetric) as info:
        registry.get(HUGE)
    short(info.value)
    with pytest.raises(registry.UnknownMetric) as info:
        build_reward(HUGE, RewardOptions())
    short(info.value)
    with pytest.raises(ValueError) as info:
        ScoreOptions(metrics=[HUGE])
    short(info.value)
    # a near miss is still named
    with pytest.raises(registry.UnknownMetric, match="did you mean 'emscore'"):
        registry.get("emscor")


def test_a_manifest_key_and_a_label_key_are_not_echoed_whole(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"caption": "a cat", "image": "i.png", "id": HUGE}) + "\n"
                        + json.dumps({"caption": "a cat", "image": "i.png", "id": HUGE}) + "\n")
    with pytest.raises(ManifestError) as info:
        read_manifest(manifest)
    short(info.value)
    manifest.write_text(json.dumps({"caption": "a cat", "image": "i.png", "errors/" + HUGE: 1}) + "\n")
    with pytest.raises(ManifestError) as info:
        read_manifest(manifest)
    short(info.value)
    with pytest.raises(LabelError) as info:
        parse_label({"image": "a.png", HUGE: 1}, "labels[0]")
    short(info.value)
    with pytest.raises(LabelError, match=r"unknown keys \['k0', 'k1', 'k10', 'k11', 'k12' and 95 more\]"):
        parse_label({"image": "a.png", **{f"k{i}": i for i in range(100)}}, "labels[0]")
    with pytest.raises(LabelError) as info:
        parse_label({"image": " " * 1_000_000}, "labels[0]")
    short(info.value)
