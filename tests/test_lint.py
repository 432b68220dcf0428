"""The package is clean under the linters pyproject.toml configures: ruff ([tool.ruff]: pyflakes, bugbear,
pyupgrade) and mypy ([tool.mypy]: bodies of unannotated functions checked too). Each runs as a developer
runs it (docs/development.md), from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=1800)


def test_ruff_finds_nothing_in_the_package():
    out = run("ruff", "check", "--no-cache", "src/capreward")
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_package():
    """mypy's cache lives beside the trained fixtures (``$CAPREWARD_CACHE/mypy``), so a CI run on a fresh
    clone starts warm where an earlier run left it (about half the CPU of a cold run)."""
    from capreward.testing.tiny_llava import cache_root

    out = run("mypy", "--cache-dir", str(cache_root() / "mypy"))
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


BROKEN = '''
def late(xs: list[int]) -> list:
    return [lambda: x for x in xs]


def undefined() -> object:
    return undefined_name


def typed(n: int) -> str:
    return n
'''


def test_the_linters_find_what_they_are_configured_to_find(tmp_path):
    """The control: the same configuration reports an undefined name and a late-bound loop variable
    (ruff) and a wrong return type (mypy)."""
    bad = tmp_path / "bad.py"
    bad.write_text(BROKEN)
    config = str(REPO / "pyproject.toml")
    ruff = run("ruff", "check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert ruff.returncode == 1 and "F821" in ruff.stdout and "B023" in ruff.stdout, ruff.stdout + ruff.stderr
    mypy = run("mypy", "--config-file", config, "--cache-dir", str(tmp_path / "cache"), str(bad), cwd=tmp_path)
    assert mypy.returncode == 1 and "[return-value]" in mypy.stdout, mypy.stdout
