"""Confinement holds at open time, not only when a label's path is checked.

The reward server checks a client-named path when it parses the request and opens the file later, when
the batch is scored. Between the two, anyone who can write inside the media root may swap a directory
(or the file) for a symlink that leads out of it. The tests put the swap exactly there, with no timing:
``service.parse`` (the check), then the swap, then ``service.score`` (the open), and show that the file
outside is never opened (a spy on every open of the loaders) and the sample gets the refusal instead of
a score. A real ``capreward serve`` process serves the normal paths and keeps no descriptor per request.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

import capreward.adapters.verl as verl
from capreward.adapters import make_compute_score, parse_label
from capreward.server import RewardService
from capreward.adapters.paths import REFUSED, MediaPaths
from capreward.media import ConfinedFile, FileRefused, load_image, media_key
from capreward.rewards import CLIPScoreReward, EMScoreReward

from conftest import random_video, write_mp4
from serve_process import Server

CAPTION = "two people dance"
linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture()
def tree(tmp_path) -> dict[str, Path]:
    """root/sub/{a.png,v.mp4} inside; outside/{a.png,v.mp4}: different pictures under the same names."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    Image.fromarray(random_video(1, frames=1)[0]).save(root / "sub" / "a.png")
    Image.fromarray(random_video(2, frames=1)[0]).save(outside / "a.png")
    write_mp4(root / "sub" / "v.mp4", random_video(3, frames=4))
    write_mp4(outside / "v.mp4", random_video(4, frames=4))
    return {"root": root, "outside": outside}


def swap_dir_for_link(tree) -> None:
    """root/sub becomes a symlink to outside/ (the old directory is moved aside)."""
    root = tree["root"]
    (root / "sub").rename(root / "sub.old")
    (root / "sub").symlink_to(tree["outside"], target_is_directory=True)


@pytest.fixture()
def opened(monkeypatch) -> list[str]:
    """The real path of every file the image and video loaders open (PIL and decord)."""
    import decord
    import PIL.Image

    seen: list[str] = []
    pil_open, reader = PIL.Image.open, decord.VideoReader

    def spy_open(fp, *args, **kwargs):
        seen.append(os.readlink(f"/proc/self/fd/{fp.fileno()}") if hasattr(fp, "fileno") else os.path.realpath(fp))
        return pil_open(fp, *args, **kwargs)

    def spy_reader(uri, *args, **kwargs):
        seen.append(os.path.realpath(uri))
        return reader(uri, *args, **kwargs)

    monkeypatch.setattr(PIL.Image, "open", spy_open)
    monkeypatch.setattr(decord, "VideoReader", spy_reader)
    return seen


@pytest.fixture(scope="module")
def clip_reward(tiny_clip_path):
    return CLIPScoreReward(model=str(tiny_clip_path))


@pytest.fixture(scope="module")
def em_reward(tiny_clip_path):
    return EMScoreReward(model=str(tiny_clip_path))


def test_a_confined_label_is_opened_inside_the_root_only(tree, opened):
    label = parse_label({"image": "sub/a.png"}, paths=MediaPaths(tree["root"]))
    assert label.image == ConfinedFile(tree["root"].resolve(), "sub/a.png") and label.error is None
    inside = load_image(label.image)
    assert opened == [str((tree["root"] / "sub" / "a.png").resolve())]
    swap_dir_for_link(tree)
    assert load_image(str(tree["root"] / "sub" / "a.png")).tobytes() != inside.tobytes()  # by name: outside
    opened.clear()
    with pytest.raises(ValueError, match=f"'{tree['root'].resolve()}/sub/a.png'\\): {REFUSED}$"):
        load_image(label.image)
    with pytest.raises(FileRefused):
        label.image.open_fd()
    assert media_key(label.image) is None  # no cache key from the name either
    assert opened == []


@pytest.mark.parametrize("swap", ["directory", "file", "fifo"])
def test_server_refuses_a_swap_between_check_and_open(tree, clip_reward, opened, swap):
    service = RewardService(clip_reward, fallback=-1.0, media_root=str(tree["root"]))
    payload = {"query": [CAPTION, CAPTION], "labels": [{"image": "sub/a.png"}, {"image": "sub/a.png"}]}
    before = service.handle(payload)
    assert before["errors"] == [None, None] and before["rewards"][0] > 0
    captions, labels = service.parse(payload)  # the check
    root = tree["root"]
    if swap == "directory":
        swap_dir_for_link(tree)
    elif swap == "file":
        (root / "sub" / "a.png").unlink()
        (root / "sub" / "a.png").symlink_to(tree["outside"] / "a.png")
    else:  # a FIFO must neither block the open nor be read
        (root / "sub" / "a.png").unlink()
        os.mkfifo(root / "sub" / "a.png")
    opened.clear()
    after = service.respond(service.score(captions, labels))  # the open
    assert after["rewards"] == [-1.0, -1.0]
    assert after["errors"] == [f"image: {REFUSED}"] * 2  # the text of a refusal at the check
    assert not any(p.startswith(str(tree["outside"])) for p in opened)
    assert opened == []


