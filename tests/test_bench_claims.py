"""benchmarks/bench_claims.py measures what it says: the batched claim reading and the one-request-per-claim
baseline give the same probabilities, the baseline runs one prefill (and one image encoding) per claim, the
batched path one per chunk of rows. No timing is asserted."""

from __future__ import annotations

import argparse
import importlib.util

from conftest import REPO

_spec = importlib.util.spec_from_file_location("bench_claims", REPO / "benchmarks" / "bench_claims.py")
bench_claims = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_claims)


def test_both_paths_agree_and_count_their_prefills(monkeypatch):
    from capreward.judges.local import LocalJudge

    calls = {"start": 0, "image_features": 0}
    for name in calls:
        original = getattr(LocalJudge, name)

        def counted(self, *a, _original=original, _name=name, **k):
            calls[_name] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(LocalJudge, name, counted)
    out = bench_claims.run(argparse.Namespace(arch="tiny", captions=3, batch_size=16, threads=1, repeats=1))
    assert out["max_abs_p_yes_difference"] == 0.0
    n = out["claims"]
    assert 24 <= n <= 36 and out["prefills_batched"] == -(-n // 16)
    # warm-up (one caption of at most 12 claims: one chunk) + batched (ceil(n/16) chunks, the image's
    # features once) + per claim (n prefills, n image encodings)
    assert calls["start"] == 1 + out["prefills_batched"] + n
    assert calls["image_features"] == 1 + 1 + n
