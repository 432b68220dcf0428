#!/usr/bin/env bash
# Fill .whl/ (git-ignored through .git/info/exclude) with the wheels the GPU machine's image lacks, for
# benchmarks/gpu_all.sh to install there without the network (benchmarks/README.md, "One command for a GPU").
# The device image (Python 3.12, torch 2.11, transformers 5.17, torchmetrics, peft, accelerate, timm, regex,
# pyarrow, pandas, xxhash, fsspec ...) lacks: open_clip_torch and ftfy (+ wcwidth) for every CLIP step, and
# trl, datasets (+ dill, multiprocess) for the GRPO step. No video decoder travels: no step decodes files.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${1:-.whl}
mkdir -p "$DEST"
# .gitignore ignores .whl/; another folder is added to the checkout's info/exclude so that it travels only
# when carried
if git rev-parse --git-dir >/dev/null 2>&1 && ! git check-ignore -q "$DEST"; then
  echo "/$DEST/" >> "$(git rev-parse --git-path info/exclude)"
fi
WHEELS=(
  open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${WHEELS[@]}"
ls -la "$DEST"
du -sh "$DEST"
