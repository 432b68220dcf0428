#!/usr/bin/env bash
# Set up a fresh machine for capreward: the virtual environment with the package, and with --test the
# test extras plus Debian's chromium (the HTML report is tested in a real headless browser).
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
test -x .venv/bin/capreward
step "done: .venv/bin/capreward is installed"
