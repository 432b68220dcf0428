#!/usr/bin/env bash
# The version matrix: the integration tests (pytest -m "integration and not slow": the TRL trainers, the
# GRPO recipe, the Lightning / transformers callbacks, torchmetrics, and the OpenRLHF / veRL contract
# tests) on the OLDEST versions pyproject.toml allows (every dependency at its lower bound) and on the
# NEWEST (the highest each allows). Usage: bash scripts/version_matrix.sh [oldest] [newest] (default both).
#
# Each end is a virtual environment .matrix/<end> layered on the bootstrap's .venv (run
# `bash scripts/bootstrap.sh --test` first): it sees .venv's packages (torch 2.14.1 and torchvision
# 0.29.1 from the local wheels, pytest, OpenRLHF and veRL) and installs the end's versions of
# capreward's dependencies over them. torch stays 2.14.1 at both ends: any other torch is a download of
# gigabytes, so the torch lower bound is not what this run checks. Prints one line per end with the
# versions it ran and its result, and exits non-zero when an end fails. Used by tests/test_version_matrix.py.
set -euo pipefail
cd "$(dirname "$0")/.."
ends=("$@")
[ ${#ends[@]} -eq 0 ] && ends=(oldest newest)
[ -x .venv/bin/python ] || { echo "[matrix] .venv is missing: run bash scripts/bootstrap.sh --test first" >&2; exit 2; }
base_paths="$(.venv/bin/python -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))')"
shown="torch torchvision transformers trl accelerate peft lightning torchmetrics open_clip_torch numpy scipy pillow datasets openrlhf verl"
status=0
start_all=$(date +%s)
for end in "${ends[@]}"; do
  case "$end" in oldest|newest) ;; *) echo "[matrix] unknown end '$end' (oldest or newest)" >&2; exit 2 ;; esac
  start=$(date +%s)
  venv=".matrix/$end"
  echo "[matrix] $end: creating $venv over .venv"
  python3 -m venv --clear "$venv"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$base_paths" > "$site/zz_matrix_base.pth"
  reqs="$venv/requirements.txt"
  python3 scripts/matrix_requirements.py "$end" > "$reqs"
  printf 'torch==2.14.1\ntorchvision==0.29.1\n' > "$venv/constraints.txt"
  upgrade=()
  [ "$end" = newest ] && upgrade=(--upgrade --upgrade-strategy only-if-needed)
  log="$venv/pip.log"
  if ! "$venv/bin/pip" install -q "${upgrade[@]}" -c "$venv/constraints.txt" -r "$reqs" >"$log" 2>&1 \
     || ! "$venv/bin/pip" install -q --no-deps -e . >>"$log" 2>&1; then
    grep -v "is ignored: it is neither" "$log" >&2 || true
    echo "[matrix] $end: pip install failed (its output is above)"
    status=1
    continue
  fi
  versions="$("$venv/bin/python" - $shown <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for name in sys.argv[1:]:
    try:
        out.append(f"{name} {version(name)}")
    except PackageNotFoundError:
        out.append(f"{name} -")
print(", ".join(out))
EOF
)"
  echo "[matrix] $end: $versions"
  # started by the suite (tests/conftest.py): its tests wait for the suite's fixture trainers, whose judges
  # they read (one cache key for every transformers version), rather than train the same judges themselves
  for pid in ${CAPREWARD_MATRIX_AFTER_PIDS:-}; do
    waited=$(date +%s)
    while state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" && [ -n "$state" ] && [ "$state" != Z ] \
          && [ $(( $(date +%s) - waited )) -lt 3600 ]; do
      sleep 5
    done
    echo "[matrix] $end: waited $(( $(date +%s) - waited )) s for the fixture trainer $pid"
  done
  set +e
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=25 -m "integration and not slow" tests > "$venv/pytest.log" 2>&1
  rc=$?
  set -e
  tail -n 25 "$venv/pytest.log" | grep -v "^\s*$" | sed "s/^/[matrix] $end | /" | tail -n 12
  result="$(tail -n 1 "$venv/pytest.log")"
  if [ $rc -ne 0 ]; then status=1; verdict=FAILED; else verdict=passed; fi
  echo "[matrix] $end: $verdict in $(( $(date +%s) - start )) s ($result)"
done
echo "[matrix] total $(( $(date +%s) - start_all )) s"
exit $status
