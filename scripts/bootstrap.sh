#!/usr/bin/env bash
# Set up a fresh machine for capreward: the virtual environment with the package, and with --test the
# test extras, OpenRLHF and veRL (--no-deps, for the contract tests) and Debian's chromium (the HTML
# report is tested in a real headless browser).
# torch is pinned to the release this machine image carries on disk, so nothing large is downloaded.
# Prints one line per step (pip itself stays quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
step() { echo "[bootstrap] $*"; }
if [ "${1:-}" = "--test" ]; then
  extras="[test]"
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    step "installing Debian's chromium (for the HTML report test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
fi
step "creating the virtual environment .venv ($(python3 --version))"
python3 -m venv .venv
step "installing torch 2.14.1, torchvision and capreward${extras:+ with the test extras} (a few minutes)"
log="$(mktemp)"
if ! .venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1 -e ".${extras}" >"$log" 2>&1; then
  cat "$log" >&2
  step "pip install failed (its output is above)"
  exit 1
fi
grep -v "is ignored: it is neither" "$log" || true
rm -f "$log"
if [ -n "$extras" ]; then
  # the frameworks whose own code the contract tests run, without their requirements (vLLM, DeepSpeed,
  # flash-attn, pinned transformers): the test extra has what the imported modules need
  step "installing OpenRLHF ${OPENRLHF_VERSION:=0.11.2} and veRL ${VERL_VERSION:=0.9.1} without their dependencies (contract tests)"
  log="$(mktemp)"
  if ! .venv/bin/pip install -q --no-deps "openrlhf==$OPENRLHF_VERSION" "verl==$VERL_VERSION" >"$log" 2>&1; then
    cat "$log" >&2
    step "pip install failed (its output is above)"
    exit 1
  fi
  rm -f "$log"
fi
test -x .venv/bin/capreward
step "done: .venv/bin/capreward is installed"
