"""The reward server as a Ray Serve application on 127.0.0.1: answers equal to the plain server's
(the same validation, confinement and values), with ``@serve.batch`` merging concurrent requests."""

from __future__ import annotations

import functools
import json
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install capreward[serve])")

from capreward.adapters import RewardOptions, build_reward  # noqa: E402
from capreward.server import RewardService, ServerLimits  # noqa: E402
from capreward.server.http import post_json  # noqa: E402
from capreward.adapters.paths import REFUSED  # noqa: E402

from conftest import random_video  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_media")
    for i, seed in enumerate((61, 62)):
        Image.fromarray(random_video(seed, frames=1)[0]).save(root / f"i{i}.png")
    return root


def test_ray_serve_replica_answers_like_the_plain_server(tiny_clip_path, media):
    import ray
    from ray import serve

    from capreward.server.ray_serve import reward_app

    factory = functools.partial(build_reward, "clip_s", RewardOptions(clip_model=str(tiny_clip_path)))
    limits = ServerLimits(max_batch_size=16, max_wait=0.05)
    port = free_port()
    payloads = [
        {"query": ["a dog runs", "two people dance", ""], "labels": [{"image": "i0.png"}, {"image": "i1.png", "references": ["people dancing"]}, {"image": "i0.png"}]},
        {"query": ["a dog runs across the grass"], "labels": [{"image": "../outside.png"}]},
        {"query": ["two people dance"] * 2, "labels": [{"image": "i1.png"}, {"image": "i0.png"}]},
    ]
    plain = RewardService(factory(), fallback=-1, media_root=str(media))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(reward_app(factory, fallback=-1, media_root=str(media), limits=limits), route_prefix="/",
                  name="capreward")
        url = f"http://127.0.0.1:{port}"
        with ThreadPoolExecutor(len(payloads)) as pool:  # concurrent: merged by @serve.batch
            answers = list(pool.map(lambda p: post_json(url + "/get_reward", p, timeout=300), payloads))
        for payload, (status, body) in zip(payloads, answers):
            assert status == 200, body
            expected = plain.handle(payload)
            assert body["rewards"] == pytest.approx(expected["rewards"], abs=1e-6)
            assert body["errors"] == expected["errors"]
            assert body["extra_logs"].keys() == expected["extra_logs"].keys()
        assert answers[1][1]["errors"] == [f"image: {REFUSED}"]
        assert answers[0][1]["errors"][2] == "query[2] is empty"
        status, body = post_json(url + "/get_reward", {"query": ["a"], "labels": [{"imag": "x"}]}, timeout=300)
        assert status == 400 and "labels[0] has unknown keys" in body["error"]
        # the replicas decode with the server's JSON limits: an integer past 4300 digits is 400 naming it
        huge = b'{"query": ["a"], "labels": [{"image": "i0.png", "visual_id": ' + b"7" * 5000 + b"}]}"
        request = urllib.request.Request(url + "/get_reward", data=huge, method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=300)
        assert exc.value.code == 400
        assert json.loads(exc.value.read())["error"].startswith("labels[0].visual_id is an integer of 5000 digits")
    finally:
        serve.shutdown()
        ray.shutdown()
