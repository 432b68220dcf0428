"""The trained judges the repository keeps (tests/data/trained, see tests/train_fixtures.py): exactly the
ones the current code trains, copied into an empty cache before a run and then found there by the same
lookups that would otherwise train them."""

from __future__ import annotations

import pytest

import train_fixtures
from capreward.testing.cache import cache_root
from capreward.testing.tiny_llava import FLEUR_RECIPE, tiny_judge_dir

STORED_TORCH = (train_fixtures.STORE / "torch_version.txt").read_text().strip()


def test_the_repository_keeps_exactly_the_judges_this_code_trains():
    import torch

    if torch.__version__ != STORED_TORCH:
        pytest.skip(f"the keys hold the torch version: stored under {STORED_TORCH}, this is {torch.__version__}")
    stored, current = train_fixtures.stored_names(), sorted(train_fixtures.judge_names())
    assert stored == current, (
        "the stored trained judges are not the ones this code trains (a judge's recipe or source changed): run "
        f"`python tests/train_fixtures.py store` and commit tests/data/trained\nstored: {stored}\ncurrent: {current}")


def test_seeding_fills_an_empty_cache_once_and_the_lookup_then_finds_the_judge(tmp_path):
    names = train_fixtures.stored_names()
    assert len(names) == len(train_fixtures.STORED)
    assert train_fixtures.seed_cache(tmp_path) == names
    for name in names:
        assert (tmp_path / name / "config.json").exists() and (tmp_path / name / "model.safetensors").exists()
    weights = tmp_path / next(n for n in names if "/fleur-" in n) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert train_fixtures.seed_cache(tmp_path) == []  # nothing missing: nothing copied
    if f"tiny_llava/{FLEUR_RECIPE.name}-{FLEUR_RECIPE.key()}" in names:  # this torch's key: found, not trained
        assert tiny_judge_dir(FLEUR_RECIPE, cache_dir=tmp_path) == weights.parent
        assert weights.stat().st_mtime_ns == before


def test_the_light_cache_root_is_the_packages(monkeypatch, tmp_path):
    monkeypatch.setenv("CAPREWARD_CACHE", str(tmp_path))
    assert train_fixtures.tests_cache_root() == cache_root() == tmp_path
    monkeypatch.delenv("CAPREWARD_CACHE")
    assert train_fixtures.tests_cache_root() == cache_root()
