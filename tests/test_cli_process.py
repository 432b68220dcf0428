"""tests/cli_process.py, the CLI tests' child processes forked from a zygote, against plain subprocesses:
the same output, exit code, directory, environment, arguments and thread count; death by a signal; a
timeout that kills the child; and a plain subprocess whenever the environment differs in what a library
reads at import time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import cli_process

PROBE = '''
import json, os, sys
import torch
print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "flag": os.environ.get("CAPREWARD_PROBE"),
                  "threads": torch.get_num_threads(), "path0": sys.path[0], "name": __name__,
                  "stdin": sys.stdin.read()}))
print("to stderr", file=sys.stderr)
if os.environ.get("CAPREWARD_PROBE") == "kill":
    os.kill(os.getpid(), 9)
if os.environ.get("CAPREWARD_PROBE") == "sleep":
    import time; time.sleep(120)
raise SystemExit(int(sys.argv[1]))
'''


@pytest.fixture()
def probe(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    return tmp_path


def plain(args, env, cwd, input=""):
    return subprocess.run([sys.executable, "-m", "probe_module", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, input=input, timeout=300)


@pytest.mark.parametrize("threads", ["1", None])
def test_a_forked_child_behaves_as_a_fresh_interpreter(probe, threads):
    env = dict(os.environ, CAPREWARD_PROBE="on")
    env.pop("OMP_NUM_THREADS", None)
    if threads:
        env["OMP_NUM_THREADS"] = threads
    forked = cli_process.run(["3", "x y"], env=env, cwd=probe, module="probe_module", input="in", timeout=300)
    fresh = plain(["3", "x y"], env, probe, input="in")
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 3 and json.loads(forked.stdout)["argv"] == ["3", "x y"]
    assert json.loads(forked.stdout)["name"] == "__main__" and json.loads(forked.stdout)["stdin"] == "in"


def test_a_child_killed_by_a_signal_reports_it_as_subprocess_does(probe):
    env = dict(os.environ, CAPREWARD_PROBE="kill")
    forked = cli_process.run(["0"], env=env, cwd=probe, module="probe_module", timeout=300)
    assert forked.returncode == -9 == plain(["0"], env, probe).returncode


def test_a_timeout_kills_the_child(probe):
    env = dict(os.environ, CAPREWARD_PROBE="sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        cli_process.run(["0"], env=env, cwd=probe, module="probe_module", timeout=20)


def test_an_environment_a_library_reads_at_import_gets_a_plain_process_then_its_own_zygote(probe):
    base = cli_process.import_time_env(dict(os.environ))
    assert cli_process.import_time_env(dict(os.environ, CAPREWARD_X="1", OMP_NUM_THREADS="7")) == base
    env = dict(os.environ, PYTHONIOENCODING="latin-1", CAPREWARD_PROBE="on")
    assert cli_process.import_time_env(env) != base
    fresh = plain(["0"], env, probe).stdout
    runs = []
    for _ in range(3):  # the first call is plain, the later ones come from a zygote started in that environment
        forked = cli_process.run(["0"], env=env, cwd=probe, module="probe_module", timeout=300)
        runs.append(cli_process.last_run)
        assert (forked.returncode, forked.stdout) == (0, fresh)
    assert runs == ["plain", "zygote", "zygote"]
    cli_process.run(["0"], env=dict(os.environ, CAPREWARD_PROBE="on"), cwd=probe, module="probe_module", timeout=300)
    assert cli_process.last_run == "zygote"  # the session's own environment keeps its zygote


def test_the_cli_itself(tmp_path):
    forked = cli_process.run(["--version"], cwd=tmp_path, timeout=300)
    fresh = subprocess.run([sys.executable, "-m", "capreward.cli.main", "--version"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr) and forked.stdout
