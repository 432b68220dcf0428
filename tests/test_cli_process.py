"""tests/cli_process.py, the CLI tests' child processes forked from a zygote, against plain subprocesses:
the same output, exit code, directory, environment, arguments and thread count; death by a signal; a
timeout that kills the child; and a plain subprocess whenever the environment differs in what a library
reads at import time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_a_script_runs_as_python_script_would_and_both_kinds_report_the_peak_rss(probe, monkeypatch):
    """``run(script=...)`` is ``python SCRIPT ARGS`` (the script's folder first on the path, ``__main__``);
    plain and forked children both report their peak RSS. A forked child's counts what it allocates above
    the zygote's pages; a plain child's (Linux ``wait4``) also counts the test process's pages it held
    between fork and exec, so in a large test process it shows nothing of the child: memory tests compare
    forked children."""
    script = probe / "probe_module.py"
    env = dict(os.environ, CAPREWARD_PROBE="on")
    forked = cli_process.run(["3", "x y"], env=env, cwd=probe.parent, script=script, input="in", timeout=300)
    fresh = subprocess.run([sys.executable, str(script), "3", "x y"], capture_output=True, text=True, env=env,
                           cwd=probe.parent, input="in", timeout=300)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert json.loads(forked.stdout)["path0"] == str(probe) and json.loads(forked.stdout)["cwd"] == str(probe.parent)
    grow = probe / "grow.py"
    grow.write_text("import sys\nblock = bytearray(int(sys.argv[1]) << 20)\nblock[::4096] = b'x' * len(block[::4096])\n")
    peaks = {}
    for plain_only in ("1", "0"):
        monkeypatch.setenv("CAPREWARD_TEST_PLAIN_CLI", plain_only)
        for mb in (0, 300):
            done = cli_process.run([mb], cwd=probe, script=grow, timeout=300)
            assert done.returncode == 0, done.stderr
            peaks[cli_process.last_run, mb] = done.peak_rss
    assert peaks["zygote", 300] - peaks["zygote", 0] > 200 * 2**20, peaks  # 300 MiB touched, less what the start freed
    assert peaks["plain", 300] >= peaks["plain", 0] > 0, peaks


def test_a_started_child_streams_stderr_and_ends_by_a_signal_as_popen_does(probe):
    """``start`` (a server's child): its stderr readable while it runs, ``poll`` None until it ends,
    ``terminate`` ends it with -SIGTERM, and its peak RSS is known once it ended."""
    (probe / "waits.py").write_text("import sys, time\nprint('ready', file=sys.stderr, flush=True)\ntime.sleep(120)\n")
    cwd = os.getcwd()
    os.chdir(probe)
    try:
        child = cli_process.start([], module="waits")
    finally:
        os.chdir(cwd)
    assert cli_process.last_run == "zygote" and isinstance(child, cli_process.Child)
    lines = iter(child.stderr)
    assert any(line.strip() == "ready" for line in lines)
    assert child.poll() is None
    child.terminate()
    assert child.wait(timeout=60) == -signal.SIGTERM and child.peak_rss > 0


def test_the_launcher_runs_a_script_in_the_zygote_and_its_death_takes_the_child_along(probe, tmp_path):
    """tests/zygote_exec.py (the GPU command's dry-run launcher): the child's exit code is the launcher's;
    when the launcher is killed (a step's time limit), the child and what it started die too."""
    launcher = [sys.executable, str(Path(__file__).with_name("zygote_exec.py")), sys.executable]
    env = dict(os.environ, CAPREWARD_TEST_ZYGOTE=cli_process.zygote_socket(), CAPREWARD_PROBE="on")
    done = subprocess.run([*launcher, str(probe / "probe_module.py"), "5"], capture_output=True, text=True, env=env,
                          cwd=probe, timeout=300)
    assert done.returncode == 5 and json.loads(done.stdout)["argv"] == ["5"] and "to stderr" in done.stderr
    pids = tmp_path / "pids.txt"
    (probe / "family.py").write_text(
        "import os, subprocess, sys, time\n"
        "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{grandchild.pid}}')\n"
        "time.sleep(300)\n")
    proc = subprocess.Popen([*launcher, str(probe / "family.py")], env=env, cwd=probe, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    family = [int(p) for p in pids.read_text().split()]
    os.killpg(proc.pid, signal.SIGKILL)  # what gpu_all does at a step's limit
    proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in family), family


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
