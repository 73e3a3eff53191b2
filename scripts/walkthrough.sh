#!/usr/bin/env bash
# A new user's first hour, scripted: a clean clone of this repository (in a private temp dir, as a
# user's home is), the README's quick start (scripts/demo.sh, which does its own set-up, and the tracking
# quick start, scripts/demo.sh --tracking) and then every command of its "Using it" section in order
# (scripts/walkthrough.py), each checked for its exit status and key output. `--here` walks this
# checkout instead of a clone (quicker, for development).
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
echo "== the tracking quick start: scripts/demo.sh --tracking"
scripts/demo.sh --tracking > demo-tracking.out 2>&1 ||
    { tail -40 demo-tracking.out; echo "FAIL scripts/demo.sh --tracking"; exit 1; }
# Its exit status says the counts agree with the clip; show them, and that it named what it left.
grep -E "^What |^  (line|zone) " demo-tracking.out
grep -qE "tracked\.mp4$" demo-tracking.out || { echo "FAIL: the tracking demo named no drawn video"; exit 1; }
echo "== using it"
exec .venv/bin/python scripts/walkthrough.py
