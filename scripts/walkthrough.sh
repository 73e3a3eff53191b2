#!/usr/bin/env bash
# A new user's first hour, scripted: a clean clone of this repository (in a private temp dir, as a
# user's home is), the README's quick start (scripts/demo.sh, which does its own set-up) and then every
# command of its "Using it" section in order (scripts/walkthrough.py), each checked for its exit status
# and key output. `--here` walks this checkout instead of a clone (quicker, for development).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--here" ]; then
    source scripts/setup.sh
    exec python scripts/walkthrough.py
fi
CLONE="$(mktemp -d)/edge-agent"   # mktemp -d: mode 0700, like /root
git clone -q "$PWD" "$CLONE"
cd "$CLONE"
echo "== quick start, in $CLONE: scripts/demo.sh"
scripts/demo.sh > demo.out 2>&1 || { tail -40 demo.out; echo "FAIL scripts/demo.sh"; exit 1; }
grep -E "results agree with the video" demo.out
echo "== using it"
exec .venv/bin/python scripts/walkthrough.py
