"""Cache identity (issue 20, item 5): an explicit visual id never serves an embedding by itself, and a
file rewritten in place with its size and modification time kept is a cache miss.

A reused id with other content (in one call, across calls, across clients of the reward server, in
veRL's ``extra_info``) used to get the other content's embedding: with the colour CLIP a blue image
under a red image's id scored [2.377, 0.0] for ["a red image", "a blue image"] instead of
[0.0, 2.454]. The key is now the content's identity (pixel hash, or the file's device, inode, size,
mtime_ns and ctime_ns), narrowed by the id.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from capreward.media.keys import media_key
from fixtures_llava import vlm_judge  # noqa: F401

CAPTIONS = ["a red image", "a blue image"]


@pytest.fixture(scope="module")
def colour_backbone():
    from capreward.backbones import CLIPBackbone
    from capreward.testing.trained_clip import trained_clip_path

    return CLIPBackbone(str(trained_clip_path()))


@pytest.fixture(scope="module")
def images():
    from capreward.testing.trained_clip import colour_image

    return {c: colour_image(c, size=(32, 32)) for c in ("red", "blue")}


def fresh_reward(backbone, **kwargs):
    """A CLIP-S reward reading ids from the ``visual_id`` column, on a backbone whose cache is empty."""
    from capreward.rewards import CLIPScoreReward

    backbone.cache.clear()
    return CLIPScoreReward(backbone=backbone, visual_id_column="visual_id", **kwargs)


def truth(backbone, image) -> list[float]:
    """The values of CAPTIONS on ``image`` scored with no id and an empty cache."""
    return fresh_reward(backbone)(None, CAPTIONS, image=[image] * 2)


def rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """Overwrite ``path`` in place (same inode) with ``data`` (same size), then restore its old
    modification time as ``cp -p``/``rsync -t``/``tar`` do. The kernel sets the ctime on both steps;
    its clock ticks coarsely (a few ms on some kernels), so rewrite until the ctime moved (bounded)."""
    before = path.stat()
    assert len(data) == before.st_size
    for _ in range(200):
        with open(path, "r+b") as f:
            f.write(data)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = path.stat()
        if after.st_ctime_ns != before.st_ctime_ns:
            break
        time.sleep(0.01)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert after.st_ctime_ns != before.st_ctime_ns, "the file system's ctime did not move"


def bmp_bytes(image) -> bytes:
    """An uncompressed BMP: the same size for every image of the same dimensions."""
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="BMP")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------ the keys
def test_an_explicit_id_narrows_the_content_key_and_never_replaces_it(images, tmp_path):
    from capreward.media.keys import content_key

    red, blue = images["red"], images["blue"]
    assert media_key(red, "x") != media_key(blue, "x")
    assert media_key(red, "x") != media_key(red, "y") and media_key(red, "x") == media_key(red.copy(), "x")
    assert media_key(red, "x").startswith("id:x|") and content_key(red) in media_key(red, "x")
    assert media_key(12345, "x") is None  # no content identity: not cached, whatever the id
    path = tmp_path / "a.bmp"
    path.write_bytes(bmp_bytes(red))
    st = path.stat()
    key = media_key(str(path), "x")
    for field in (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
        assert str(field) in key


# --------------------------------------------------------------------------------------- Python API
def test_reused_id_with_other_pixels_is_a_miss_in_one_call_and_across_calls(colour_backbone, images):
    red, blue = images["red"], images["blue"]
    want_red, want_blue = truth(colour_backbone, red), truth(colour_backbone, blue)
    assert want_red[0] > want_red[1] and want_blue[1] > want_blue[0], "precondition: the CLIP knows colours"
    reward = fresh_reward(colour_backbone)
    # across calls: red, then blue under the same id
    assert reward(None, CAPTIONS, image=[red] * 2, visual_id=["img-1"] * 2) == pytest.approx(want_red, abs=1e-5)
    assert reward(None, CAPTIONS, image=[blue] * 2, visual_id=["img-1"] * 2) == pytest.approx(want_blue, abs=1e-5)
    # in one call: four samples, two images, one id
    values = reward(None, CAPTIONS * 2, image=[red, red, blue, blue], visual_id=["img-1"] * 4)
    assert values == pytest.approx(want_red + want_blue, abs=1e-5)
    # the id still narrows: the same pixels under the same id are served from the cache
    misses = colour_backbone.cache.misses
    reward(None, CAPTIONS, image=[blue] * 2, visual_id=["img-1"] * 2)
    assert colour_backbone.cache.misses == misses


def test_scorer_image_ids_are_narrowed_too(colour_backbone, images):
    from capreward.scorers.clipscore import CLIPScore

    colour_backbone.cache.clear()
    scorer = CLIPScore(backbone=colour_backbone)
    red, blue = images["red"], images["blue"]
    first = scorer.score(CAPTIONS, images=[red, blue], image_ids=["same", "same"]).clip_s.tolist()
    plain = scorer.score(CAPTIONS, images=[red, blue]).clip_s.tolist()
    assert first == pytest.approx(plain, abs=1e-5)


def test_same_size_rewrite_with_restored_mtime_is_a_miss(colour_backbone, images, tmp_path):
    red, blue = images["red"], images["blue"]
    want_red, want_blue = truth(colour_backbone, red), truth(colour_backbone, blue)
    path = tmp_path / "photo.bmp"
    path.write_bytes(bmp_bytes(red))
    reward = fresh_reward(colour_backbone)
    for ids in (None, ["photo"] * 2):  # cached under the path key, and under the id's key
        assert reward(None, CAPTIONS, image=[str(path)] * 2, visual_id=ids) == pytest.approx(want_red, abs=1e-5)
    rewrite_keeping_size_and_mtime(path, bmp_bytes(blue))
    for ids in (None, ["photo"] * 2):
        assert reward(None, CAPTIONS, image=[str(path)] * 2, visual_id=ids) == pytest.approx(want_blue, abs=1e-5)


def test_a_file_replaced_by_rename_with_the_same_size_and_mtime_is_a_miss(colour_backbone, images, tmp_path):
    """rsync and tar write a new file and rename it over the old one: a new inode."""
    red, blue = images["red"], images["blue"]
    want_blue = truth(colour_backbone, blue)
    path, new = tmp_path / "photo.bmp", tmp_path / ".photo.bmp.tmp"
    path.write_bytes(bmp_bytes(red))
    reward = fresh_reward(colour_backbone)
    reward(None, CAPTIONS, image=[str(path)] * 2)
    new.write_bytes(bmp_bytes(blue))
    st = path.stat()
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert reward(None, CAPTIONS, image=[str(path)] * 2) == pytest.approx(want_blue, abs=1e-5)


# ------------------------------------------------------------------------- the server, across clients
def test_server_clients_reusing_an_id_get_their_own_image(colour_backbone, images, tmp_path):
    from capreward.server.http import make_server, post_json

    for name, colour in (("a.bmp", "red"), ("b.bmp", "blue")):
        (tmp_path / name).write_bytes(bmp_bytes(images[colour]))
    want_red, want_blue = truth(colour_backbone, images["red"]), truth(colour_backbone, images["blue"])
    server = make_server(fresh_reward(colour_backbone), port=0, media_root=str(tmp_path))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        def ask(image: str) -> list[float]:  # each call is a new connection: another client
            status, body = post_json(server.url + "/get_reward", {
                "query": CAPTIONS, "labels": [{"image": image, "visual_id": "shared-id"}] * 2}, timeout=120)
            assert status == 200 and body["errors"] == [None, None], body
            return body["rewards"]

        assert ask("a.bmp") == pytest.approx(want_red, abs=1e-5)
        assert ask("b.bmp") == pytest.approx(want_blue, abs=1e-5)
        # a confined file rewritten in place, size and mtime kept: a miss too
        rewrite_keeping_size_and_mtime(tmp_path / "a.bmp", bmp_bytes(images["blue"]))
        assert ask("a.bmp") == pytest.approx(want_blue, abs=1e-5)
    finally:
        server.shutdown()
        server.close_gracefully(timeout=30)
        thread.join(timeout=30)


# ------------------------------------------------------------------------------------------- veRL
def test_verl_extra_info_reusing_an_id_gets_its_own_image(colour_backbone, images, tmp_path):
    from capreward.adapters.verl import make_compute_score

    for name, colour in (("red.bmp", "red"), ("blue.bmp", "blue")):
        (tmp_path / name).write_bytes(bmp_bytes(images[colour]))
    want_red, want_blue = truth(colour_backbone, images["red"]), truth(colour_backbone, images["blue"])
    compute_score = make_compute_score(fresh_reward(colour_backbone), media_root=str(tmp_path))
    for image, want in (("red.bmp", want_red), ("blue.bmp", want_blue)):
        infos = [{"image": image, "visual_id": "row-7"}] * 2
        assert compute_score.batch(["src"] * 2, CAPTIONS, [None] * 2, infos) == pytest.approx(want, abs=1e-5)
        single = [compute_score("src", c, None, infos[0]) for c in CAPTIONS]
        assert single == pytest.approx(want, abs=1e-5)


# ------------------------------------------------------------------------------- the judges' cache
def test_visce2_context_cache_keys_an_id_with_the_pixels(vlm_judge, tmp_path):  # noqa: F811
    """VisCE²'s visual-context cache (memory and disk) had the same flaw: a reused image id served
    the other image's description."""
    from capreward import VisCE2
    from capreward.testing.tiny_vlm_judges import context_answer, probe_image

    green, blue = probe_image("visce2", "green"), probe_image("visce2", "blue")
    scorer = VisCE2(vlm_judge, cache_dir=tmp_path)
    first = scorer.score(["a green ball"], [green], image_ids=["img"])
    assert first.context == [context_answer("green")]
    again = scorer.score(["a blue kite", "a green ball"], [blue, green], image_ids=["img", "img"])
    assert again.context == [context_answer("blue"), context_answer("green")]
    from_disk = VisCE2(vlm_judge, cache_dir=tmp_path).score(["a blue kite"], [blue], image_ids=["img"])
    assert from_disk.context == [context_answer("blue")]
