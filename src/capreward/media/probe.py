"""A video's frame size from its container header, before any frame is decoded in this process.

decord exposes the frame size only by decoding a frame, so a video whose header declares frames far
over the limits would cost a full-size decode (up to ~1 GB for one 16K frame) before it could be
refused. :func:`header_frame_sizes` asks the ffmpeg binary that imageio-ffmpeg ships instead: ``ffmpeg
-i FILE`` with no output reads the header, prints the streams and exits, in its own process, with
``-max_pixels`` bounding what its decoder may allocate while it probes. The sizes it prints are the
declared ones: a stream that changes size inside its bitstream is caught by the check on the decoded
frames that still follows.
"""

from __future__ import annotations

import re
import subprocess

#: Seconds ffmpeg may take to read a header before the video is refused.
PROBE_TIMEOUT = 60.0

# "Stream #0:0[0x1](und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(progressive), 64x48, ..."
# sizes start with 1-9, so that codec tags such as 0x31637661 are not read as sizes
_VIDEO_STREAM = re.compile(r"Stream #\d+:\d+.*?: Video: (.*)")
_SIZE = re.compile(r"(?<![\w.])([1-9]\d*)x([1-9]\d*)(?![\w.])")


class ProbeTimeout(Exception):
    """ffmpeg did not finish reading the header within :data:`PROBE_TIMEOUT` seconds."""


def ffmpeg_exe() -> str | None:
    """The ffmpeg binary of imageio-ffmpeg, or None where it has none for this platform."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # noqa: BLE001 - no binary: the caller falls back to checking a decoded frame
        return None


def parse_stream_sizes(text: str) -> list[tuple[int, int]]:
    """(width, height) of every video stream in ffmpeg's stream listing ``text`` that shows a size."""
    sizes = []
    for line in text.splitlines():
        stream = _VIDEO_STREAM.search(line)
        if stream:
            size = _SIZE.search(stream.group(1))
            if size:
                sizes.append((int(size.group(1)), int(size.group(2))))
    return sizes


def header_frame_sizes(path: str, pass_fd: int | None = None, max_pixels: int | None = None) -> list[tuple[int, int]] | None:
    """(width, height) of every video stream the header of ``path`` declares, without decoding in
    this process; None when ffmpeg is unavailable or declares no size (unreadable file, size unknown).

    ``pass_fd``: a descriptor the child inherits (when ``path`` is ``/proc/self/fd/N``).
    ``max_pixels``: ffmpeg's decoder limit while it probes. Raises :class:`ProbeTimeout`.
    """
    exe = ffmpeg_exe()
    if exe is None:
        return None
    cmd = [exe, "-hide_banner", "-nostdin", "-loglevel", "info"]
    if max_pixels is not None:
        cmd += ["-max_pixels", str(max_pixels)]
    cmd += ["-i", path]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=PROBE_TIMEOUT, pass_fds=() if pass_fd is None else (pass_fd,))
    except subprocess.TimeoutExpired:
        raise ProbeTimeout(f"ffmpeg did not read the video's header within {PROBE_TIMEOUT:g} s") from None
    except OSError:  # the binary cannot run here
        return None
    sizes = parse_stream_sizes(done.stderr.decode("utf-8", "replace"))
    return sizes or None


__all__ = ["PROBE_TIMEOUT", "ProbeTimeout", "ffmpeg_exe", "header_frame_sizes", "parse_stream_sizes"]
