"""The parity tests (``pytest -m device_parity``) with their scorers on one device, as figures.

    python benchmarks/gpu_parity_tests.py --device cuda --json-out parity.json [-- PYTEST ARGS]

Runs ``python -m pytest -m device_parity`` with ``CAPREWARD_TEST_DEVICE`` set (tests/conftest.py reads it
once), reads pytest's JUnit XML and writes the counts, the failed tests with their messages and the
output's tail. Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--marker", default="device_parity")
    parser.add_argument("--json-out")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -k clip)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        # only the files that hold marked tests are collected: the others import what a device image may
        # lack (PyAV, decord, trl, ray ...), and one collection error stops the whole run
        files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                       if args.marker in p.read_text())
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", args.marker, "-p", "no:cacheprovider", "-rfE",
               f"--junitxml={xml}", *files, *args.pytest_args]
        env = dict(os.environ, CAPREWARD_TEST_DEVICE=args.device)
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        sys.stdout.write(proc.stdout[-6000:])
        sys.stderr.write(proc.stderr[-3000:])
        result = {"device": args.device, "marker": args.marker, "command": " ".join(cmd), "exit_code": proc.returncode,
                  "passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": []}
        if xml.exists():
            for case in ET.parse(xml).getroot().iter("testcase"):
                name = f"{case.get('classname')}::{case.get('name')}"
                bad = case.find("failure") if case.find("failure") is not None else case.find("error")
                skip = case.find("skipped")
                if bad is not None:
                    result["failed"] += 1
                    result["failures"].append({"test": name, "message": (bad.get("message") or "")[:500]})
                elif skip is not None:
                    result["skipped"] += 1
                    result["skips"].append({"test": name, "reason": (skip.get("message") or "")[:200]})
                else:
                    result["passed"] += 1
        result["output_tail"] = proc.stdout[-2000:]
    write_json(args.json_out, result)
    print(f"device_parity on {args.device}: {result['passed']} passed, {result['failed']} failed, {result['skipped']} skipped")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
