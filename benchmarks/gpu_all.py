"""Every GPU figure in one run: each step under its own time limit inside a global deadline, each step's
figures appended to one JSON-lines file as soon as the step ends, and a summary table at the end.

Run it through ``benchmarks/gpu_all.sh`` (which installs the carried wheels first); see benchmarks/README.md
("One command for a GPU"). Environment:

- ``OUT``: folder of the results (``results.jsonl``, ``summary.txt``, ``steps.log``); default ``./gpu_out``.
- ``CAPREWARD_BENCH_DEVICE``: ``cuda`` (default when a GPU is visible) or ``cpu``: the same steps at small
  sizes on the CPU, fp16 mapped to bf16 (the dry run tests/test_gpu_all.py runs).
- ``CAPREWARD_BENCH_BUDGET_S``: the global deadline in seconds (default 420 on a GPU, 900 on the CPU); a step
  that would start with less than 15 s left is skipped, a running step is stopped at the deadline.
- ``CAPREWARD_BENCH_STEPS``: comma-separated step names to run (default: all, in order).
- ``CAPREWARD_BENCH_SET``: a named set of steps (:data:`SETS`; ``issue44``: every measurement of issue #44's
  item 5 in under 10 minutes on an H200), used when ``CAPREWARD_BENCH_STEPS`` is not given; its default
  deadline is :data:`SET_BUDGETS`' own.
- ``CAPREWARD_BENCH_LIMIT_SCALE``: a factor on every step's own limit (default 1; a busy CPU needs more).
- ``CAPREWARD_BENCH_PYTEST_ARGS``: extra arguments of the parity-test step (e.g. ``-k clip`` to narrow it).
- ``CAPREWARD_BENCH_LAUNCH``: a command put before every step's ``python script ...`` (the CPU dry run of
  tests/test_gpu_all.py: ``python tests/zygote_exec.py``, which runs each step as a child of the test
  zygote instead of a fresh interpreter); each step is still its own process under its own limit.

Each line of ``results.jsonl`` is ``{"step", "status" (ok / failed / timeout / skipped), "wall_s",
"limit_s", "command", "figures" (the step's own JSON), "error" (the tail of its output when not ok)}``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass
class Step:
    name: str
    what: str
    gpu_limit_s: float  # on a GPU; the CPU dry run gets cpu_limit_s
    cpu_limit_s: float
    command: Callable[["Context", str], list[str]]  # (context, json path) -> argv
    headline: Callable[[dict], str] = lambda f: ""
    env: dict = field(default_factory=dict)


@dataclass
class Context:
    device: str
    gpu: bool
    work: Path  # scratch folder (models saved for the CPU run, per-step JSON)
    python: str = sys.executable

    def precision(self, p: str) -> str:
        return p if self.gpu or p != "fp16" else "bf16"

    @property
    def threads(self) -> str:
        return str(min(8, os.cpu_count() or 2)) if self.gpu else "2"

    def tiny_clip(self) -> str:
        """The tiny CLIP saved once as an OpenAI-format file: the CPU dry run's stand-in for every shape."""
        path = self.work / "tiny_clip.pt"
        if not path.exists():
            launch = shlex.split(os.environ.get("CAPREWARD_BENCH_LAUNCH", ""))
            if launch:  # through the steps' launcher (the test zygote): no torch import in this process
                subprocess.run([*launch, self.python, str(HERE / "tiny_clip_file.py"), str(path)], cwd=REPO, check=True)
            else:
                from capreward.testing import save_tiny_clip_openai

                save_tiny_clip_openai(path, seed=0)
        return str(path)

    def clip(self, arch: str) -> str:
        return f"{arch}/random" if self.gpu else self.tiny_clip()


def py(ctx: Context, script: str, *args: str) -> list[str]:
    return [ctx.python, str(HERE / script), *args]


# ------------------------------------------------------------------------------------------ steps
def env_cmd(ctx, out):
    return py(ctx, "gpu_env.py", "--device", ctx.device, "--seconds", "1.0" if ctx.gpu else "0.2", "--json-out", out)


def env_head(f):
    p = f.get("matmul_peak_tflop_per_s", {})
    gpu = f.get("gpu", {}).get("name", f.get("device", "?"))
    return f"{gpu}; TFLOP/s " + " ".join(f"{k} {v:.1f}" for k, v in p.items()) + \
        f"; copy {f.get('copy_gb_per_s', {}).get('device_copy', 0):.0f} GB/s"


