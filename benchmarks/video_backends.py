"""decord against PyAV on the sample clips: pixel agreement, EMScore agreement and decode time.

For each clip (default: the sample clips in ``../shared/data/videos``) and each sampling (10 frames, as
EMScore's VATEX-EVAL protocol, and every frame) it decodes with both backends through
``capreward.media.load_video(..., backend=...)`` and prints the frame count each saw, the largest and
the mean absolute pixel difference, and the wall time of each (the probe included). Then EMScore of
two captions per clip, on the colour-trained tiny CLIP of ``capreward.testing`` (or ``--clip-model``),
with each backend: the largest difference of the full F, P, R and coarse scores.

    .venv/bin/python benchmarks/video_backends.py [--videos DIR] [--clip-model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

DEFAULT_VIDEOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "videos"


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--videos", type=Path, default=DEFAULT_VIDEOS, help="folder of .mp4 clips")
    p.add_argument("--clip-model", default=None, help="CLIP for the EMScore comparison (default: the colour-trained tiny CLIP)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args()

    from capreward.media import load_video
    from capreward.media.backends import decord_available

    if not decord_available():
        raise SystemExit("decord is not installed here: there is nothing to compare PyAV with")
    clips = sorted(args.videos.glob("*.mp4"))
    if not clips:
        raise SystemExit(f"no .mp4 clips in {args.videos}")
    rows = []
    for clip in clips:
        for frames in (10, None):
            load_video(str(clip), frames=1, backend="pyav")  # warm the file cache and both libraries
            load_video(str(clip), frames=1, backend="decord")
            a, t_decord = timed(lambda: load_video(str(clip), frames=frames, backend="decord"))
            b, t_pyav = timed(lambda: load_video(str(clip), frames=frames, backend="pyav"))
            diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
            rows.append({"clip": clip.name, "frames": "all" if frames is None else frames, "shape": list(a.shape),
                         "same_shape": a.shape == b.shape, "max_diff": int(diff.max()), "mean_diff": float(diff.mean()),
                         "decord_s": round(t_decord, 3), "pyav_s": round(t_pyav, 3)})

    from capreward.media import video_backend
    from capreward.scorers.emscore import EMScore

    model = args.clip_model
    if model is None:
        from capreward.testing.trained_clip import trained_clip_path

        model = str(trained_clip_path())
    captions = ["a red image.", "a person is doing something outdoors."]
    scores = {}
    for backend in ("decord", "pyav"):
        em = EMScore(model=model)  # a fresh scorer: no cached frame embeddings shared between backends
        with video_backend(backend):
            res = em.score(captions * len(clips), videos=[str(c) for c in clips for _ in captions])
        scores[backend] = {"F": res.score.numpy(), "P": res.video.full_p.numpy(), "R": res.video.full_r.numpy(),
                           "coarse": res.video.coarse.numpy()}
    emscore_diff = {k: float(np.abs(scores["decord"][k] - scores["pyav"][k]).max()) for k in scores["decord"]}

    if args.json:
        print(json.dumps({"decode": rows, "emscore_max_abs_diff": emscore_diff}, indent=1))
        return
    print(f"{'clip':42} {'frames':>6} {'shape':>20} {'max |diff|':>10} {'mean |diff|':>11} {'decord s':>9} {'pyav s':>7}")
    for r in rows:
        print(f"{r['clip']:42} {str(r['frames']):>6} {str(tuple(r['shape'])):>20} {r['max_diff']:>10} "
              f"{r['mean_diff']:>11.4f} {r['decord_s']:>9.3f} {r['pyav_s']:>7.3f}")
    print("EMScore, decord vs PyAV, largest |difference| over "
          f"{len(clips)} clips x {len(captions)} captions: " + ", ".join(f"{k} {v:.3g}" for k, v in emscore_diff.items()))


if __name__ == "__main__":
    main()
