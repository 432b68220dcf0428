"""``python tiny_clip_file.py PATH``: the tiny CLIP (seed 0) saved as an OpenAI-format file at PATH, the CPU
dry run's stand-in for every CLIP shape. ``benchmarks/gpu_all.py`` runs it through ``CAPREWARD_BENCH_LAUNCH``
(the test zygote in tests/test_gpu_all.py), so that the runner itself never imports torch."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from capreward.testing import save_tiny_clip_openai

    save_tiny_clip_openai(sys.argv[1], seed=0)
