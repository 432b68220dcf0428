"""benchmarks/gpu_all.sh, the one GPU command: its CPU dry run writes every step's figures and the summary;
the runner keeps each finished step in the results file, stops a step at its limit and skips what the
global deadline leaves no time for; and capreward's scorers, rewards and the benchmarks import on the
device image, which has no PyAV, decord, trl, datasets or imageio-ffmpeg."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import cli_process
from conftest import import_script

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BENCH = REPO / "benchmarks"

# what the device image lacks and no step but the GRPO one needs (benchmarks/README.md)
ABSENT_ON_DEVICE = ("av", "decord", "trl", "datasets", "imageio_ffmpeg")


def test_capreward_and_the_benchmarks_import_without_video_decoders_or_trl():
    code = f"""
import sys
for name in {ABSENT_ON_DEVICE!r}:
    sys.modules[name] = None  # import raises ImportError, as on the device image
sys.path.insert(0, {str(BENCH)!r})
import capreward
from capreward import CLIPScore, EMScore, FLEUR
from capreward.adapters.factory import RewardOptions, build_reward
from capreward.server.http import RewardService
from capreward.cli import serve
from capreward.testing import build_tiny_llava, save_tiny_clip_openai
import torchmetrics.multimodal
import gpu_common, gpu_env, gpu_precision, gpu_parity_tests, bench_emscore, bench_clipscore, bench_fleur, bench_server
import bench_grpo_step, bench_claims, bench_engine, gpu_judge_checks
loaded = sorted(n for n in {ABSENT_ON_DEVICE!r} if sys.modules.get(n) is not None)
assert not loaded, loaded
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_grpo_step_says_why_it_is_skipped_without_trl(tmp_path):
    code = f"""
import sys
sys.modules["trl"] = None
sys.path.insert(0, {str(BENCH)!r})
import bench_grpo_step
bench_grpo_step.main(["--device", "cpu", "--json-out", {str(tmp_path / "g.json")!r}])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads((tmp_path / "g.json").read_text())
    assert "trl" in figures["skipped"] and "rewards" not in figures


@pytest.fixture()
def runner(monkeypatch, tmp_path):
    """gpu_all.py with three stand-in steps: one that writes figures, one that sleeps past its limit, one
    that fails; OUT in a temp folder."""
    gpu_all = import_script(BENCH / "gpu_all.py", "gpu_all_under_test")
    py = sys.executable

    def writes(ctx, out):
        return [py, "-c", f"import json; json.dump({{'x': 1}}, open({out!r}, 'w'))"]

    def sleeps(ctx, out):
        return [py, "-c", "import time; print('started', flush=True); time.sleep(60)"]

    def fails(ctx, out):
        return [py, "-c", "raise SystemExit('broken on purpose')"]

    steps = [gpu_all.Step("writes", "w", 20, 20, writes, lambda f: f"x={f['x']}"),
             gpu_all.Step("sleeps", "s", 20, 2 + 15, sleeps),
             gpu_all.Step("fails", "f", 20, 20, fails)]
    monkeypatch.setattr(gpu_all, "STEPS", steps)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setenv("CAPREWARD_BENCH_DEVICE", "cpu")
    for name in ("CAPREWARD_BENCH_STEPS", "CAPREWARD_BENCH_BUDGET_S", "CAPREWARD_BENCH_LIMIT_SCALE"):
        monkeypatch.delenv(name, raising=False)
    return gpu_all, tmp_path / "out"


def read_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_runner_keeps_each_step_stops_a_step_at_its_limit_and_reports_failures(runner):
    gpu_all, out = runner
    gpu_all.STEPS[1].cpu_limit_s = 16  # the sleeping step is stopped after 16 s, long before its 60 s
    assert gpu_all.main() == 1
    rows = read_rows(out)
    assert [(r["step"], r["status"]) for r in rows] == [("writes", "ok"), ("sleeps", "timeout"), ("fails", "failed")]
    assert rows[0]["figures"] == {"x": 1}
    assert rows[1]["wall_s"] < 40 and "started" in rows[1]["error"] and "limit of 16 s" in rows[1]["error"]
    assert "broken on purpose" in rows[2]["error"]
    summary = (out / "summary.txt").read_text()
    assert "writes" in summary and "x=1" in summary and "timeout" in summary


def test_runner_skips_what_the_global_deadline_leaves_no_time_for(runner, monkeypatch):
    gpu_all, out = runner
    monkeypatch.setenv("CAPREWARD_BENCH_BUDGET_S", "20")
    gpu_all.main()
    rows = read_rows(out)
    # the first step ends at once; the second is cut at the deadline (about 20 s in all); the third is skipped
    assert rows[0]["status"] == "ok"
    assert rows[1]["status"] == "timeout" and rows[1]["limit_s"] <= 20
    assert rows[2]["status"] == "skipped" and "deadline" in rows[2]["error"]


def test_a_named_set_runs_its_steps_in_its_order_under_its_deadline(runner, monkeypatch):
    gpu_all, out = runner
    monkeypatch.setattr(gpu_all, "SETS", {"pair": ["fails", "writes"]})
    monkeypatch.setattr(gpu_all, "SET_BUDGETS", {"pair": 5})
    monkeypatch.setenv("CAPREWARD_BENCH_SET", "pair")
    assert gpu_all.main() == 1
    rows = read_rows(out)
    assert [(r["step"], r["status"]) for r in rows] == [("fails", "failed"), ("writes", "ok")]
    monkeypatch.setenv("CAPREWARD_BENCH_SET", "nope")
    assert gpu_all.main() == 2


def test_the_issue44_set_names_real_steps_and_fits_its_deadline():
    gpu_all = import_script(BENCH / "gpu_all.py", "gpu_all_sets")
    names = {s.name for s in gpu_all.STEPS}
    for name, steps in gpu_all.SETS.items():
        assert set(steps) <= names, name
    assert gpu_all.SET_BUDGETS["issue44"] <= 570  # one device call of at most 10 minutes, with the start


@pytest.mark.slow
def test_cpu_dry_run_of_the_gpu_command_writes_every_steps_figures_and_the_summary(tmp_path):
    """The one command, CAPREWARD_BENCH_DEVICE=cpu: every step at small sizes (the parity step narrowed to one
    test), each a child of the test zygote (``CAPREWARD_BENCH_LAUNCH``). Minutes on a busy 2-core machine."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), CAPREWARD_BENCH_DEVICE="cpu", PYTHON=sys.executable,
               CAPREWARD_BENCH_PYTEST_ARGS="-k test_clip_s_matches_open_clip_encoders", CAPREWARD_BENCH_BUDGET_S="3600",
               CAPREWARD_BENCH_LIMIT_SCALE="4")  # a shared 2-core machine: the steps' limits are sized for a GPU host
    env.pop("CAPREWARD_BENCH_STEPS", None)
    socket_path = cli_process.zygote_socket()
    if socket_path is not None:  # each step a child of the test zygote: the heavy imports paid once
        env.update(CAPREWARD_TEST_ZYGOTE=socket_path, CAPREWARD_BENCH_LAUNCH=shlex.join([sys.executable, str(HERE / "zygote_exec.py")]))
    proc = subprocess.run(["bash", str(BENCH / "gpu_all.sh")], capture_output=True, text=True, env=env, cwd=REPO)
    out = tmp_path / "out"
    rows = read_rows(out)
    gpu_all = import_script(BENCH / "gpu_all.py", "gpu_all_dry_run")
    assert [r["step"] for r in rows] == [s.name for s in gpu_all.STEPS]
    bad = {r["step"]: r.get("error", "")[-1500:] for r in rows if r["status"] != "ok"}
    assert not bad, bad
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = {r["step"]: r["figures"] for r in rows}
    assert figures["parity_tests"]["passed"] >= 1 and figures["parity_tests"]["failed"] == 0
    assert figures["precision"]["fp32_within_1e-5"] is True
    for step in ("emscore_b32", "emscore_l14", "emscore_b32_gpu", "emscore_l14_gpu"):
        assert figures[step]["config"]["precision"] == "bf16"  # fp16 mapped to bf16 on the CPU
        assert figures[step]["ratios"]["one call, warm"] > 0
    assert figures["fleur_7b"]["identical"] == figures["fleur_7b"]["captions"]
    assert {r["clients"] for r in figures["server"]["runs"]} == {2, 4}
    assert set(figures["grpo"]["rewards"]) == {"emscore", "clip_s", "hallucination", "fleur"}
    assert all("step_s" in r for r in figures["grpo"]["rewards"].values())
    assert figures["judge_checks"]["eager"]["tokens_identical"] == figures["judge_checks"]["eager"]["rows"]
    assert figures["claims_7b"]["max_abs_p_yes_difference"] == 0.0
    for step in ("emscore_l14_device", "emscore_b32_gpu_device", "emscore_l14_gpu_device"):
        assert figures[step]["device_preprocessing"]["max_pixel_levels"] <= 1.0 + 1e-4
    assert "importable" in figures["engines"]["engines"]
    summary = (out / "summary.txt").read_text()
    assert all(s.name in summary for s in gpu_all.STEPS)


