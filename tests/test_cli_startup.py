"""The command line answers ``--help`` and every argument error before it imports torch: the parser is
built from modules that import no model code (the metrics' names and options come from the registry, the
default models from :mod:`capreward.default_models`, the media limits from :mod:`capreward.media.limits`).

One fresh interpreter runs every case (no timing is measured: what is imported is)."""

from __future__ import annotations

import json
import subprocess
import sys

#: argv -> the exit status argparse gives it.
CASES = {
    "--help": 0,
    "--version": 0,
    "score --help": 0,
    "serve --help": 0,
    "explain --help": 0,
    "report --help": 0,
    "meta-eval --help": 0,
    "demo --help": 0,
    "score --bad-flag": 2,
    "score --metrics emscor manifest.jsonl --out x.jsonl": 2,
    "serve --reward nope": 2,
    "explain --metric nope manifest.jsonl --out x.jsonl": 2,
    "no-such-command": 2,
}

HEAVY = ["torch", "numpy", "transformers", "open_clip", "PIL", "av"]

CODE = """
import contextlib, io, json, sys
from capreward.cli.main import main
out = {}
for argv in %r:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv.split())
        except SystemExit as exc:
            code = exc.code
    out[argv] = [code, sorted(m for m in %r if m in sys.modules)]
print(json.dumps(out))
"""


def test_help_and_argument_errors_import_no_model_code():
    run = subprocess.run([sys.executable, "-c", CODE % (list(CASES), HEAVY)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert {argv: code for argv, (code, _) in got.items()} == CASES
    assert {argv: heavy for argv, (_, heavy) in got.items() if heavy} == {}


def test_the_check_sees_an_import():
    """The control: the same probe reports torch once a command's work has imported it."""
    code = CODE.replace("from capreward.cli.main import main", "from capreward.cli.main import main\nimport capreward.backbones")
    run = subprocess.run([sys.executable, "-c", code % (["--help"], HEAVY)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "torch" in json.loads(run.stdout.strip().splitlines()[-1])["--help"][1]
