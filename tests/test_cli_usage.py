"""The command line as a user meets it: --version, --help of every sub-command (defaults shown, choices
listed, no developer markup), names checked by argparse, one spelling of metric names, and a missing
model that fails at once with one line in flag terms instead of minutes of hub retries."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import capreward
from capreward.cli.main import build_parser
import cli_process

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **(env or {}))
    return cli_process.run(args, timeout=300, env=full_env, cwd=cwd or REPO)


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return dict(parser._subparsers._group_actions[0].choices)


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"capreward {capreward.__version__}"


@pytest.mark.parametrize("command", sorted(subcommand_parsers()))
def test_help_shows_defaults_and_choices_without_developer_markup(command):
    parser = subcommand_parsers()[command]
    proc = run_cli(command, "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "``" not in text and ":class:" not in text and ":data:" not in text
    lines = text.splitlines()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        flag = action.option_strings[0]
        # the help entry of this option: its line and the continuation lines up to the next option
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(flag + " ") or line.strip() == flag
                     or line.lstrip().startswith(flag + ","))
        # the next option starts at the options' indent (a continuation line may start with a flag it names)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("  -")), len(lines))
        entry = " ".join(" ".join(lines[start:end]).split())
        if not action.required:
            assert "default" in entry, f"{command} {flag}: no default in {entry!r}"
        if action.choices:
            assert all(str(c) in entry for c in action.choices), f"{command} {flag}: choices not listed"
    assert "--no-progress" in text and "--device" in text or command in {"report", "meta-eval", "demo"}


def test_every_model_command_has_the_same_device_option():
    devices = {name: next(a for a in p._actions if "--device" in a.option_strings)
               for name, p in subcommand_parsers().items() if any("--device" in a.option_strings for a in p._actions)}
    assert {"score", "serve", "explain"} <= set(devices)
    assert {a.default for a in devices.values()} == {"auto"}


def test_every_subcommand_has_no_progress():
    for name, p in subcommand_parsers().items():
        assert any("--no-progress" in a.option_strings for a in p._actions), name


def test_unknown_reward_lists_the_valid_ones():
    proc = run_cli("serve", "--reward", "bogus")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "invalid choice: 'bogus'" in last
    for name in ("clip_s", "emscore", "fleur", "hallucination", "composite"):
        assert name in last


def test_metric_names_have_one_spelling_and_accept_hyphens():
    parsers = subcommand_parsers()
    score = parsers["score"].parse_args(["m.jsonl", "--out", "o.jsonl", "--metrics", "clip-s,EMScore,pac_s"])
    assert score.metrics == ["clip_s", "emscore", "pac_s"]
    serve = parsers["serve"].parse_args(["--reward", "clip-s"])
    assert serve.reward == "clip_s"
    from capreward.adapters.factory import REWARD_NAMES
    from capreward.jobs.runners import METRICS

    # the names the CLI accepts are the names the Python API uses and the fields written
    assert set(REWARD_NAMES) - {"composite"} <= set(METRICS)
    proc = run_cli("score", "m.jsonl", "--out", "o.jsonl", "--metrics", "emscore,clipscore_typo")
    assert proc.returncode == 2 and "invalid metric 'clipscore_typo'" in proc.stderr and "clip_s" in proc.stderr


class FakeHub:
    """A local stand-in for the Hugging Face hub that answers 404 to everything and counts requests."""

    def __init__(self):
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.requests.append(f"{self.command} {self.path}")
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_hub():
    hub = FakeHub()
    yield hub
    hub.close()


@pytest.fixture
def manifest(tmp_path):
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(tmp_path / "red.png")
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"id": "a", "caption": "a red square", "image": "red.png"}) + "\n")
    return path


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def assert_one_line_error(proc: subprocess.CompletedProcess, flag: str, *fragments: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    line = lines[0]
    assert line.startswith("capreward ") and f"error: {flag}" in line, line
    for fragment in fragments:
        assert fragment in line, line
    return line


def test_default_clip_offline_fails_with_one_line_and_no_network(tmp_path, manifest, fake_hub):
    env = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf")}
    proc = run_cli("score", manifest, "--out", tmp_path / "x.jsonl", "--no-progress", env=env, cwd=tmp_path)
    assert_one_line_error(proc, "--clip-model", "ViT-B-32/openai", "HF_HUB_OFFLINE", "--clip-model PATH",
                          "save_tiny_clip_openai")
    assert fake_hub.requests == []


def test_default_clip_with_an_unreachable_hub_fails_after_one_probe(tmp_path, manifest):
    env = {"HF_ENDPOINT": closed_port_url(), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": ""}
    proc = run_cli("score", manifest, "--out", tmp_path / "x.jsonl", "--no-progress", env=env, cwd=tmp_path)
    assert_one_line_error(proc, "--clip-model", "unreachable", "--clip-model PATH")


def test_a_reachable_hub_is_asked_once_per_file_without_retries(tmp_path, manifest, fake_hub):
    # the hub answers (404: no such model), so the download is tried; a 404 is final, no retry loop
    env = {"HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": ""}
    proc = run_cli("score", manifest, "--out", tmp_path / "x.jsonl", "--no-progress", env=env, cwd=tmp_path)
    assert_one_line_error(proc, "--clip-model", "ViT-B-32/openai")
    probes = [r for r in fake_hub.requests if r == "HEAD /"]
    assert len(probes) == 1
    assert 1 <= len(fake_hub.requests) <= 6, fake_hub.requests


def test_missing_clip_file_names_the_flag(tmp_path, manifest):
    proc = run_cli("score", manifest, "--out", tmp_path / "x.jsonl", "--clip-model", tmp_path / "nope.pt",
                   "--no-progress", cwd=tmp_path)
    assert_one_line_error(proc, "--clip-model", "does not exist", "nope.pt")


def test_default_judge_offline_fails_with_one_line_and_no_network(tmp_path, manifest, fake_hub):
    env = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf")}
    proc = run_cli("explain", manifest, "--out", tmp_path / "e.jsonl", "--metric", "fleur", "--no-progress",
                   env=env, cwd=tmp_path)
    assert_one_line_error(proc, "--judge-model", "llava-hf/llava-1.5-13b-hf", "--judge-model DIR", "tiny_judge_dir")
    assert fake_hub.requests == []


def test_serve_with_a_missing_model_fails_at_start_not_after_ready(tmp_path):
    for reward in ("clip_s", "composite"):
        proc = run_cli("serve", "--reward", reward, "--clip-model", tmp_path / "nope.pt", "--port", "0",
                       "--allow-any-path", "--no-progress", cwd=tmp_path)
        assert "ready" not in proc.stderr
        assert_one_line_error(proc, "--clip-model", "does not exist", "nope.pt")


def test_serve_refuses_to_start_without_a_media_root(tmp_path):
    """Without --media-root the server would read no file and answer the fallback for every sample; it
    refuses at once (before loading any model) unless --allow-any-path says so, and the help says why."""
    proc = run_cli("serve", "--reward", "clip_s", "--clip-model", tmp_path / "nope.pt", "--port", "0", "--no-progress",
                   cwd=tmp_path)
    assert "ready" not in proc.stderr
    assert_one_line_error(proc, "--media-root", "--allow-any-path", "fallback")
    proc = run_cli("serve", "--reward", "clip_s", "--clip-model", tmp_path / "nope.pt", "--port", "0", "--no-progress",
                   "--media-root", tmp_path / "no-such-folder", cwd=tmp_path)
    assert_one_line_error(proc, "--media-root", "not a directory")
    text = " ".join(run_cli("serve", "--help").stdout.split())
    assert "Required unless --allow-any-path is given: none would mean that no file is ever read" in text


def test_missing_judge_directory_names_the_flag(tmp_path, manifest):
    proc = run_cli("score", manifest, "--out", tmp_path / "x.jsonl", "--metrics", "fleur",
                   "--judge-model", tmp_path / "no-such-dir", "--no-progress", cwd=tmp_path)
    assert_one_line_error(proc, "--judge-model", "does not exist")


def test_missing_input_files_name_their_argument(tmp_path, manifest, tiny_clip_path):
    proc = run_cli("score", tmp_path / "nope.jsonl", "--out", tmp_path / "x.jsonl", "--clip-model", tiny_clip_path,
                   "--no-progress")
    assert_one_line_error(proc, "manifest: no such file", "nope.jsonl")
    proc = run_cli("score", manifest, "--out", tmp_path / "x.jsonl", "--clip-model", tiny_clip_path,
                   "--idf", tmp_path / "corpus.txt", "--no-progress")
    assert_one_line_error(proc, "--idf: no such file", "corpus.txt")


def test_bad_manifest_is_one_line(tmp_path, tiny_clip_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"caption": "no visual"}\n')
    proc = run_cli("score", bad, "--out", tmp_path / "x.jsonl", "--clip-model", tiny_clip_path, "--no-progress")
    assert_one_line_error(proc, "")


def test_progress_bars_show_loading_and_rows_and_no_progress_silences_them(tmp_path, manifest, tiny_clip_path):
    def score(*extra):
        out = tmp_path / f"x{len(extra)}.jsonl"
        return run_cli("score", manifest, "--out", out, "--clip-model", tiny_clip_path, "--metrics", "emscore,clip-s",
                       *extra, cwd=tmp_path)

    shown = score()
    assert shown.returncode == 0, shown.stderr
    assert f"loading CLIP {tiny_clip_path}" in shown.stderr and "1/1" in shown.stderr
    quiet = score("--no-progress")
    assert quiet.returncode == 0, quiet.stderr
    lines = [line for line in quiet.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and json.loads(lines[0])["written"] == 1  # only the summary
    # the summary names the idf the job used (the manifest has no references: auto means none)
    assert json.loads(lines[0])["idf"] == f"auto: {manifest} has no references, so none (every token weight 1)"
    report = run_cli("report", tmp_path / "x1.jsonl", "--out", tmp_path / "r.html", "--no-progress", cwd=tmp_path)
    assert report.returncode == 0 and report.stderr.strip() == ""


def test_no_progress_silences_the_judges_weight_loading_bars(tmp_path, manifest):
    """transformers' "Loading weights" bar of a LLaVA judge is silenced by --no-progress as well: stderr
    holds the summary line only (and without --no-progress the bar is there, so the check means something)."""
    from capreward.testing import FLEUR_RECIPE, tiny_judge_dir

    judge = str(tiny_judge_dir(FLEUR_RECIPE))  # trained once, then read from the fixture cache

    def score(*extra):
        out = tmp_path / f"f{len(extra)}.jsonl"
        return run_cli("score", manifest, "--out", out, "--metrics", "fleur", "--judge-model", judge, *extra, cwd=tmp_path)

    quiet = score("--no-progress")
    assert quiet.returncode == 0, quiet.stderr
    lines = [line for line in quiet.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and json.loads(lines[0])["written"] == 1, quiet.stderr
    shown = score()
    assert shown.returncode == 0 and "Loading weights" in shown.stderr, shown.stderr


def test_help_has_a_description_and_numeric_defaults():
    parsers = subcommand_parsers()
    for name, parser in parsers.items():
        assert parser.description and len(parser.description.split()) >= 8, f"{name} --help has no description"
    proc = run_cli("score", "--help", env={"COLUMNS": "200"})
    options = proc.stdout.split("\n  --hallucination-threshold", 1)[1]  # its entry, not the usage line
    entry = " ".join(options.split("\n  --idf")[0].split())
    from capreward.rewards.hallucination import DEFAULT_THRESHOLD

    assert f"(default: {DEFAULT_THRESHOLD})" in entry, entry


def test_a_clip_checkpoint_given_as_judge_model_is_named_as_such(tmp_path, tiny_clip_path):
    """Round 3: a CLIP .pt given as --judge-model was reported as "directory does not exist"."""
    from PIL import Image

    Image.new("RGB", (16, 16), "red").save(tmp_path / "red.png")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "caption": "a red image.", "image": str(tmp_path / "red.png")}) + "\n")
    result = subprocess.run([sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--out",
                             str(tmp_path / "o.jsonl"), "--metrics", "fleur", "--judge-model", str(tiny_clip_path),
                             "--no-progress"], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "is a CLIP checkpoint, not a model directory" in result.stderr
    assert "does not exist" not in result.stderr and "Traceback" not in result.stderr
    from capreward.judges.loading import JudgeLoadError, load_llava

    with pytest.raises(JudgeLoadError, match="CLIP weights go to --clip-model"):
        load_llava(tiny_clip_path, dtype=None, device=None)
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(JudgeLoadError, match="is a single file, not a judge model directory"):
        load_llava(other, dtype=None, device=None)


def test_ctrl_c_during_start_up_is_one_line(monkeypatch, capsys, tmp_path):
    """Round 3: Ctrl-C during start-up printed a traceback. Ctrl-C while the parser imports the
    commands, and while `capreward serve` loads its model, each give one line and status 130."""
    from capreward.cli import main as cli_main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(cli_main, "build_parser", interrupted)
        assert cli_main.main(["score", "--help"]) == 130
    assert capsys.readouterr().err.strip() == "capreward: interrupted"
    import capreward.adapters.factory

    monkeypatch.setattr(capreward.adapters.factory, "build_reward", interrupted)
    assert cli_main.main(["serve", "--reward", "clip_s", "--allow-any-path", "--port", "0"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "capreward serve: interrupted" and "Traceback" not in err