def parity_cmd(ctx, out):
    extra = shlex.split(os.environ.get("CAPREWARD_BENCH_PYTEST_ARGS", ""))
    return py(ctx, "gpu_parity_tests.py", "--device", ctx.device, "--json-out", out, "--", *extra)


def parity_head(f):
    return f"{f.get('passed', 0)} passed, {f.get('failed', 0)} failed, {f.get('skipped', 0)} skipped on {f.get('device')}"


def deviation_cmd(ctx, out):
    size = [] if ctx.gpu else ["--small"]
    return py(ctx, "gpu_precision.py", "--device", ctx.device, *size, "--json-out", out,
              *([] if ctx.gpu else ["--model", ctx.tiny_clip()]))


def deviation_head(f):
    rows = f.get("deviation", {})
    parts = []
    for prec in ("fp32", "fp16", "bf16"):
        if prec in rows:
            worst = max(v["max"] for v in rows[prec].values())
            parts.append(f"{prec} max {worst:.1e}")
    return "; ".join(parts)


def emscore_cmd(arch: str, gpu_sized: bool):
    def cmd(ctx, out):
        if ctx.gpu:
            size = (["--videos", "16", "--captions", "32", "--frames", "32", "--repeats", "1", "--no-fp64"] if gpu_sized
                    else ["--repeats", "1"])
        else:  # the CPU dry run's GPU-sized steps run today's small sizes: one command serves both
            size = ["--videos", "2", "--captions", "2", "--frames", "3", "--references", "1", "--height", "32",
                    "--width", "40", "--repeats", "1"]
        return py(ctx, "bench_emscore.py", "--model", ctx.clip(arch), "--device", ctx.device, "--precision",
                  ctx.precision("fp16"), "--threads", ctx.threads, "--compare-fp32", *size, "--json-out", out)
    return cmd


def emscore_device_cmd(arch: str, gpu_sized: bool):
    """bench_emscore with the device-side image path (no fp32 comparison: the fp16/fp32 figures are the
    other EMScore steps'); the deviation from the PIL path is measured in the step."""
    def cmd(ctx, out):
        argv = emscore_cmd(arch, gpu_sized)(ctx, out)
        argv = [a for a in argv if a not in ("--compare-fp32", "--no-fp64")]
        return argv[:-2] + ["--preprocessing", "device", "--no-fp64", *argv[-2:]]
    return cmd


def emscore_head(f):
    r = f.get("ratios", {})
    eff = f.get("efficiency", {}).get("capreward one call, cold", {})
    head = (f"warm {r.get('one call, warm', 0):.1f}x cold {r.get('one call, cold', 0):.1f}x per-group warm "
            f"{r.get('per group, warm', 0):.1f}x cold {r.get('per group, cold', 0):.1f}x; cold encoders "
            f"{100 * (eff.get('encoder_peak_fraction') or 0):.0f}% of peak")
    dev = f.get("device_preprocessing")
    if dev:
        head += f"; device path within {max(dev['max_component_difference'].values()):.1e} of PIL"
    return head


def clipscore_cmd(arch: str):
    def cmd(ctx, out):
        size = ["--repeats", "2"] if ctx.gpu else ["--images", "2", "--captions", "2", "--height", "32", "--width", "40",
                                                   "--repeats", "1"]
        return py(ctx, "bench_clipscore.py", "--model", ctx.clip(arch), "--device", ctx.device, "--precision",
                  ctx.precision("fp16"), "--threads", ctx.threads, *size, "--json-out", out)
    return cmd


def clipscore_head(f):
    return (f"cold {f.get('speedup_cold', 0):.1f}x warm {f.get('speedup_warm', 0):.1f}x vs torchmetrics; "
            f"100cos diff {f.get('per_pair_100cos_difference', 0):.1e}")


def fleur_cmd(ctx, out):
    if ctx.gpu:
        size = ["--arch", "llava-7b", "--dtype", "float16", "--images", "4", "--captions", "8"]
    else:
        size = ["--arch", "tiny", "--dtype", "bfloat16", "--images", "1", "--captions", "2", "--max-new-tokens", "3"]
    return py(ctx, "bench_fleur.py", "--device", ctx.device, *size, "--json-out", out)


