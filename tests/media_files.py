"""Video files for the media tests, written by the ffmpeg binary imageio-ffmpeg ships (an independent
writer and reader: capreward reads through PyAV or decord): rotated phone-style clips, narrow clips,
HLS playlists and ffconcat lists, and an MP4 whose header declares more frames than it holds."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np

from conftest import write_mp4


def ffmpeg() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def run_ffmpeg(*args: str) -> None:
    subprocess.run([ffmpeg(), "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *args], check=True, timeout=120)


def quadrant_clip(frames: int = 6, height: int = 48, width: int = 80) -> np.ndarray:
    """Frames whose four corners differ in colour (so every rotation and mirror is told apart), the
    colours moving a little from frame to frame."""
    out = np.zeros((frames, height, width, 3), np.uint8)
    h, w = height // 2, width // 2
    for t in range(frames):
        out[t, :h, :w] = (220, 30 + 10 * t, 30)
        out[t, :h, w:] = (30, 220, 30 + 10 * t)
        out[t, h:, :w] = (30 + 10 * t, 30, 220)
        out[t, h:, w:] = (230, 230, 40)
    return out


def write_rotated(path: Path, frames: np.ndarray, degrees: int, hflip: bool = False) -> Path:
    """An H.264 MP4 of ``frames`` with a display matrix rotating it ``degrees`` counter-clockwise (and
    mirroring it), as a phone records: the stored frames are untouched, the matrix is in the header."""
    plain = path.with_name(path.stem + "_stored.mp4")
    write_mp4(plain, frames)
    args = ["-display_rotation:v:0", str(degrees)]
    if hflip:
        args += ["-display_hflip:v:0"]
    run_ffmpeg(*args, "-i", str(plain), "-c", "copy", str(path))
    return path


def ffmpeg_upright(path: Path, width: int, height: int) -> np.ndarray:
    """Every frame of ``path`` as the ffmpeg command line shows it (its autorotation applied),
    ``width`` x ``height`` being the displayed size: uint8 (T, H, W, 3)."""
    raw = subprocess.run([ffmpeg(), "-hide_banner", "-loglevel", "error", "-nostdin", "-i", str(path),
                          "-f", "rawvideo", "-pix_fmt", "rgb24", "-"], check=True, capture_output=True, timeout=120).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)


def hls_playlist(path: Path, segment: Path, repeats: int = 1) -> Path:
    """An HLS playlist listing ``segment`` (an absolute path) ``repeats`` times."""
    entries = "".join(f"#EXTINF:1.0,\n{segment}\n" for _ in range(repeats))
    path.write_text(f"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:1\n{entries}#EXT-X-ENDLIST\n")
    return path


def ffconcat_list(path: Path, entry: str) -> Path:
    """An ffconcat list naming one file (relative to the list, as FFmpeg's safe mode allows)."""
    path.write_text(f"ffconcat version 1.0\nfile {entry}\nduration 1\n")
    return path


def ts_segment(path: Path, frames: np.ndarray) -> Path:
    """An intra-only MPEG-TS segment of ``frames`` (an HLS segment)."""
    plain = path.with_suffix(".src.mp4")
    write_mp4(plain, frames)
    run_ffmpeg("-i", str(plain), "-c:v", "libx264", "-g", "1", "-f", "mpegts", str(path))
    return path


_BOXES = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}


def _rebuild(data: bytes, start: int, end: int, edit) -> bytes:
    out = b""
    pos = start
    while pos < end:
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        box = data[pos:pos + size]
        if kind in _BOXES:
            body = _rebuild(data, pos + 8, pos + size, edit)
            out += struct.pack(">I4s", 8 + len(body), kind) + body
        else:
            out += edit(kind, box)
        pos += size
    return out


def declaring_frames(src: Path, dst: Path, count: int) -> Path:
    """A copy of the one-frame MP4 ``src`` whose sample tables declare ``count`` frames of the same
    size (the header says ``count``; the file holds one frame's bytes: a few hundred bytes in all)."""
    data = src.read_bytes()
    found: dict[str, int] = {}

    def read(kind: bytes, box: bytes) -> bytes:
        if kind == b"stsz":
            uniform, n = struct.unpack(">II", box[12:20])
            found["size"] = uniform or struct.unpack(">I", box[20:24])[0]
        elif kind == b"stts":
            found["delta"] = struct.unpack(">I", box[20:24])[0]
        return box

    _rebuild(data, 0, len(data), read)

    def full_box(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I4s", 12 + len(body), kind) + b"\0\0\0\0" + body

    def edit(kind: bytes, box: bytes) -> bytes:
        if kind == b"stts":
            return full_box(kind, struct.pack(">III", 1, count, found["delta"]))
        if kind == b"stsz":
            return full_box(kind, struct.pack(">II", found["size"], count))
        return box

    dst.write_bytes(_rebuild(data, 0, len(data), edit))
    return dst
