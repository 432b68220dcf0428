"""Render scored rows as one self-contained HTML page (no external assets, no server).

The page opens with a summary: per headline metric (a numeric field that is no sub-score, such as ``emscore``,
``clip_s``, ``fleur``) the number of scores, mean, median, population standard deviation, minimum,
maximum and the number of rows whose ``errors`` name the metric, and an inline SVG histogram of its
scores. Controls sort the samples by any headline metric (rows without that score last) and show only
the rows with an error or with flagged tokens; the view is kept in the address's fragment
(``#sort=emscore&dir=desc&filter=errors``), so it can be bookmarked and is applied on load.

Each sample shows its image or sampled video frames (embedded as base64 JPEG thumbnails), its
caption, its scores, and, when the row carries an EMScore ``alignment``, every token coloured by its
best visual similarity with the index of its best frame (the EMScore paper's Figure 7). Tokens listed
flagged by a metric (the sub-score its spec names :attr:`~capreward.registry.MetricSpec.flagged_tokens`,
``hallucination/flagged``) are marked. Each sample lists its references, and its sub-scores (fields
``<metric>/<part>``, e.g. the 21 components of EMScore; ``<metric>.<part>`` in files written before
capreward named every sub-score with ``/``) are folded under the headline score. A row with the claim
reward's verdicts (``claims/claims``) shows each claim's span in the caption, verified or not
(:mod:`capreward.report.claims_view`); a claim not verified flags the row.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable

import numpy as np
from PIL import Image

from .. import registry
from ..media import MediaError, load_image, load_video
from ..names import SEP, sub_score
from .claims_view import STYLE as CLAIMS_STYLE, claims_section, has_unverified

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
.refs { color: #444; margin: 0.3em 0; }
.refs li { margin: 0; }
.headline { font-family: monospace; margin: 0.2em 0; }
.headline summary { cursor: pointer; }
.headline .value { font-weight: bold; }
table.summary { border-collapse: collapse; margin-bottom: 1em; }
table.summary th, table.summary td { border: 1px solid #bbb; padding: 3px 8px; text-align: right; font-family: monospace; }
table.summary th:first-child, table.summary td:first-child { text-align: left; }
table.settings td { padding: 1px 8px; font-family: monospace; }
.histograms { display: flex; flex-wrap: wrap; gap: 1.2em; margin-bottom: 1em; }
.histograms figure { margin: 0; }
.histograms figcaption { font-size: 0.85em; text-align: center; }
.histograms rect.bar { fill: #3b6ea5; }
.controls { margin: 1em 0; padding: 0.5em; background: #f3f3f3; border-radius: 6px; }
.controls label { margin-right: 1.2em; }
""" % THUMB_HEIGHT  # noqa: UP031 (CSS braces: no f-string)

HIST_BINS = 10
HIST_WIDTH, HIST_HEIGHT = 240, 90

SCRIPT = """
(function () {
  var box = document.getElementById('samples');
  var sortKey = document.getElementById('sort-key'), sortDir = document.getElementById('sort-dir');
  var filter = document.getElementById('filter'), shown = document.getElementById('shown');
  function value(el, key) {
    if (key === 'order') return +el.dataset.order;
    var v = JSON.parse(el.dataset.scores)[key];
    return typeof v === 'number' ? v : null;
  }
  function apply() {
    // manifest order is one order: the direction (highest/lowest first) is for the metrics
    var key = sortKey.value, sign = key === 'order' || sortDir.value === 'asc' ? 1 : -1, only = filter.value;
    var items = Array.prototype.slice.call(box.children);
    items.sort(function (a, b) {
      var x = value(a, key), y = value(b, key), tie = a.dataset.order - b.dataset.order;
      if (x === null || y === null) return x === y ? tie : (x === null ? 1 : -1);
      return (x - y) * sign || tie;
    });
    var visible = 0;
    items.forEach(function (el) {
      box.appendChild(el);
      el.hidden = (only === 'errors' && el.dataset.error !== '1') || (only === 'flagged' && el.dataset.flagged !== '1');
      if (!el.hidden) visible++;
    });
    shown.textContent = visible;
    try { history.replaceState(null, '', '#sort=' + key + '&dir=' + sortDir.value + '&filter=' + only); } catch (e) {}
  }
  [sortKey, sortDir, filter].forEach(function (el) { el.addEventListener('change', apply); });
  var state = {};
  location.hash.replace(/^#/, '').split('&').forEach(function (kv) {
    var p = kv.split('='); if (p.length === 2) state[p[0]] = decodeURIComponent(p[1]);
  });
  [[sortKey, state.sort], [sortDir, state.dir], [filter, state.filter]].forEach(function (pair) {
    var sel = pair[0], want = pair[1];
    if (want !== undefined && Array.prototype.some.call(sel.options, function (o) { return o.value === want; })) {
      sel.value = want;
      sel.dispatchEvent(new Event('change'));
    }
  });
  apply();
})();
"""