def fleur_head(f):
    cache = f.get("cache") or {}
    return (f"batched {f.get('batched_captions_per_s', 0):.2f} capt/s vs generate {f.get('generate_captions_per_s', 0):.2f}: "
            f"{f.get('speedup', 0):.1f}x; identical {f.get('identical')}/{f.get('captions')}; whole call "
            f"{100 * (f.get('prefill_peak_fraction') or 0):.1f}% of peak; graphs {f.get('decode_graphs')}; cache "
            f"{(cache.get('batched_bytes') or 0) / 2**30:.2f} GiB (copying design {(cache.get('copying_design_bytes') or 0) / 2**30:.2f})")


def judge_checks_cmd(ctx, out):
    return py(ctx, "gpu_judge_checks.py", "--device", ctx.device, "--json-out", out)


def judge_checks_head(f):
    parts = []
    for name in ("eager", "graphs"):
        r = f.get(name)
        if isinstance(r, dict) and "error" in r:
            parts.append(f"{name} FAILED")
        elif isinstance(r, dict):
            parts.append(f"{name} {r['tokens_identical']}/{r['rows']} identical, diff {r['max_logit_difference']:.1e}, "
                         f"graph steps {r['graph_steps']}, syncs in steps {len(r['sync_in_step_errors'])}")
        else:
            parts.append(f"{name}: {r}")
    return "; ".join(parts)


def claims_cmd(ctx, out):
    if ctx.gpu:
        size = ["--arch", "llava-7b", "--dtype", "float16", "--captions", "16", "--batch-size", "64", "--repeats", "2"]
    else:
        size = ["--arch", "tiny", "--captions", "2", "--batch-size", "16", "--repeats", "1"]
    return py(ctx, "bench_claims.py", "--device", ctx.device, "--threads", ctx.threads, *size, "--json-out", out)


def claims_head(f):
    return (f"{f.get('claims')} claims: batched {f.get('batched_s', 0):.3f} s vs one request per claim "
            f"{f.get('per_claim_s', 0):.3f} s: {f.get('speedup', 0):.1f}x (median of rounds {f.get('speedup_median_of_rounds', 0):.1f}x); "
            f"P(yes) diff {f.get('max_abs_p_yes_difference', 0):.1e}")


def engines_cmd(ctx, out):
    return py(ctx, "bench_engine.py", "--device", ctx.device, "--json-out", out)


def engines_head(f):
    e = f.get("engines", {})
    have = [k for k, v in e.get("importable", {}).items() if v]
    if f.get("skipped"):
        return f"engines: {', '.join(have) or 'none'} ({f['skipped']}); pip: {'; '.join(e.get('pip_list', [])) or 'none'}"
    return "; ".join(f"{k}: {f[k]}" for k in have if k in f)


def server_cmd(ctx, out):
    if ctx.gpu:
        size = ["--clip-model", "ViT-B-32/random", "--clients", "8", "16", "32", "--requests", "12", "--repeats", "1"]
    else:
        size = ["--clients", "2", "4", "--requests", "2", "--repeats", "1", "--images", "2"]
    return py(ctx, "bench_server.py", "--device", ctx.device, "--precision", ctx.precision("fp16"), *size,
              "--json-out", out)


def server_head(f):
    runs = [r for r in f.get("runs", []) if r.get("mode") == "on"]
    return "on/off " + ", ".join(f"{r['clients']} clients {r.get('speedup', 0):.2f}x" for r in runs)


def grpo_cmd(ctx, out):
    size = ["--steps", "3"] if ctx.gpu else ["--steps", "1", "--batch-size", "4", "--num-generations", "2",
                                             "--max-completion-length", "4"]
    return py(ctx, "bench_grpo_step.py", "--device", ctx.device, *size, "--json-out", out)


def grpo_head(f):
    if f.get("skipped"):
        return f"skipped: {f['skipped']}"
    return "; ".join(f"{name} {100 * r.get('reward_share', 0):.0f}% of {r.get('step_s', 0):.2f} s/step"
                     for name, r in f.get("rewards", {}).items())


