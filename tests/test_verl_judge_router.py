"""A chat-judge reward inside veRL's own reward loop (verl 0.9.1): the judge is the OpenAI-compatible
server veRL's reward pool serves (``reward_router_address``, model ``reward.reward_model.model_path``),
and a sample's image comes from its ``multi_modal_data`` when ``extra_info`` names none. veRL's
``RewardLoopWorker`` is built from its own composed config, as in tests/test_verl_contract.py."""

from __future__ import annotations

import numpy as np
import pytest

import capreward.adapters.verl as capreward_verl
from capreward import VisCE2
from capreward.testing.chat_server import ChatServer
from capreward.testing.tiny_vlm_judges import probe_image, tiny_vlm_judge_dir
from fixtures_llava import one_torch_thread, vlm_judge  # noqa: F401 (pytest fixtures)

pytestmark = pytest.mark.integration
verl = pytest.importorskip("verl", reason="verl is installed by scripts/bootstrap.sh --test")

from test_verl_contract import BATCH_OVERRIDES, data_proto, tokenizer_dir, verl_config  # noqa: E402,F401

COLOURS = ("green", "red", "blue")


@pytest.fixture(scope="module")
def judge_dir():
    return str(tiny_vlm_judge_dir())


@pytest.fixture(scope="module")
def router(judge_dir, tmp_path_factory):
    """The reward pool's router: an OpenAI-compatible server of the judge, named by its model path."""
    log = tmp_path_factory.mktemp("router") / "server.log"
    with ChatServer("local", judge_dir=judge_dir, model=judge_dir, log_path=log) as s:
        yield s


@pytest.fixture
def judge_env(monkeypatch, tmp_path):
    for key, value in {"CAPREWARD_REWARD": "visce2", "CAPREWARD_MEDIA_ROOT": str(tmp_path),
                       "CAPREWARD_FALLBACK": "-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CAPREWARD_JUDGE_URL", raising=False)
    capreward_verl.reset_default_scorer()
    yield tmp_path
    capreward_verl.reset_default_scorer()


def test_the_reward_pool_router_backs_the_judge_and_multi_modal_data_gives_the_image(
        judge_env, router, judge_dir, tokenizer_dir, vlm_judge):  # noqa: F811
    import asyncio

    from verl.experimental.reward_loop import RewardLoopWorker

    images = [probe_image("visce2", c) for c in COLOURS]
    images[1].save(judge_env / "red.png")
    samples = [("a green ball", None, {}), ("a red car", None, {"image": "red.png"}), ("many blue kites", None, {})]
    data = data_proto(tokenizer_dir, samples)
    data.non_tensor_batch["multi_modal_data"] = np.array(
        [{"image": [images[0]]}, {"image": [images[2]]}, {"image": [images[2]]}], dtype=object)
    config = verl_config(tokenizer_dir, [
        *BATCH_OVERRIDES, "reward.custom_reward_function.path=pkg://capreward.adapters.verl",
        "reward.custom_reward_function.name=compute_score", "reward.reward_model.enable=True",
        f"reward.reward_model.model_path={judge_dir}"])
    host_port = router.base_url.removeprefix("http://").removesuffix("/v1")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker = RewardLoopWorker(config, reward_router_address=host_port)
        outputs = loop.run_until_complete(worker.compute_score_batch(data))
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    manager = worker.reward_manager
    assert type(manager).__name__ == "CaprewardRewardManager"
    backend = manager.scorer.reward.scorer.backend
    assert backend.base_url == f"http://{host_port}/v1" and backend.model == judge_dir
    # sample 1 names its file: the path wins over multi_modal_data (which here holds another image)
    scores = VisCE2(vlm_judge).score([s[0] for s in samples], images).score
    want = [v * 0.01 if 0 <= v <= 100 else -1.0 for v in scores]  # above 100: no reward, the fallback
    assert scores[2] > 100  # the tiny judge answers out of range for a caption saying "many"
    np.testing.assert_allclose([o["reward_score"] for o in outputs], want, rtol=1e-6)
    assert router.stats()["answered"] >= 3
