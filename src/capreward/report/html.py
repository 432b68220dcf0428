"""Render scored rows as one self-contained HTML page.

Each sample shows its image or sampled video frames (embedded as base64 JPEG thumbnails), its
caption, its scores, and, when the row carries an EMScore ``alignment``, every token coloured by its
best visual similarity with the index of its best frame (the EMScore paper's Figure 7). Tokens listed
in ``hallucination.flagged`` are marked.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Iterable

import numpy as np
from PIL import Image

from ..media import MediaError, load_image, load_video

THUMB_HEIGHT = 96

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
.sample { border: 1px solid #ccc; border-radius: 6px; padding: 0.8em; margin-bottom: 1em; }
.frames img { height: %dpx; margin-right: 3px; border: 2px solid transparent; }
.frames img.best { border-color: #d33; }
.caption { font-size: 1.1em; margin: 0.5em 0; }
.token { display: inline-block; padding: 1px 3px; margin: 1px; border-radius: 3px; }
.token sup { color: #555; font-size: 0.7em; margin-left: 1px; }
.token.flagged { outline: 2px solid #d00; text-decoration: underline wavy #d00; }
.scores td { padding: 1px 8px; font-family: monospace; }
.error { color: #b00; }
""" % THUMB_HEIGHT


def thumbnail_uri(image: Image.Image) -> str:
    """A data URI of a JPEG thumbnail ``THUMB_HEIGHT`` pixels high."""
    scale = THUMB_HEIGHT / max(1, image.height)
    thumb = image.resize((max(1, round(image.width * scale)), THUMB_HEIGHT), Image.BICUBIC)
    buf = io.BytesIO()
    thumb.save(buf, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def visual_frames(row: dict, frames: int | None) -> list[Image.Image]:
    """The row's image, or its sampled video frames (the same sampling as the scorer's)."""
    if row.get("image"):
        return [load_image(row["image"])]
    if row.get("video"):
        return [Image.fromarray(f) for f in load_video(row["video"], frames=frames)]
    return []


def similarity_colour(s: float, lo: float, hi: float) -> str:
    """Background colour from red (low similarity) to green (high), relative to the page's range."""
    t = 0.5 if hi <= lo else (s - lo) / (hi - lo)
    t = float(np.clip(t, 0, 1))
    return f"hsl({round(120 * t)}, 70%, 80%)"


def token_spans(alignment: dict, flagged: set[int], lo: float, hi: float) -> str:
    spans = []
    for i, (tok, frame, sim) in enumerate(zip(alignment["tokens"], alignment["best_frame"], alignment["similarity"])):
        cls = "token flagged" if i in flagged else "token"
        spans.append(
            f'<span class="{cls}" data-frame="{frame}" data-index="{i}" title="similarity {sim:.3f}, best frame {frame}" '
            f'style="background:{similarity_colour(sim, lo, hi)}">{html.escape(tok)}<sup>{frame}</sup></span>'
        )
    return "".join(spans)


def score_table(row: dict) -> str:
    cells = [(k, v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.4f}</td></tr>" for k, v in cells)
    return f'<table class="scores">{body}</table>'


def sample_section(row: dict, frames: int | None, lo: float, hi: float) -> str:
    parts = [f'<div class="sample" id="sample-{html.escape(str(row.get("id", "")))}">']
    parts.append(f'<div class="id">{html.escape(str(row.get("id", "")))}</div>')
    try:
        images = visual_frames(row, frames)
    except MediaError as exc:
        images = []
        parts.append(f'<div class="error">cannot show the visual: {html.escape(str(exc))}</div>')
    alignment = row.get("alignment")
    best = set(alignment["best_frame"]) if alignment else set()
    parts.append('<div class="frames">')
    for k, im in enumerate(images):
        cls = "frame best" if k in best else "frame"
        parts.append(f'<img class="{cls}" data-frame="{k}" alt="frame {k}" src="{thumbnail_uri(im)}">')
    parts.append("</div>")
    if alignment:
        flagged = set(row.get("hallucination.flagged") or [])
        parts.append(f'<div class="caption">{token_spans(alignment, flagged, lo, hi)}</div>')
    else:
        parts.append(f'<div class="caption">{html.escape(row.get("caption", ""))}</div>')
    if row.get("errors"):
        for metric, reason in row["errors"].items():
            parts.append(f'<div class="error">{html.escape(metric)}: {html.escape(str(reason))}</div>')
    parts.append(score_table(row))
    parts.append("</div>")
    return "".join(parts)


def render_report(rows: Iterable[dict], out: str | Path, frames: int | None = 10, title: str = "capreward report") -> Path:
    """Write the HTML page for ``rows`` to ``out``; returns its path."""
    rows = list(rows)
    sims = [s for r in rows if r.get("alignment") for s in r["alignment"]["similarity"]]
    lo, hi = (min(sims), max(sims)) if sims else (0.0, 1.0)
    body = "".join(sample_section(r, frames, lo, hi) for r in rows)
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p>{len(rows)} samples. Token colour: best visual similarity (red low, green high); "
        f"superscript: index of the best frame; outlined: flagged by the hallucination penalty.</p>"
        f"{body}</body></html>"
    )
    out = Path(out)
    out.write_text(page, encoding="utf-8")
    return out
