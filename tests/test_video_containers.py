"""Containers, not playlists (issue 21.1): a playlist or concat list inside the media root, under any name,
never makes a decoder read what it lists. Before any decoder opens a video file the loader identifies
the container from its first bytes and accepts only self-contained ones; every other file gets the one
text NOT_A_CONTAINER, through the Python API, a reward, ``capreward score``, the reward server and veRL.

The fixtures: root/ holds a red clip, HLS playlists and ffconcat lists named .mp4 and .mkv that list a
blue clip outside the root (the concat lists through a symlink inside the root, as FFmpeg's safe mode
only takes relative names), and a playlist repeating that segment 3000 times. On the code before this
change the HLS playlists were decoded (the outside clip scored) and the concat lists either decoded
(plain paths) or failed with a decoder error.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capreward.media import ConfinedFile, MediaError, load_video

from conftest import write_mp4
from media_files import declaring_frames, ffconcat_list, hls_playlist, ts_segment
from serve_process import Server

# the one refusal text (capreward.media.containers.NOT_A_CONTAINER), spelt out: the test pins it
NOT_A_CONTAINER = ("cannot decode video: not a self-contained video file (accepted containers: MP4/MOV, "
                   "Matroska/WebM, AVI); playlists, concat lists and other formats are refused")
PLAYLISTS = ["hls.mp4", "hls.mkv", "concat.mp4", "concat.mkv", "repeat.mp4"]
CAPTION = "a red image."


def _clip(colour: tuple[int, int, int], frames: int = 10) -> np.ndarray:
    rng = np.random.default_rng(sum(colour))
    base = np.broadcast_to(np.array(colour, np.float32), (frames, 32, 32, 3))
    return np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("playlists")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    write_mp4(root / "red.mp4", _clip((220, 30, 30)))
    blue_ts = ts_segment(outside / "blue.ts", _clip((30, 30, 220)))
    blue_mp4 = write_mp4(outside / "blue.mp4", _clip((30, 30, 220)))
    (root / "link.ts").symlink_to(blue_ts)
    (root / "link.mp4").symlink_to(blue_mp4)
    hls_playlist(root / "hls.mp4", blue_ts)
    hls_playlist(root / "hls.mkv", blue_ts)
    ffconcat_list(root / "concat.mp4", "link.mp4")
    ffconcat_list(root / "concat.mkv", "link.ts")
    hls_playlist(root / "repeat.mp4", blue_ts, repeats=3000)
    return {"root": root, "blue": blue_mp4}


@pytest.mark.parametrize("name", PLAYLISTS)
@pytest.mark.parametrize("confined", [False, True])
def test_the_loader_refuses_playlists_with_one_text(tree, name, confined):
    item = ConfinedFile(tree["root"].resolve(), name) if confined else str(tree["root"] / name)
    with pytest.raises(MediaError) as exc:
        load_video(item, index=0)
    assert exc.value.problem == NOT_A_CONTAINER
    assert load_video(str(tree["root"] / "red.mp4")).shape == (10, 32, 32, 3)  # a real container still loads


def test_no_decoder_opens_a_playlist(tree, monkeypatch):
    """The refusal comes before any decoder: neither PyAV nor decord is asked to open the file."""
    import av

    opened = []
    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    try:
        import decord

        real_reader = decord.VideoReader
        monkeypatch.setattr(decord, "VideoReader", lambda *a, **k: opened.append(a) or real_reader(*a, **k))
    except ImportError:
        pass
    for name in PLAYLISTS:
        with pytest.raises(MediaError):
            load_video(str(tree["root"] / name))
    assert opened == []
    load_video(str(tree["root"] / "red.mp4"))
    assert opened  # the spies do see a real container being opened


def test_scorers_and_rewards_refuse_playlists(tree, tiny_backbone):
    from capreward.rewards import EMScoreReward
    from capreward.scorers.emscore import EMScore

    em = EMScore(backbone=tiny_backbone)
    for name in PLAYLISTS:
        with pytest.raises(MediaError, match="item 1") as exc:
            em.score([CAPTION, CAPTION], videos=[str(tree["root"] / "red.mp4"), str(tree["root"] / name)])
        assert exc.value.problem == NOT_A_CONTAINER
    reward = EMScoreReward(scorer=em)
    videos = [str(tree["root"] / "red.mp4")] + [str(tree["root"] / n) for n in PLAYLISTS]
    out = reward.compute(None, [CAPTION] * len(videos), video=videos)
    assert out.values[0] is not None
    assert out.values[1:] == [None] * len(PLAYLISTS)
    assert all(NOT_A_CONTAINER in r for r in out.reasons[1:]), out.reasons


def test_cli_score_refuses_playlists(tree, tiny_clip_path, tmp_path):
    rows = [{"id": n, "caption": CAPTION, "video": str(tree["root"] / n)} for n in ["red.mp4", *PLAYLISTS]]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scores.jsonl"
    proc = subprocess.run([sys.executable, "-m", "capreward.cli.main", "score", str(manifest), "--out", str(out),
                           "--metrics", "clip_s", "--clip-model", str(tiny_clip_path), "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_id = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert "clip_s" in by_id["red.mp4"] and not by_id["red.mp4"].get("errors")
    for name in PLAYLISTS:
        assert by_id[name].get("clip_s") is None, by_id[name]
        assert NOT_A_CONTAINER in json.dumps(by_id[name]["errors"]), by_id[name]


def test_reward_server_refuses_playlists(tree, tiny_clip_path):
    srv = Server(["--reward", "clip_s", "--clip-model", str(tiny_clip_path), "--media-root", str(tree["root"]),
                  "--fallback", "-7"])
    try:
        labels = [{"video": n} for n in ["red.mp4", *PLAYLISTS]]
        status, body = srv.post({"query": [CAPTION] * len(labels), "labels": labels})
    finally:
        assert srv.stop() == 0
    assert status == 200, body
    assert body["errors"][0] is None and body["rewards"][0] != -7
    assert body["rewards"][1:] == [-7.0] * len(PLAYLISTS)
    # one text for every playlist, whatever it lists (the root itself is redacted by the server)
    assert body["errors"][1:] == [f"query[{i}]: video input ('<media-root>/{n}'): {NOT_A_CONTAINER}"
                                  for i, n in enumerate(PLAYLISTS, 1)]


def test_verl_refuses_playlists(tree, tiny_backbone, caplog):
    from capreward.adapters import make_compute_score
    from capreward.rewards import CLIPScoreReward
    from capreward.scorers.clipscore import CLIPScore

    reward = CLIPScoreReward(scorer=CLIPScore(backbone=tiny_backbone))
    compute_score = make_compute_score(reward, fallback=-7.0, media_root=str(tree["root"]))
    assert compute_score("d", CAPTION, None, {"video": "red.mp4"}) != -7.0
    with caplog.at_level(logging.WARNING):
        for name in PLAYLISTS:
            assert compute_score("d", CAPTION, None, {"video": name}) == -7.0
    assert caplog.text.count(NOT_A_CONTAINER) >= len(PLAYLISTS), caplog.text


def test_the_header_bounds_the_frame_count(tmp_path):
    """An MP4 of a few hundred bytes whose tables declare 3,000,000 frames is refused from its header,
    before a decoder indexes it (decord would reserve its index for every declared frame)."""
    one = write_mp4(tmp_path / "one.mp4", _clip((200, 200, 40), frames=1))
    big = declaring_frames(one, tmp_path / "declares.mp4", 3_000_000)
    assert big.stat().st_size < 4096
    with pytest.raises(MediaError, match=r"header declares 3,000,000, over the limit of 262,144 \(max_video_frames"):
        load_video(str(big))


def test_a_file_rewritten_while_decord_reads_it_is_refused(tmp_path, monkeypatch):
    """decord opens the file by name again (it probes the format itself): if anyone writes the file
    between the container check and the end of decord's read, the result is refused."""
    pytest.importorskip("decord")
    import capreward.media.backends as backends

    path = write_mp4(tmp_path / "clip.mp4", _clip((220, 30, 30)))
    real = backends.DecordReader.frames

    def frames(self, indices, chunk):
        with open(path, "ab") as f:  # a writer inside the root, while decord reads
            f.write(b"\0" * 16)
        yield from real(self, indices, chunk)

    monkeypatch.setattr(backends.DecordReader, "frames", frames)
    with pytest.raises(MediaError, match="the file changed while it was read"):
        load_video(str(path), backend="decord")
