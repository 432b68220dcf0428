"""Modules moved to a place that says what they hold keep their old import paths, as the same module
objects; and the one weighted-terms syntax of serve and the recipe."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from capreward._moved import MOVED
from capreward.terms import parse_weighted_terms


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_moved_module_itself(old):
    code = (f"import importlib, sys; old = importlib.import_module({old!r}); new = importlib.import_module({MOVED[old]!r});"
            f"assert old is new and sys.modules[{old!r}] is new and new.__spec__.name == {MOVED[old]!r}; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_from_imports_of_old_paths_give_the_same_objects():
    from capreward.adapters import RewardHTTPServer, make_server
    from capreward.adapters.openrlhf import make_server as old_make_server
    from capreward.server.http import RewardHTTPServer as new_server
    from capreward.server.http import make_server as new_make_server

    assert make_server is old_make_server is new_make_server and RewardHTTPServer is new_server
    from capreward.scorers.partial import score_valid
    from capreward.scorers.bad_items import score_valid as new_score_valid

    assert score_valid is new_score_valid
    from capreward.rewards.support import content_mask
    from capreward.metrics.token_support import content_mask as new_content_mask

    assert content_mask is new_content_mask
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("capreward.adapters.no_such_module")


def test_one_weighted_terms_syntax_accepts_both_separators():
    assert parse_weighted_terms("emscore=1, clipscore:0.5,hallucination") == [
        ("emscore", 1.0), ("clip_s", 0.5), ("hallucination", 1.0)]
    assert parse_weighted_terms("emscore=1,clip_s=0.5") == parse_weighted_terms("emscore:1,clip_s:0.5")
    with pytest.raises(ValueError, match="did you mean 'emscore'"):
        parse_weighted_terms("emscor=1")
    with pytest.raises(ValueError, match="bad weight 'x'"):
        parse_weighted_terms("emscore=x")
    with pytest.raises(ValueError, match="given twice"):
        parse_weighted_terms("emscore=1,em=2")
    assert parse_weighted_terms("emscore=1,em=2", unique=False) == [("emscore", 1.0), ("emscore", 2.0)]
    from capreward.adapters.factory import parse_terms

    assert parse_terms("emscore:1,composite=2") == [("emscore", 1.0), ("composite", 2.0)]
