"""The tiny-model fixture cache: one directory per version key, kept side by side (two environments with
other library versions must not delete and retrain each other's judges), other keys pruned only when
long unused and not being built, and a rebuild that swaps the directory in atomically (a reader never
finds it missing)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from capreward.testing import cache, tiny_llava
from capreward.testing.tiny_llava import FLEUR_RECIPE, tiny_judge_dir, with_spec

#: A judge that trains in a second: one step on one example.
QUICK = replace(with_spec(FLEUR_RECIPE, text_layers=1, vision_layers=1), name="quick", steps=1, batch_size=1)


def test_a_judge_of_another_key_is_kept_when_recently_used(tmp_path):
    """Two keys of one recipe (as two venvs with other torch versions would have): building the
    second leaves the first in place, so neither environment retrains."""
    first = tiny_judge_dir(QUICK, cache_dir=tmp_path)
    other = replace(QUICK, seed=1)  # another key, same recipe name
    second = tiny_judge_dir(other, cache_dir=tmp_path)
    assert first != second and first.parent == second.parent
    assert (first / "config.json").exists() and (second / "config.json").exists()
    built = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_judge_dir(QUICK, cache_dir=tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == built  # reused, not retrained


def test_only_long_unused_keys_that_nobody_builds_are_pruned(tmp_path):
    root = tmp_path / "tiny_llava"
    root.mkdir()
    old_time = time.time() - (cache.STALE_AFTER_DAYS + 1) * 86400

    def fake(key: str, last_used: float) -> Path:
        d = root / f"quick-{key}"
        d.mkdir()
        (d / "config.json").write_text("{}")
        (d / cache.USED_MARKER).touch()
        os.utime(d / cache.USED_MARKER, (last_used, last_used))
        return d

    recent = fake("1" * 16, time.time() - 3600)
    stale = fake("2" * 16, old_time)
    busy = fake("3" * 16, old_time)
    unrelated = root / ("fleur-" + "4" * 16)
    shutil.copytree(stale, unrelated)
    with cache.locked(root / f".{busy.name}.lock"):  # being built or rebuilt right now
        target = tiny_judge_dir(QUICK, cache_dir=tmp_path)
    assert target.exists() and recent.exists() and busy.exists() and unrelated.exists()
    assert not stale.exists()


def test_a_rebuild_swaps_the_directory_in_without_a_moment_without_it(tmp_path, monkeypatch):
    target = tiny_judge_dir(QUICK, cache_dir=tmp_path)
    inode = target.stat().st_ino
    held = (target / "config.json").open("rb")  # a reader that has the old judge open
    removed = []
    real_rmtree = shutil.rmtree

    def watching_rmtree(path, *args, **kwargs):
        removed.append(Path(path))
        assert (target / "config.json").exists(), "the cached judge was missing while it was replaced"
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(tiny_llava.shutil, "rmtree", watching_rmtree)
    assert tiny_judge_dir(QUICK, cache_dir=tmp_path, rebuild=True) == target
    assert target.stat().st_ino != inode and (target / "config.json").exists()
    assert target not in removed and removed  # the old contents went, never the live directory
    assert held.read()  # the old files stay readable for whoever has them open
    held.close()
    leftovers = [p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}-")]
    assert leftovers == []


def test_install_directory_without_an_atomic_swap(tmp_path, monkeypatch):
    """Where the file system has no RENAME_EXCHANGE the old directory is renamed aside first."""
    monkeypatch.setattr(cache, "_exchange", lambda a, b: False)
    target, new = tmp_path / "judge", tmp_path / "new"
    target.mkdir()
    (target / "w").write_text("old")
    new.mkdir()
    (new / "w").write_text("new")
    cache.install_directory(new, target)
    assert (target / "w").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["judge"]


@pytest.mark.parametrize("swap", [True, False])
def test_install_directory_into_an_empty_place(tmp_path, monkeypatch, swap):
    if not swap:
        monkeypatch.setattr(cache, "_exchange", lambda a, b: False)
    new = tmp_path / "new"
    new.mkdir()
    (new / "w").write_text("x")
    cache.install_directory(new, tmp_path / "judge")
    assert (tmp_path / "judge" / "w").read_text() == "x" and not new.exists()
