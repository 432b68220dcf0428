#!/usr/bin/env bash
# Set up a fresh machine for capreward: the virtual environment .venv with the package and the `demo`
# extra (everything `capreward demo` runs), and with --test the `test` extra (every extra plus the test
# tools), OpenRLHF and veRL (--no-deps, for the contract tests) and Debian's chromium (the HTML report
# is tested in a real headless browser).
# torch stays the release this machine image carries on disk: every pip step runs with the constraints
# file scripts/constraints.txt (torch==2.14.1, torchvision==0.29.1), so nothing large is downloaded.
# --report FILE: resolve only, install nothing, and write pip's installation report (JSON) to FILE.
# Prints one line per step (pip itself stays quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="[demo]"
report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --test) extras="[test]" ;;
    --report) report="${2:?--report needs a file}"; shift ;;
    *) echo "usage: bash scripts/bootstrap.sh [--test] [--report FILE]" >&2; exit 2 ;;
  esac
  shift
done
step() { echo "[bootstrap] $*"; }
constraints="scripts/constraints.txt"
if [ "$extras" = "[test]" ] && [ -z "$report" ]; then
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    step "installing Debian's chromium (for the HTML report test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
fi
step "creating the virtual environment .venv ($(python3 --version))"
python3 -m venv .venv
log="$(mktemp)"
if [ -n "$report" ]; then
  step "resolving capreward${extras} under $constraints (nothing is installed); report in $report"
  mode=(--dry-run --ignore-installed --report "$report")
else
  step "installing capreward${extras} with torch and torchvision from $constraints (a few minutes)"
  mode=()
fi
if ! .venv/bin/pip install -q "${mode[@]}" -c "$constraints" -e ".${extras}" >"$log" 2>&1; then
  cat "$log" >&2
  step "pip install failed (its output is above)"
  exit 1
fi
grep -v "is ignored: it is neither" "$log" || true
rm -f "$log"
if [ -n "$report" ]; then
  step "done: resolved, nothing installed"
  exit 0
fi
if [ "$extras" = "[test]" ]; then
  # the frameworks whose own code the contract tests run, without their requirements (vLLM, DeepSpeed,
  # flash-attn, pinned transformers): the test extra has what the imported modules need
  step "installing OpenRLHF ${OPENRLHF_VERSION:=0.11.2} and veRL ${VERL_VERSION:=0.9.1} without their dependencies (contract tests)"
  log="$(mktemp)"
  if ! .venv/bin/pip install -q --no-deps -c "$constraints" "openrlhf==$OPENRLHF_VERSION" "verl==$VERL_VERSION" >"$log" 2>&1; then
    cat "$log" >&2
    step "pip install failed (its output is above)"
    exit 1
  fi
  rm -f "$log"
fi
test -x .venv/bin/capreward
step "done: .venv/bin/capreward is installed"
