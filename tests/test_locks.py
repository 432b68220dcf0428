"""The cross-process locks (capreward.locks on filelock): the results-file lock of the jobs and the lock of
the trained-fixture cache name their holder (PID, host, since when, what it does), a waiter gives up
after its timeout with that message instead of hanging, and both work where ``fcntl`` does not exist
(Windows): a subprocess with ``sys.modules["fcntl"] = None`` runs a scoring job and trains a fixture into
a cache. Cost: two short subprocesses holding a lock (about 1 s each) and one that scores two images on
the tiny CLIP and trains a one-step judge (about 15 s on an idle 2-core machine)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from capreward.jobs.output_lock import OutputLocked, exclusive_output, lock_path
from capreward.locks import LockBusy, holder_path, holding, read_holder, try_holding
from capreward.testing.cache import LOCK_TIMEOUT_ENV, lock_timeout, locked

from conftest import REPO


def holder_process(lock: Path, what: str) -> subprocess.Popen:
    """Another process holding ``lock`` (saying ``what``) until its standard input closes."""
    code = ("import sys\nfrom capreward.locks import holding\n"
            f"with holding({str(lock)!r}, what={what!r}):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0


def test_a_busy_lock_names_its_holder_and_the_holder_file_goes_with_it(tmp_path):
    lock = tmp_path / "x.lock"
    proc = holder_process(lock, "training the tiny FLEUR judge")
    try:
        record = read_holder(lock)
        assert record["pid"] == proc.pid and record["host"] == socket.gethostname()
        with pytest.raises(LockBusy) as busy:
            with holding(lock, timeout=0):
                pass
        text = str(busy.value)
        assert f"PID {proc.pid}" in text and socket.gethostname() in text and "training the tiny FLEUR judge" in text
        assert " since " in text
        with try_holding(lock) as free:
            assert not free
    finally:
        release(proc)
    assert not holder_path(lock).exists()  # removed by its holder before it let go
    with try_holding(lock) as free:
        assert free and read_holder(lock)["pid"] == os.getpid()


def test_a_waiter_says_whom_it_waits_for(tmp_path):
    """With no timeout the cache waits for as long as it takes, but says whom for (here the first
    message stops the wait)."""
    lock = tmp_path / "fixture.lock"
    proc = holder_process(lock, "training the tiny QA judge")
    said = []

    class Stop(Exception):
        pass

    def stop(text):
        said.append(text)
        raise Stop

    try:
        with pytest.raises(Stop):
            with holding(lock, timeout=-1, report_every=0, on_wait=stop):
                pass
    finally:
        release(proc)
    assert len(said) == 1 and f"PID {proc.pid}" in said[0] and "training the tiny QA judge" in said[0]


def test_the_cache_waits_at_most_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "0")
    assert lock_timeout() == 0
    lock = tmp_path / ".fleur-0123456789abcdef.lock"
    proc = holder_process(lock, "training the tiny fleur judge")
    try:
        with pytest.raises(LockBusy, match=f"PID {proc.pid}"):
            with locked(lock):
                pass
    finally:
        release(proc)
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=LOCK_TIMEOUT_ENV):
        lock_timeout()


def test_a_dead_holder_is_named_as_gone(tmp_path):
    """A holder file left by a killed run (its lock released by the system) says that process is gone."""
    lock = tmp_path / "out.jsonl.lock"
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(proc.stdout)
    holder_path(lock).write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "since": 0, "what": "x"}))
    from capreward.locks import describe_holder

    assert "no longer running" in describe_holder(read_holder(lock))
    with exclusive_output(tmp_path / "out.jsonl"):  # the stale file never blocks
        assert read_holder(lock)["pid"] == os.getpid()


def test_a_second_writer_in_the_same_process_is_refused(tmp_path):
    out = tmp_path / "scores.jsonl"
    with exclusive_output(out):
        with pytest.raises(OutputLocked, match=f"PID {os.getpid()}.*writing scores.jsonl"):
            with exclusive_output(out):
                pass
    assert not holder_path(lock_path(out)).exists()


WITHOUT_FCNTL = textwrap.dedent("""
    import json, sys
    sys.modules["fcntl"] = None          # as on Windows: `import fcntl` raises ImportError
    from pathlib import Path
    from dataclasses import replace
    root, clip = Path(sys.argv[1]), sys.argv[2]
    import filelock
    assert not filelock.has_fcntl
    from capreward.jobs.output_lock import OutputLocked, exclusive_output
    out = root / "scores.jsonl"
    with exclusive_output(out):
        try:
            with exclusive_output(out):
                raise SystemExit("a second writer was let in")
        except OutputLocked as exc:
            print("refused:", exc)
    from capreward.cli.main import main
    from PIL import Image
    Image.new("RGB", (32, 32), (200, 30, 30)).save(root / "red.png")
    rows = [{"id": f"r{i}", "caption": f"a red image {i}", "image": str(root / "red.png")} for i in range(2)]
    (root / "m.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    code = main(["score", str(root / "m.jsonl"), "--out", str(out), "--metrics", "clip-s", "--clip-model", clip,
                 "--no-progress"])
    assert code == 0, code
    print("scored", len(out.read_text().splitlines()))
    from capreward.testing.tiny_llava import FLEUR_RECIPE, tiny_judge_dir, with_spec
    quick = replace(with_spec(FLEUR_RECIPE, text_layers=1, vision_layers=1), name="quick", steps=1, batch_size=1)
    judge = tiny_judge_dir(quick, cache_dir=root / "cache")
    print("trained", (judge / "config.json").is_file())
    assert "fcntl" not in {m for m in sys.modules if sys.modules[m] is not None}
""")


def test_the_lock_paths_run_without_fcntl(tmp_path, tiny_clip_path):
    """Windows has no ``fcntl``: a scoring job (its results-file lock) and a fixture trained into a cache
    (its cache lock) run in a process where importing ``fcntl`` fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-W", "ignore::UserWarning", "-c", WITHOUT_FCNTL, str(tmp_path),
                           str(tiny_clip_path)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("refused:") and "PID " in line for line in lines), lines
    assert "scored 2" in lines and "trained True" in lines