STEPS = [
    Step("env", "GPU, versions, TF32, matmul peaks, copy rates", 40, 60, env_cmd, env_head),
    Step("parity_tests", "pytest -m device_parity on the device (fp32 to 1e-5)", 100, 240, parity_cmd, parity_head),
    Step("precision", "fp32/fp16/bf16 against fp64 per component", 45, 90, deviation_cmd, deviation_head),
    Step("emscore_b32", "EMScore ViT-B/32 vs released path, today's sizes", 60, 120, emscore_cmd("ViT-B-32", False), emscore_head),
    Step("emscore_l14", "EMScore ViT-L/14 vs released path, today's sizes", 75, 120, emscore_cmd("ViT-L-14", False), emscore_head),
    Step("emscore_b32_gpu", "EMScore ViT-B/32, GPU-sized (16 videos x 32 captions x 32 frames)", 110, 120, emscore_cmd("ViT-B-32", True), emscore_head),
    Step("emscore_l14_gpu", "EMScore ViT-L/14, GPU-sized", 120, 120, emscore_cmd("ViT-L-14", True), emscore_head),
    Step("clipscore_b32", "CLIP-S ViT-B/32 vs torchmetrics on the device", 40, 90, clipscore_cmd("ViT-B-32"), clipscore_head),
    Step("clipscore_l14", "CLIP-S ViT-L/14 vs torchmetrics on the device", 45, 90, clipscore_cmd("ViT-L-14"), clipscore_head),
    Step("fleur_7b", "FLEUR at LLaVA-1.5-7B shape: batched vs per-sample generate", 110, 180, fleur_cmd, fleur_head),
    Step("server", "reward server 8/16/32 clients, batching on/off", 120, 180, server_cmd, server_head),
    Step("grpo", "GRPO step of the tiny policy with each reward", 120, 240, grpo_cmd, grpo_head),
    # issue #44 item 5
    Step("judge_checks", "local judge on the device: graphs vs eager vs generate, no sync inside a step", 60, 300,
         judge_checks_cmd, judge_checks_head),
    Step("claims_7b", "claims batched vs one request per claim at LLaVA-1.5-7B shape", 120, 240, claims_cmd, claims_head),
    Step("emscore_l14_device", "EMScore ViT-L/14, today's sizes, device-side image path", 75, 120,
         emscore_device_cmd("ViT-L-14", False), emscore_head),
    Step("emscore_b32_gpu_device", "EMScore ViT-B/32, GPU-sized, device-side image path", 110, 120,
         emscore_device_cmd("ViT-B-32", True), emscore_head),
    Step("emscore_l14_gpu_device", "EMScore ViT-L/14, GPU-sized, device-side image path", 120, 120,
         emscore_device_cmd("ViT-L-14", True), emscore_head),
    Step("engines", "the in-process engines the image carries against capreward's batched judge", 60, 120,
         engines_cmd, engines_head),
]

#: Named sets of steps (``CAPREWARD_BENCH_SET``), in run order.
SETS = {
    "issue44": ["env", "judge_checks", "fleur_7b", "claims_7b", "emscore_l14_device", "emscore_b32_gpu_device",
                "emscore_l14_gpu_device", "engines"],
}
#: A set's default global deadline on a GPU (seconds).
SET_BUDGETS = {"issue44": 540}


# ------------------------------------------------------------------------------------------ runner
def run_step(step: Step, ctx: Context, limit: float, log) -> dict:
    out = ctx.work / f"{step.name}.json"
    out.unlink(missing_ok=True)
    try:
        argv = step.command(ctx, str(out))
    except Exception as exc:  # a step whose command cannot even be built (e.g. a missing package)
        return {"status": "failed", "wall_s": 0.0, "command": None, "error": f"{type(exc).__name__}: {exc}"}
    log.write(f"\n===== {step.name}: {shlex.join(argv)} (limit {limit:.0f} s)\n")
    log.flush()
    argv = shlex.split(os.environ.get("CAPREWARD_BENCH_LAUNCH", "")) + argv
    env = dict(os.environ, PYTHONUNBUFFERED="1", **step.env)
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as tail:
        # its own process group, so that a timeout stops the step's children (servers, pytest workers) too
        proc = subprocess.Popen(argv, cwd=REPO, stdout=tail, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=limit)
            status = "ok" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
        wall = time.perf_counter() - start
        tail.seek(0)
        text = tail.read()
    log.write(text)
    log.flush()
    row = {"status": status, "wall_s": round(wall, 2), "command": shlex.join(argv)}
    if out.exists():
        try:
            row["figures"] = json.loads(out.read_text())
        except json.JSONDecodeError as exc:
            row["figures_error"] = str(exc)
    if status == "ok" and "figures" not in row:
        row["status"] = "failed"
        row["error"] = "the step wrote no figures"
    if status == "timeout":
        row["error"] = f"stopped at its limit of {limit:.0f} s"
    if row["status"] != "ok":
        row["error"] = (row.get("error", "") + "\n" + text[-3000:]).strip()
    return row


