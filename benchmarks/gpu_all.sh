#!/usr/bin/env bash
# One command for every GPU figure (benchmarks/README.md, "One command for a GPU"):
#   bash benchmarks/gpu_all.sh                           # on a GPU machine; results in $OUT (default ./gpu_out)
#   CAPREWARD_BENCH_DEVICE=cpu bash benchmarks/gpu_all.sh   # the same steps at small sizes on the CPU
# Installs the carried wheels (.whl/, filled by benchmarks/gpu_prepare.sh) without the network when the
# machine lacks what they hold, then runs benchmarks/gpu_all.py with src/ on the path.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
SITE=${CAPREWARD_BENCH_SITE:-/tmp/capreward-site}
# found, not imported (importing them is seconds of CPU): the wheels are for a machine that lacks them
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(n) is None for n in ('open_clip', 'ftfy', 'trl', 'datasets')))" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    echo "installing the carried wheels into $SITE: $(ls .whl | tr '\n' ' ')"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || echo "pip install of the carried wheels failed; the steps that need them will say so"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "open_clip/ftfy/trl/datasets missing and no .whl/ folder: run benchmarks/gpu_prepare.sh and carry .whl"
  fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
"$PY" -u benchmarks/gpu_all.py
