"""What `pip install` would install on other platforms: a dry run of pip's own resolver for macOS arm64,
Linux aarch64 and Windows x86-64 (or any target below), from this machine.

    python scripts/platform_dry_run.py dist/capreward-0.1.0-py3-none-any.whl [--target macos-arm64 ...]
        [--report-dir DIR] [--host-markers]

Each target runs ``pip install --dry-run --ignore-installed --only-binary=:all: --platform ...
--python-version 3.11 --target <tmp> --report <DIR>/<target>.json <requirement>`` and prints the
command, then pip's "Would install" line (or the end of its error). ``--platform`` only selects wheel
tags: pip evaluates environment markers (``sys_platform``, ``platform_machine``...) on the machine it
runs on (pypa/pip#10050, #6117), so a dependency marked for Linux x86-64 only would be required on
every target. Unless ``--host-markers`` is given, pip therefore runs with its marker environment set to
the target's (the one change to pip's behaviour; wheel selection, resolution and the report are pip's).
Exit status: the number of targets that failed to resolve. Needs the package index; pip downloads a
wheel whose metadata the index does not serve separately.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

#: target -> (pip --platform tags, PEP 508 marker values on that platform)
MACOS = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64", "os_name": "posix"}
LINUX_ARM = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64", "os_name": "posix"}
WINDOWS = {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64", "os_name": "nt"}
TARGETS: dict[str, tuple[list[str], dict[str, str]]] = {
    # macOS 11 (pip also accepts wheels for older macOS versions)
    "macos-arm64": (["macosx_11_0_arm64"], MACOS),
    # macOS 14 (current torch ships macOS wheels for 14.0 and later only)
    "macos14-arm64": (["macosx_14_0_arm64"], MACOS),
    # glibc 2.17 to 2.28 (manylinux_2_28: the oldest glibc current torch and hf-xet ship aarch64 wheels
    # for; a glibc 2.17-only machine, such as CentOS 7, cannot install transformers' huggingface_hub there)
    "linux-aarch64": (["manylinux2014_aarch64"] + [f"manylinux_2_{v}_aarch64" for v in range(17, 29)], LINUX_ARM),
    # glibc 2.17 to 2.39 (a current distribution, e.g. Ubuntu 24.04)
    "linux-aarch64-glibc2.39": (["manylinux2014_aarch64"] + [f"manylinux_2_{v}_aarch64" for v in range(17, 40)], LINUX_ARM),
    # Windows 10/11 x86-64 (decord's marker names it: its win_amd64 wheel is installed there)
    "windows-amd64": (["win_amd64"], WINDOWS),
}

#: Run pip in a child process with the marker environment replaced (argv: markers JSON, pip arguments).
PIP_WITH_MARKERS = r"""
import json, sys
from pip._vendor.packaging import markers
values = json.loads(sys.argv[1])
host = markers.default_environment
markers.default_environment = lambda: {**host(), **values}
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def pip_command(requirement: str, target: str, report: Path, workdir: Path, host_markers: bool, python_version: str) -> list[str]:
    platforms, marker_values = TARGETS[target]
    args = ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:"]
    for tag in platforms:
        args += ["--platform", tag]
    args += ["--python-version", python_version, "--target", str(workdir / target), "--report", str(report), requirement]
    if host_markers:
        return [sys.executable, "-m", "pip", *args]
    values = {**marker_values, "python_version": python_version, "python_full_version": f"{python_version}.0"}
    return [sys.executable, "-c", PIP_WITH_MARKERS, json.dumps(values), *args]


def shown(command: list[str]) -> str:
    """The command as printed: pip's arguments after ``pip`` (the marker wrapper abbreviated)."""
    if command[1] == "-c":
        return "pip (markers: " + ", ".join(f"{k}={v}" for k, v in json.loads(command[3]).items()) + ") " + " ".join(command[4:])
    return "pip " + " ".join(command[3:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirement", help="a wheel file, or a requirement such as 'capreward[demo]'")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="default: every target")
    parser.add_argument("--report-dir", type=Path, default=None, help="keep pip's JSON reports here")
    parser.add_argument("--python-version", default="3.11")
    parser.add_argument("--host-markers", action="store_true", help="evaluate markers on this machine, as plain pip does")
    args = parser.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        reports = args.report_dir or Path(tmp)
        reports.mkdir(parents=True, exist_ok=True)
        for target in args.target or list(TARGETS):
            report = reports / f"{target}.json"
            command = pip_command(args.requirement, target, report, Path(tmp), args.host_markers, args.python_version)
            print(f"== {target}\n$ {shown(command)}", flush=True)
            proc = subprocess.run(command, capture_output=True, text=True)
            lines = [line for line in (proc.stdout + proc.stderr).splitlines()
                     if "is ignored: it is neither" not in line and line.strip()]
            if proc.returncode == 0:
                print(next((line for line in lines if line.startswith("Would install")), "(no 'Would install' line)"))
                installs = json.loads(report.read_text())["install"]
                print("wheels: " + " ".join(sorted(i["download_info"]["url"].rsplit("/", 1)[-1] for i in installs)))
            else:
                failed += 1
                print(f"FAILED (pip exited {proc.returncode}):")
                print("\n".join(line for line in lines if line.startswith(("ERROR", "  ", "    ")))[-3000:])
            print(flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
