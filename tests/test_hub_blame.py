"""Issue 43 items 5 and 7: the hub is blamed only when the hub was asked. A model named by a path on
this machine is loaded from that path alone: a folder that is not a model, a path that does not exist
and a folder that asks to run its own code each say what is wrong with them (the hub was never asked,
nothing of the folder is imported), instead of "not in the local cache and cannot be downloaded"."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from capreward import hub
from capreward.backbones.clip_loading import ModelLoadError, load_clip
from capreward.backbones.hf_clip import load_transformers_clip
from capreward.judges.loading import JudgeLoadError, load_llava


@pytest.fixture
def no_hub(monkeypatch):
    """The hub must not be asked: a probe fails the test."""
    def asked(*args, **kwargs):
        raise AssertionError("the hub was asked about a model on this machine")

    monkeypatch.setattr(hub, "hub_reachable", asked)


@pytest.fixture
def hostile(tmp_path):
    """A transformers folder whose config asks to run its own module, which would leave a marker."""
    folder = tmp_path / "hostile"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "clip", "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}}))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder, marker


def test_a_folder_asking_to_run_its_own_code_is_refused_saying_so(hostile, no_hub):
    folder, marker = hostile
    for spec in (f"transformers:{folder}", str(folder)):
        with pytest.raises(ModelLoadError) as info:
            load_transformers_clip(spec, "cpu")
        text = str(info.value)
        assert "asks to run the folder's own code (auto_map" in text and "cannot be downloaded" not in text
        assert "hub" not in text
    with pytest.raises(JudgeLoadError, match="asks to run the folder's own code"):
        load_llava(folder, dtype=None, device="cpu")
    assert not marker.exists()


def test_a_folder_that_is_not_a_model_says_so(tmp_path, no_hub):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "readme.txt").write_text("holiday pictures")
    with pytest.raises(ModelLoadError) as info:
        load_clip(folder)
    text = str(info.value)
    assert f"the folder {folder} is not a model capreward can load" in text and "open_clip_config.json" in text
    assert "cannot be downloaded" not in text
    with pytest.raises(ModelLoadError, match=f"the folder {folder} is not a model capreward can load"):
        load_transformers_clip(f"transformers:{folder}", "cpu")
    with pytest.raises(ModelLoadError, match=f"{tmp_path / 'gone'} does not exist on this machine"):
        load_transformers_clip(f"transformers:{tmp_path / 'gone'}", "cpu")


def test_a_hub_name_is_still_blamed_on_the_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not in the local cache and cannot be downloaded"):
        load_transformers_clip("transformers:nobody/no-such-clip-model", "cpu")


def test_the_cli_names_the_folder_in_one_line(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "readme.txt").write_text("holiday pictures")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"caption": "a cat", "image": str(tmp_path / "i.png")}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--out",
                           str(tmp_path / "o.jsonl"), "--clip-model", str(folder), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("capreward score: error: --clip-model:"), proc.stderr
    assert "is not a model capreward can load" in lines[0] and "cannot be downloaded" not in lines[0]
