"""Print the pip requirements of one end of the version matrix (see scripts/version_matrix.sh).

``oldest``: every dependency of pyproject.toml's [project.dependencies] and of its extras (except
those listed in SKIPPED_EXTRAS) pinned to its declared lower bound (``name==X`` for ``name>=X``);
``newest``: the same requirements as declared, for ``pip install --upgrade`` (the newest allowed).
torch and torchvision are left out of both: the matrix keeps the local torch 2.14.1 / torchvision
0.29.1 at both ends (any other torch is a download of gigabytes).
Usage: python scripts/matrix_requirements.py oldest|newest
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# extras the integration tests do not import (the engines for files and servers, the test tools, plots,
# the docs site builder)
SKIPPED_EXTRAS = {"test", "ray", "serve", "plot", "all", "dev", "docs"}
FIXED = {"torch", "torchvision"}  # kept at the bootstrap's local wheels at both ends


def requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra, items in project.get("optional-dependencies", {}).items():
        if extra not in SKIPPED_EXTRAS:
            reqs.extend(item for item in items if not item.startswith("capreward"))
    return reqs


def name_of(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")


def oldest(req: str) -> str:
    """``name==lower`` for a requirement with a ``>=`` bound (extras and markers kept), else as is."""
    match = re.search(r">=\s*([0-9][^,;\s]*)", req)
    if not match:
        return req
    head = re.match(r"[A-Za-z0-9_.\-]+(\[[^\]]*\])?", req).group(0)
    marker = req.split(";", 1)[1] if ";" in req else None
    return f"{head}=={match.group(1)}" + (f"; {marker.strip()}" if marker else "")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("oldest", "newest"):
        print(__doc__, file=sys.stderr)
        return 2
    seen: set[str] = set()
    for req in requirements(Path(__file__).resolve().parents[1] / "pyproject.toml"):
        name = name_of(req)
        if name in FIXED or name in seen:
            continue
        seen.add(name)
        print(oldest(req) if argv[0] == "oldest" else req)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