@dataclass
class MetricSummary:
    """Statistics of one headline metric over the rows (None when no row has a score)."""

    name: str
    n: int
    errors: int
    mean: float | None
    median: float | None
    std: float | None  # population standard deviation
    min: float | None
    max: float | None


def is_score(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_sub_score(key: str) -> bool:
    """Whether a field is a sub-score: ``<metric>/<part>``, or ``<metric>.<part>`` (files written before
    capreward named every sub-score with ``/``)."""
    return SEP in key or "." in key


def headline_metrics(rows: list[dict]) -> list[str]:
    """The headline metrics of the rows in order of first appearance: numeric fields that are no
    sub-score (see :func:`is_sub_score`), and metrics named only in ``errors``."""
    names: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if not is_sub_score(key) and key != "id" and (is_score(value) or (value is None and key in (row.get("errors") or {}))):
                names.setdefault(key)
        for key in row.get("errors") or {}:
            if not is_sub_score(key):
                names.setdefault(key)
    return list(names)


def summarise(rows: list[dict], metric: str) -> MetricSummary:
    """Count, mean, median, population std, min, max of ``metric`` over the rows with a finite score,
    and the number of rows whose ``errors`` name it."""
    values = [float(r[metric]) for r in rows if is_score(r.get(metric))]
    errors = sum(1 for r in rows if metric in (r.get("errors") or {}))
    if not values:
        return MetricSummary(metric, 0, errors, None, None, None, None, None)
    return MetricSummary(metric, len(values), errors, statistics.fmean(values), statistics.median(values),
                         statistics.pstdev(values), min(values), max(values))


def histogram_counts(values: list[float], bins: int = HIST_BINS) -> tuple[list[int], float, float]:
    """Counts of ``values`` in ``bins`` equal-width bins over [min, max] (the last bin closed), with the
    range; one bin when every value is the same."""
    lo, hi = min(values), max(values)
    if hi <= lo:
        return [len(values)], lo, hi
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
    return counts, lo, hi


def histogram_svg(metric: str, values: list[float]) -> str:
    """An inline SVG histogram of ``values`` with the range written under it."""
    counts, lo, hi = histogram_counts(values)
    top = max(counts)
    plot_h = HIST_HEIGHT - 18
    width = HIST_WIDTH / len(counts)
    bars = []
    for k, c in enumerate(counts):
        h = 0 if top == 0 else plot_h * c / top
        a = lo + (hi - lo) * k / len(counts)
        b = lo + (hi - lo) * (k + 1) / len(counts)
        bars.append(f'<rect class="bar" data-count="{c}" x="{k * width + 1:.1f}" y="{plot_h - h:.1f}" '
                    f'width="{max(width - 2, 1):.1f}" height="{h:.1f}"><title>[{a:.4g}, {b:.4g}]: {c}</title></rect>')
    axis = (f'<line x1="0" y1="{plot_h}" x2="{HIST_WIDTH}" y2="{plot_h}" stroke="#555"/>'
            f'<text x="0" y="{HIST_HEIGHT - 3}" font-size="11">{lo:.4g}</text>'
            f'<text x="{HIST_WIDTH}" y="{HIST_HEIGHT - 3}" font-size="11" text-anchor="end">{hi:.4g}</text>')
    return (f'<figure class="histogram" data-metric="{html.escape(metric)}"><svg '
            f'width="{HIST_WIDTH}" height="{HIST_HEIGHT}" role="img" aria-label="histogram of {html.escape(metric)}">'
            f'{"".join(bars)}{axis}</svg><figcaption>{html.escape(metric)} (n={len(values)})</figcaption></figure>')


def _cell(stat: str, value: float | int | None) -> str:
    if value is None:
        return f'<td data-stat="{stat}">n/a</td>'
    text = str(value) if isinstance(value, int) else f"{value:.4f}"
    return f'<td data-stat="{stat}" data-value="{value!r}">{text}</td>'


def summary_section(rows: list[dict], metrics: list[str]) -> str:
    """The summary table (one row per metric) and the histograms."""
    head = "".join(f"<th>{h}</th>" for h in ("metric", "n", "mean", "median", "std", "min", "max", "errors"))
    body = []
    figures = []
    for m in metrics:
        s = summarise(rows, m)
        cells = [_cell("n", s.n), _cell("mean", s.mean), _cell("median", s.median), _cell("std", s.std),
                 _cell("min", s.min), _cell("max", s.max), _cell("errors", s.errors)]
        body.append(f'<tr data-metric="{html.escape(m)}"><td>{html.escape(m)}</td>{"".join(cells)}</tr>')
        values = [float(r[m]) for r in rows if is_score(r.get(m))]
        if values:
            figures.append(histogram_svg(m, values))
    return (f'<section id="summary"><h2>Summary</h2><table class="summary"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>'
            f'<div class="histograms">{"".join(figures)}</div>'
            f'<p class="note">std: population standard deviation; errors: rows whose score could not be '
            f'computed (reason on the sample).</p></section>')


def controls_section(metrics: list[str], n_rows: int) -> str:
    options = "".join(f'<option value="{html.escape(m)}">{html.escape(m)}</option>' for m in metrics)
    return (
        '<div class="controls">'
        f'<label>sort by <select id="sort-key"><option value="order">manifest order</option>{options}</select></label>'
        '<label>order <select id="sort-dir"><option value="desc">highest first</option>'
        '<option value="asc">lowest first</option></select></label>'
        '<label>show <select id="filter"><option value="all">all samples</option>'
        '<option value="errors">samples with errors</option>'
        '<option value="flagged">samples with flagged tokens or claims</option></select></label>'
        f'<span><span id="shown">{n_rows}</span> of {n_rows} shown</span></div>'
    )



#: What each way of forming EMScore's F and RefCLIP-S means, for the page.
HARMONIC_MEANS = {
    "sign-safe": "sign-safe harmonic mean (2ab/(a+b) when both parts are positive, else the smaller part: "
                 "EMScore stays in [-1, 1] and ranks captions as the rewards do)",
    "released": "the papers' harmonic mean 2ab/(a+b) (it leaves [-1, 1] when the parts have opposite signs)",
}


def settings_section(settings: dict | None, metrics: list[str]) -> str:
    """What the rows were scored with: the settings ``capreward score`` recorded beside the results
    (``<out>.settings.json``), or a note that none was found; always which harmonic mean formed EMScore's F
    and RefCLIP-S when those metrics are shown."""
    from ..jobs.settings_file import FLAGS, SCORE, describe

    if settings is None:
        body = ("<p class=\"note\">No settings record beside the results (&lt;results&gt;.settings.json): how the "
                "rows were scored is not known.</p>")
        return f'<section id="settings"><h2>Scored with</h2>{body}</section>'
    settings = dict(settings)
    uses_mean = {"emscore", "clip_s", "pac_s"} & set(settings.get("metrics") or metrics)
    if uses_mean and "harmonic_mean" not in settings:  # recorded before --harmonic-mean existed
        settings["harmonic_mean"] = SCORE.legacy["harmonic_mean"]
    cells = []
    for key, value in settings.items():
        text = describe(value)
        if key == "harmonic_mean":
            text = f"{text}: {HARMONIC_MEANS.get(value, '')}"
        cells.append(f'<tr data-setting="{html.escape(key)}"><td>{html.escape(FLAGS.get(key, key))}</td>'
                     f"<td>{html.escape(text)}</td></tr>")
    return (f'<section id="settings"><h2>Scored with</h2><table class="settings">{"".join(cells)}</table>'
            "</section>")


def thumbnail_uri(image: Image.Image) -> str:
    """A data URI of a JPEG thumbnail ``THUMB_HEIGHT`` pixels high."""
    scale = THUMB_HEIGHT / max(1, image.height)
    thumb = image.resize((max(1, round(image.width * scale)), THUMB_HEIGHT), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    thumb.save(buf, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def visual_frames(row: dict, frames: int | None) -> list[Image.Image]:
    """The row's image (each image of a row with several), or its sampled video frames (the same
    sampling as the scorer's). MediaError for the first that cannot be read."""
    images, errors = visual_parts(row, frames)
    if errors:
        raise errors[0]
    return images


def visual_parts(row: dict, frames: int | None) -> tuple[list[Image.Image], list[MediaError]]:
    """The row's images or sampled video frames that can be read, and the errors of those that cannot
    (a row with several images shows the others)."""
    if row.get("video"):
        try:
            return [Image.fromarray(f) for f in load_video(row["video"], frames=frames)], []
        except MediaError as exc:
            return [], [exc]
    paths = row.get("image") or []
    images, errors = [], []
    for path in [paths] if isinstance(paths, str) else paths:
        try:
            images.append(load_image(path))
        except MediaError as exc:
            errors.append(exc)
    return images, errors


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


def score_table(row: dict, metrics: list[str]) -> str:
    """Each headline score, with its sub-scores (``<metric>/<part>`` fields) and, for a row with several
    images, each image's value (``<metric>/per_image``) folded under it in a ``<details>``; numeric fields
    outside any headline metric are listed after."""
    parts = []
    claimed: set[str] = set()
    for m in metrics:
        if m not in row and m not in (row.get("errors") or {}):
            continue
        value = row.get(m)
        shown = f"{value:.4f}" if is_score(value) else "n/a"
        subs = [(k, v) for k, v in row.items() if k.startswith((m + SEP, m + ".")) and is_score(v)]
        claimed.update(k for k, _ in subs)
        label = f'{html.escape(m)} <span class="value">{shown}</span>'
        per_image = row.get(sub_score(m, "per_image"))
        images = [(k, e.get(m)) for k, e in enumerate(per_image) if isinstance(e, dict)] if isinstance(per_image, list) else []
        if subs or images:
            body = "".join(f'<tr data-image="{k}"><td>image {k}</td><td>{f"{v:.4f}" if is_score(v) else "n/a"}</td></tr>'
                           for k, v in images)
            body += "".join(f"<tr><td>{html.escape(k[len(m) + 1:])}</td><td>{v:.4f}</td></tr>" for k, v in subs)
            count = f"{len(images)} images" + (", " if subs else "") if images else ""
            count += f"{len(subs)} sub-scores" if subs else ""
            parts.append(f'<details class="headline" data-metric="{html.escape(m)}"><summary>{label} '
                         f'({count})</summary><table class="scores">{body}</table></details>')
        else:
            parts.append(f'<div class="headline" data-metric="{html.escape(m)}">{label}</div>')
    others = [(k, v) for k, v in row.items() if is_score(v) and k not in claimed and k not in metrics and k != "id"]
    if others:
        body = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.4f}</td></tr>" for k, v in others)
        parts.append(f'<table class="scores">{body}</table>')
    return "".join(parts)


def flagging_specs() -> list:
    """The specs of the metrics that flag caption tokens (:attr:`~capreward.registry.MetricSpec.flagged_tokens`)."""
    return [spec for spec in registry.specs() if spec.flagged_tokens]


def flagged_positions(row: dict) -> set:
    """The positions of ``row``'s caption tokens that a metric flags (the fields its spec names, as
    ``<metric>/<sub-score>`` or, in files from before ``/``, ``<metric>.<sub-score>``)."""
    out: set = set()
    for spec in flagging_specs():
        out.update(row.get(sub_score(spec.name, spec.flagged_tokens)) or row.get(f"{spec.name}.{spec.flagged_tokens}") or [])
    return out


def sample_section(row: dict, order: int, metrics: list[str], frames: int | None, lo: float, hi: float) -> str:
    scores = {m: row[m] for m in metrics if is_score(row.get(m))}
    has_error = bool(row.get("errors"))
    flagged = flagged_positions(row)
    rid = html.escape(str(row.get("id", "")))
    parts = [f'<div class="sample" id="sample-{rid}" data-id="{rid}" data-order="{order}" '
             f'data-error="{int(has_error)}" data-flagged="{int(bool(flagged) or has_unverified(row))}" '
             f"data-scores='{html.escape(json.dumps(scores), quote=True)}'>"]
    parts.append(f'<div class="id">{rid}</div>')
    images, problems = visual_parts(row, frames)
    for exc in problems:
        parts.append(f'<div class="error">cannot show the visual: {html.escape(str(exc))}</div>')
    alignment = row.get("alignment")
    best = set(alignment["best_frame"]) if alignment else set()
    parts.append('<div class="frames">')
    for k, im in enumerate(images):
        cls = "frame best" if k in best else "frame"
        parts.append(f'<img class="{cls}" data-frame="{k}" alt="frame {k}" src="{thumbnail_uri(im)}">')
    parts.append("</div>")
    if alignment:
        parts.append(f'<div class="caption">{token_spans(alignment, flagged, lo, hi)}</div>')
    claims = claims_section(row)  # the claim reward's verdicts: the caption with each claim's span marked
    if not alignment and not claims:
        parts.append(f'<div class="caption">{html.escape(row.get("caption", ""))}</div>')
    parts.append(claims)
    references = row.get("references") or []
    if references:
        items = "".join(f"<li>{html.escape(str(r))}</li>" for r in references)
        parts.append(f'<div class="refs">references:<ul class="references">{items}</ul></div>')
    if row.get("errors"):
        for metric, reason in row["errors"].items():
            parts.append(f'<div class="error">{html.escape(metric)}: {html.escape(str(reason))}</div>')
    parts.append(score_table(row, metrics))
    parts.append("</div>")
    return "".join(parts)


def render_report(rows: Iterable[dict], out: str | Path, frames: int | None = 10, title: str = "capreward report",
                  progress: bool = False, settings: dict | None = None) -> Path:
    """Write the HTML page of a results file's rows (summary, histograms, sort and filter controls, one
    section per row in the given order).

    Args:
        rows: the results rows (``capreward score`` output).
        out: the HTML file to write (a new path or a regular file; a symbolic link, a FIFO, a device or a
            directory is refused with :class:`~capreward.jobs.safe_files.UnsafeOutput`, nothing written).
        frames: frames shown per video (None: every frame).
        title: the page's title.
        progress: a bar on stderr while the samples' frames are decoded.
        settings: the settings the rows were scored with (``capreward score``'s record beside the results,
            ``<out>.settings.json``: its ``settings``), shown on the page, which harmonic mean formed
            EMScore's F and RefCLIP-S among them; None: the page says they are not known.

    Returns:
        The path written.

    Raises:
        UnsafeOutput: ``out`` is a link, a FIFO, a device or a directory."""
    from tqdm import tqdm

    from ..jobs.safe_files import check_job_file

    check_job_file(out, "--out")  # before the visuals are decoded
    rows = list(rows)
    metrics = headline_metrics(rows)
    sims = [s for r in rows if r.get("alignment") for s in r["alignment"]["similarity"]]
    lo, hi = (min(sims), max(sims)) if sims else (0.0, 1.0)
    samples = [sample_section(r, k, metrics, frames, lo, hi)
               for k, r in enumerate(tqdm(rows, desc="report", unit="row", file=sys.stderr, disable=not progress))]
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}{CLAIMS_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"{summary_section(rows, metrics)}{settings_section(settings, metrics)}"
        f"<h2>Samples</h2><p>{len(rows)} samples. Token colour: best visual similarity (red low, green high); "
        f"superscript: index of the best frame; outlined: flagged by the "
        f"{html.escape(' or '.join(spec.title.lower() for spec in flagging_specs()) or 'metrics')}; claims: green "
        f"verified, red not verified by the claim judge.</p>"
        f"{controls_section(metrics, len(rows))}"
        f'<div id="samples">{"".join(samples)}</div>'
        f"<script>{SCRIPT}</script></body></html>"
    )
    out = Path(out)
    from ..jobs.safe_files import open_job_stream

    # never through a link planted at ``out``, never into a FIFO or a device (UnsafeOutput naming it)
    with open_job_stream(out, "wb", "--out") as f:
        f.write(page.encode("utf-8", "backslashreplace"))  # a lone surrogate in a row shows as \udXXX
    return out
