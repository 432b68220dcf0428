"""veRL videos from the sample itself: a sample whose ``extra_info`` names no visual is scored on the
video it carries in ``multi_modal_data`` (veRL's ``fetch_video`` output, a float (T, 3, H, W) array of
0..255 values, or a list of frames; ``"video"`` or the agent loop's ``"videos"``), inside veRL's own
reward loop (verl 0.9.1) with :class:`~capreward.adapters.verl_manager.CaprewardRewardManager`, equal to
the reward called directly on the same frames; a path in ``extra_info`` still wins, and frames holding
NaN give that sample the fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import capreward.adapters.verl as capreward_verl
from capreward.rewards import EMScoreReward

pytestmark = pytest.mark.integration
verl = pytest.importorskip("verl", reason="verl is installed by scripts/bootstrap.sh --test")

from test_verl_contract import BATCH_OVERRIDES, data_proto, run_worker, tokenizer_dir, verl_config  # noqa: E402,F401

FALLBACK = -0.5


def frames(rgb, seed: int, count: int = 4) -> np.ndarray:
    """(T, H, W, 3) uint8 frames around one colour."""
    rng = np.random.default_rng(seed)
    return np.clip(np.array(rgb) + rng.normal(0, 12, (count, 24, 32, 3)), 0, 255).astype(np.uint8)


@pytest.fixture
def video_env(monkeypatch, tiny_clip_path, tmp_path):
    for key, value in {"CAPREWARD_REWARD": "emscore", "CAPREWARD_CLIP_MODEL": str(tiny_clip_path),
                       "CAPREWARD_MEDIA_ROOT": str(tmp_path), "CAPREWARD_FALLBACK": str(FALLBACK)}.items():
        monkeypatch.setenv(key, value)
    capreward_verl.reset_default_scorer()
    yield tmp_path
    capreward_verl.reset_default_scorer()


def test_the_manager_scores_the_video_a_sample_carries(video_env, tiny_clip_path, tokenizer_dir):
    red, blue = frames((215, 30, 35), 0), frames((35, 70, 215), 1)
    # veRL's layout: fetch_video's float (T, 3, H, W) after a bicubic resize, overshooting 0..255 a little
    verl_red = np.moveaxis(red.astype(np.float32), 3, 1) + np.float32(0.3)
    verl_red[0, 0, 0, 0] = -1.5
    broken = verl_red.copy()
    broken[1, 2, 3, 4] = np.nan
    Image.fromarray(blue[0]).save(video_env / "blue.png")
    samples = [("a red image", None, {}), ("a blue image", None, {}), ("a blue image", None, {"image": "blue.png"}),
               ("a red image", None, {})]
    carried = [{"video": [torch.from_numpy(verl_red)]}, {"videos": [[Image.fromarray(f) for f in blue]]},
               {"video": [verl_red]}, {"video": [broken]}]
    data = data_proto(tokenizer_dir, samples)
    data.non_tensor_batch["multi_modal_data"] = np.array(carried, dtype=object)
    _, outputs = run_worker(verl_config(tokenizer_dir, BATCH_OVERRIDES), data)
    reward = EMScoreReward(model=str(tiny_clip_path))
    want_red = np.clip(np.rint(np.moveaxis(verl_red, 1, 3)), 0, 255).astype(np.uint8)
    videos = reward(None, ["a red image", "a blue image"], video=[want_red, blue])
    image = reward(None, ["a blue image"], image=[str(video_env / "blue.png")])
    got = [o["reward_score"] for o in outputs]
    np.testing.assert_allclose(got[:3], [*videos, *image], rtol=1e-6)
    assert got[3] == FALLBACK  # NaN frames: no reward, the fallback
    assert abs(got[0] - got[2]) > 1e-4  # the path won over the carried video (another visual, another score)
    source = red.copy()
    source[0, 0, 0, 0] = 0  # the overshoot below 0 is clipped; the rest rounds back to the source frames
    assert (want_red == source).all()