def test_video_swap_is_refused_and_the_normal_path_scores(tree, em_reward, opened):
    service = RewardService(em_reward, fallback=-1.0, media_root=str(tree["root"]))
    payload = {"query": [CAPTION], "labels": [{"video": "sub/v.mp4"}]}
    direct = em_reward(None, [CAPTION], video=[str(tree["root"] / "sub" / "v.mp4")])
    assert service.handle(payload)["rewards"] == pytest.approx(direct, abs=1e-6)
    captions, labels = service.parse(payload)
    swap_dir_for_link(tree)
    em_reward.scorer.backbone.cache.clear()  # the embedding must not come from the cache: open again
    opened.clear()
    after = service.respond(service.score(captions, labels))
    assert after["rewards"] == [-1.0] and after["errors"] == [f"video: {REFUSED}"]
    assert opened == []
    # what was inside, moved aside, is still served under its new name
    moved = service.handle({"query": [CAPTION], "labels": [{"video": "sub.old/v.mp4"}]})
    assert moved["rewards"] == pytest.approx(direct, abs=1e-6)


def test_verl_confines_at_open_time_too(tree, clip_reward, opened, monkeypatch):
    compute_score = make_compute_score(clip_reward, fallback=-1.0, media_root=str(tree["root"]))
    assert compute_score("d", CAPTION, None, {"image": "sub/a.png"}) > 0
    check = verl.sample_label

    def check_then_swap(*args, **kwargs):  # the swap lands right after the label's check
        label = check(*args, **kwargs)
        swap_dir_for_link(tree)
        return label

    monkeypatch.setattr(verl, "sample_label", check_then_swap)
    clip_reward.scorer.backbone.cache.clear()
    opened.clear()
    assert compute_score("d", CAPTION, None, {"image": "sub/a.png"}) == -1.0
    assert opened == []


@linux_only
def test_descriptors_do_not_accumulate(tree, em_reward, clip_reward):
    """Every open lasts one decode: accepted, refused and raced requests leave no descriptor open."""
    images = RewardService(clip_reward, fallback=-1.0, media_root=str(tree["root"]))
    videos = RewardService(em_reward, fallback=-1.0, media_root=str(tree["root"]))
    ok = {"query": [CAPTION] * 3, "labels": [{"image": "sub/a.png"}, {"image": "nothing.png"}, {"image": "../x.png"}]}
    vid = {"query": [CAPTION] * 2, "labels": [{"video": "sub/v.mp4"}, {"video": "sub/a.png"}]}
    images.handle(ok), videos.handle(vid)  # warm: models and lazily opened files
    baseline = open_fds()
    for _ in range(15):
        images.handle(ok)
        clip_reward.scorer.backbone.cache.clear()
        em_reward.scorer.backbone.cache.clear()  # decode every time
        videos.handle(vid)
    assert open_fds() == baseline
    captions, labels = videos.parse(vid)
    swap_dir_for_link(tree)
    for _ in range(5):
        videos.respond(videos.score(captions, labels))
    assert open_fds() == baseline


@linux_only
def test_a_real_server_scores_confined_files_and_keeps_no_descriptors(tiny_clip_path, tree, em_reward):
    srv = Server(["--reward", "emscore", "--clip-model", str(tiny_clip_path), "--media-root", str(tree["root"]),
                  "--fallback", "-1"])
    try:
        fds = Path(f"/proc/{srv.proc.pid}/fd")
        payload = {"query": [CAPTION] * 3, "labels": [{"video": "sub/v.mp4"}, {"image": "sub/a.png"},
                                                       {"video": "../outside/v.mp4"}]}
        status, body = srv.post(payload)
        assert status == 200, body
        direct = em_reward(None, [CAPTION] * 2, video=[str(tree["root"] / "sub" / "v.mp4"), None],
                           image=[None, str(tree["root"] / "sub" / "a.png")])
        assert body["rewards"][:2] == pytest.approx(direct, abs=1e-6)
        assert body["errors"] == [None, None, f"video: {REFUSED}"]
        baseline = len(os.listdir(fds))
        for i in range(40):  # a new file name each time: no cache hit, every request opens and decodes
            shutil.copy(tree["root"] / "sub" / "v.mp4", tree["root"] / "sub" / f"v{i}.mp4")
            status, body = srv.post({"query": [CAPTION], "labels": [{"video": f"sub/v{i}.mp4"}]})
            assert status == 200 and body["errors"] == [None]
        # a leak would leave 40 more; the last connection's socket may still be closing
        assert len(os.listdir(fds)) <= baseline + 2
    finally:
        assert srv.stop() == 0


def test_directories_on_the_way_need_search_permission_only(tree):
    """As for an open by name: a directory the server may pass through but not list still serves."""
    if os.geteuid() == 0:
        pytest.skip("root reads any directory")
    sub = tree["root"] / "sub"
    label = parse_label({"image": "sub/a.png"}, paths=MediaPaths(tree["root"]))
    sub.chmod(0o311)  # search and write, no read
    try:
        assert load_image(label.image).size == load_image(str(sub / "a.png")).size
    finally:
        sub.chmod(0o755)


@pytest.mark.parametrize("relative", ["../outside/a.png", "/etc/passwd", "", "sub/../../x"])
def test_a_confined_file_names_a_path_inside_its_root(tree, relative):
    with pytest.raises(ValueError, match="inside the root"):
        ConfinedFile(tree["root"], relative)