def command_key(step: Step, ctx: Context) -> tuple:
    """A step's command with its output path left out: two steps with one key measure the same thing."""
    try:
        return tuple(step.command(ctx, "<out>")) + tuple(sorted(step.env.items()))
    except Exception:  # a command that cannot be built is run (and fails) on its own
        return (step.name,)


def summary_table(rows: list[dict], ctx: Context, total: float) -> str:
    heads = {s.name: s.headline for s in STEPS}
    lines = [f"capreward GPU benchmark summary: device {ctx.device}, {'GPU sizes' if ctx.gpu else 'CPU dry run (small sizes)'}, "
             f"{total:.0f} s in all", f"{'step':17s} {'status':8s} {'wall s':>7s} {'limit':>6s}  figures"]
    for r in rows:
        try:
            head = heads[r["step"]](r["figures"]) if "figures" in r else (r.get("error") or "").strip().splitlines()[-1:]
        except Exception as exc:  # a headline never hides the row
            head = f"(headline failed: {exc})"
        if isinstance(head, list):
            head = head[0] if head else ""
        lines.append(f"{r['step']:17s} {r['status']:8s} {r['wall_s']:7.1f} {r.get('limit_s', 0):6.0f}  {head}"[:400])
    return "\n".join(lines) + "\n"


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or REPO / "gpu_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    device = os.environ.get("CAPREWARD_BENCH_DEVICE")
    if not device:  # torch is imported only to find the device (the steps are processes of their own)
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = device.split(":")[0] == "cuda"
    named = os.environ.get("CAPREWARD_BENCH_SET") or ""
    if named and named not in SETS:
        print(f"unknown set {named!r}; known: {sorted(SETS)}", file=sys.stderr)
        return 2
    budget = float(os.environ.get("CAPREWARD_BENCH_BUDGET_S") or (SET_BUDGETS.get(named, 420) if gpu else 900))
    wanted = [s for s in os.environ.get("CAPREWARD_BENCH_STEPS", "").split(",") if s] or list(SETS.get(named, []))
    scale = float(os.environ.get("CAPREWARD_BENCH_LIMIT_SCALE") or 1)
    unknown = set(wanted) - {s.name for s in STEPS}
    if unknown:
        print(f"unknown steps {sorted(unknown)}; known: {[s.name for s in STEPS]}", file=sys.stderr)
        return 2
    results, summary = out_dir / "results.jsonl", out_dir / "summary.txt"
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="capreward-bench-") as tmp, open(out_dir / "steps.log", "a") as log:
        ctx = Context(device=device, gpu=gpu, work=Path(tmp))
        print(f"capreward GPU benchmarks: device {device}, budget {budget:.0f} s, results -> {results}", flush=True)
        order = [s for s in STEPS if not wanted or s.name in wanted]
        ran: dict[tuple, dict] = {}
        if wanted:  # a set's or the caller's order
            order.sort(key=lambda s: wanted.index(s.name))
        for step in order:
            left = budget - (time.perf_counter() - t0)
            limit = min((step.gpu_limit_s if gpu else step.cpu_limit_s) * scale, left)
            same = None if gpu else ran.get(command_key(step, ctx))
            if same is not None:  # the CPU dry run gives B/32 and L/14 the same tiny CLIP: one run of the command
                row = {k: v for k, v in same.items() if k not in ("step", "what", "limit_s")}
                row.update(wall_s=0.0, same_command_as=same["step"])
            elif limit < 15:
                row = {"status": "skipped", "wall_s": 0.0, "error": f"global deadline: {left:.0f} s left"}
            else:
                row = run_step(step, ctx, limit, log)
            row = {"step": step.name, "what": step.what, **row, "limit_s": round(limit, 1)}
            rows.append(row)
            if "same_command_as" not in row and row["status"] != "skipped":
                ran.setdefault(command_key(step, ctx), row)
            with open(results, "a") as fh:  # appended at once: a run killed later keeps this step
                fh.write(json.dumps(row) + "\n")
            print(f"[{time.perf_counter() - t0:6.1f} s] {step.name}: {row['status']} in {row['wall_s']:.1f} s"
                  + ("" if row["status"] == "ok" else f" -- {(row.get('error') or '').strip().splitlines()[-1:]}"),
                  flush=True)
            summary.write_text(summary_table(rows, ctx, time.perf_counter() - t0))
        table = summary_table(rows, ctx, time.perf_counter() - t0)
    summary.write_text(table)
    print(table, flush=True)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
