"""Which video files a decoder may open: self-contained containers identified from their first bytes.

FFmpeg (inside decord and PyAV) picks a demuxer by the file's content, not its name, and some demuxers
open other files or URLs themselves: an HLS playlist (``#EXTM3U``) opens its segments, an ffconcat list
its entries, DASH/SDP/IMF descriptions their streams. A 180-byte playlist named ``innocent.mp4`` inside
a media root would make the decoder read a video outside the root. So before any decoder sees a
client- or manifest-named file, :func:`identify_container` reads its first bytes and accepts only the
containers of :data:`CONTAINERS`, which hold their own frames and reference nothing outside the file;
everything else (playlists, concat lists, text, unknown formats) is refused with the one text
:data:`NOT_A_CONTAINER`. The decoder is then told the format (PyAV opens it with that demuxer only, no
nested opens, no QuickTime data references), so it cannot probe its way to another one.

The allow-list is kept to containers whose streams are declared in the header, so that the header probe
(:mod:`capreward.media.probe`) bounds what the decoder may allocate before any frame is decoded.
"""

from __future__ import annotations

import os

#: Our name of each accepted container -> the FFmpeg demuxer that reads it.
CONTAINERS = {
    "mp4": "mov",  # MP4, MOV, M4V, 3GP: ISO base media / QuickTime
    "matroska": "matroska",  # MKV and WebM
    "avi": "avi",
}

#: The one refusal of every file that is not an accepted container (a playlist, a concat list, a text
#: file, an unknown or truncated header): it says what is accepted and names no other file.
NOT_A_CONTAINER = (
    "cannot decode video: not a self-contained video file (accepted containers: MP4/MOV, Matroska/WebM, AVI); "
    "playlists, concat lists and other formats are refused"
)

#: Bytes read to identify a file.
HEAD_BYTES = 64

# Top-level ISO-BMFF / QuickTime boxes a file may start with.
_MP4_FIRST_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot"}
_EBML_MAGIC = b"\x1a\x45\xdf\xa3"


def identify_container(head: bytes) -> str | None:
    """The container of a file whose first bytes are ``head`` (a key of :data:`CONTAINERS`), or None
    when it is not one of them."""
    if len(head) >= 8 and head[4:8] in _MP4_FIRST_BOXES:
        size = int.from_bytes(head[:4], "big")
        if size in (0, 1) or size >= 8:  # 0: to the end of the file; 1: a 64-bit size follows
            return "mp4"
    if head.startswith(_EBML_MAGIC):
        return "matroska"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    return None


def read_head(fd: int) -> bytes:
    """The first :data:`HEAD_BYTES` bytes of the file open at ``fd`` (read in place: the offset of the
    descriptor is not moved)."""
    if hasattr(os, "pread"):
        return os.pread(fd, HEAD_BYTES, 0)
    here = os.lseek(fd, 0, os.SEEK_CUR)  # Windows has no pread: read at 0, then put the offset back
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, HEAD_BYTES)
    finally:
        os.lseek(fd, here, os.SEEK_SET)


__all__ = ["CONTAINERS", "HEAD_BYTES", "NOT_A_CONTAINER", "identify_container", "read_head"]
