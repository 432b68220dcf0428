"""The version matrix runs in CI as part of the test suite: ``bash scripts/version_matrix.sh`` installs
the lowest versions pyproject.toml allows, and then the newest, each in a virtual environment layered on
the bootstrap's .venv, and runs the integration tests (``-m "integration and not slow"``) at both ends.
Needs the package registry (pip) and the bootstrap's .venv. In the suite, the newest end is .venv itself
when pip would install nothing newer there (see below)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO, matrix_background

sys.path.insert(0, str(REPO / "scripts"))
import matrix_requirements  # noqa: E402


def test_oldest_end_pins_every_lower_bound():
    reqs = matrix_requirements.requirements(REPO / "pyproject.toml")
    oldest = [matrix_requirements.oldest(r) for r in reqs]
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for req in declared:
        bound = re.search(r">=\s*([0-9][^,;\s]*)", req)
        name = matrix_requirements.name_of(req)
        if bound and name not in matrix_requirements.FIXED:
            assert any(o.lower().replace("_", "-").startswith(f"{name}==") and o.split(";")[0].strip().endswith(bound.group(1))
                       for o in oldest), req
    assert matrix_requirements.oldest('foo[bar]>=1.2,<2; python_version < "3.13"') == 'foo[bar]==1.2; python_version < "3.13"'


def newest_missing_from_venv() -> str:
    """What pip would still upgrade in the bootstrap's .venv to reach the newest versions pyproject.toml
    allows (pip's own resolver, ``--dry-run``): empty when .venv is the newest end already."""
    reqs = subprocess.run([sys.executable, str(REPO / "scripts" / "matrix_requirements.py"), "newest"],
                          capture_output=True, text=True, check=True).stdout.split("\n")
    run = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pip", "install", "--dry-run",
                          "--upgrade", "--upgrade-strategy", "only-if-needed", "-c",
                          str(REPO / "scripts" / "constraints.txt"), *filter(None, reqs)],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout + run.stderr
    return "\n".join(line for line in run.stdout.splitlines() if line.startswith("Would install"))


def matrix_end(end: str, config) -> tuple[int, str]:
    """``(exit status, output)`` of ``scripts/version_matrix.sh END``: the run conftest.py started in the
    background when the session collected this test (waited for here), else a run started now."""
    import time

    started = matrix_background(config) if end == "oldest" else None
    if started is None:
        run = subprocess.run(["bash", str(REPO / "scripts" / "version_matrix.sh"), end], cwd=REPO,
                             capture_output=True, text=True, timeout=2400)
        return run.returncode, run.stdout + run.stderr
    status = Path(started["status"])
    deadline = time.monotonic() + 2400
    while not status.exists():
        assert time.monotonic() < deadline, "the background matrix run did not end in 40 minutes"
        time.sleep(5)
    return int(status.read_text().strip() or 1), Path(started["log"]).read_text(encoding="utf-8", errors="replace")


@pytest.mark.slow
def test_integration_tests_pass_at_the_oldest_and_newest_versions(request):
    """The oldest end runs in its own environment (started when the session collected this test: see
    conftest.py). The newest end is the bootstrap's .venv itself when pip finds nothing newer to install
    there (a fresh bootstrap resolves the newest allowed versions, and the suite runs the integration tests
    in it); only otherwise is it built and run separately."""
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("the matrix layers on the bootstrap's .venv (bash scripts/bootstrap.sh --test)")
    upgrades = newest_missing_from_venv()
    ends = ["oldest"] if not upgrades else ["oldest", "newest"]
    print(f"newest end: {'the suite in .venv (pip would install nothing newer)' if not upgrades else upgrades}")
    for end in ends:
        status, out = matrix_end(end, request.config)
        print(out)
        assert status == 0, out[-6000:]
        assert re.search(rf"\[matrix\] {end}: passed in \d+ s \(\d+ passed", out), out[-6000:]
