"""A device the machine does not have is one clear error naming what to pick, before any model is loaded:
``DeviceUnavailableError`` (a ValueError) from the Python API, one line and exit status 2 from the CLI.

On a machine without CUDA the missing device is ``cuda``; on one with GPUs it is the index after the last
visible one (``cuda:N``), so the tests mean the same on both."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from capreward.devices import DeviceUnavailableError, checked_device

MISSING = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
PICK = "device='cpu'" if not torch.cuda.is_available() else "pick one of them"


def test_checked_device():
    assert checked_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceUnavailableError, match=rf"device '{MISSING}' is not available: .*{PICK}") as info:
        checked_device(MISSING)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="is not a torch device"):
        checked_device("gpu0")


def test_scorers_metrics_and_judges_refuse_a_missing_device_before_loading(tiny_clip_path):
    from capreward import CLIPScore, EMScore
    from capreward.backbones import CLIPBackbone
    from capreward.torchmetrics import EMScoreMetric
    from capreward.judges import LocalJudge
    from capreward.testing import tiny_clip_factory

    builders = [
        lambda: CLIPBackbone(tiny_clip_factory(0), device=MISSING),
        lambda: EMScore(str(tiny_clip_path), device=MISSING),
        lambda: CLIPScore(str(tiny_clip_path), device=MISSING),
        lambda: EMScoreMetric(str(tiny_clip_path), device=MISSING),
        lambda: LocalJudge("/nonexistent/judge", device=MISSING),  # refused before the (missing) weights are read
    ]
    for build in builders:
        with pytest.raises(DeviceUnavailableError, match=rf"device '{MISSING}' is not available"):
            build()


def test_cli_prints_one_line_and_exits_2(tmp_path, tiny_clip_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "caption": "a cat", "image": "missing.png"}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--out", str(tmp_path / "o.jsonl"),
         "--clip-model", str(tiny_clip_path), "--device", MISSING, "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"capreward score: error: --device: device '{MISSING}' is not available")
    assert not (tmp_path / "o.jsonl").exists()
