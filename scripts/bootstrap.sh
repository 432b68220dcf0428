#!/usr/bin/env bash
# Set up a fresh machine for capreward: the virtual environment with the package, and with --test the
# test extras plus Debian's chromium (the HTML report is tested in a real headless browser).
# torch is pinned to the release this machine image carries on disk, so nothing large is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
if [ "${1:-}" = "--test" ]; then
  extras="[test]"
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
fi
python3 -m venv .venv
.venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1 -e ".${extras}" 2>&1 | grep -v "is ignored: it is neither" || true
test -x .venv/bin/capreward