def test_the_cpu_dry_run_runs_a_command_once_and_a_gpu_run_runs_every_step(runner, monkeypatch):
    gpu_all, out = runner
    py = sys.executable
    counter = out.parent / "runs.txt"

    def writes(ctx, path):
        return [py, "-c", f"import json; open({str(counter)!r}, 'a').write('x'); json.dump({{'x': 1}}, open({path!r}, 'w'))"]

    monkeypatch.setattr(gpu_all, "STEPS", [gpu_all.Step("a", "w", 20, 20, writes), gpu_all.Step("b", "w", 20, 20, writes)])
    assert gpu_all.main() == 0
    rows = read_rows(out)
    assert [(r["step"], r["status"], r["figures"]) for r in rows] == [("a", "ok", {"x": 1}), ("b", "ok", {"x": 1})]
    assert rows[1]["same_command_as"] == "a" and "same_command_as" not in rows[0] and counter.read_text() == "x"
    ctx = gpu_all.Context(device="cuda", gpu=True, work=out)
    b32, l14 = (gpu_all.command_key(s, ctx) for s in gpu_all.STEPS[:2])
    assert b32 == l14  # the stand-in steps' commands do not depend on the arch; the real ones do:
    real = {s.name: s for s in import_script(BENCH / "gpu_all.py", "gpu_all_keys").STEPS}
    assert gpu_all.command_key(real["emscore_b32"], ctx) != gpu_all.command_key(real["emscore_l14"], ctx)
