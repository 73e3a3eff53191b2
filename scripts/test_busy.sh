#!/usr/bin/env bash
# The test suite on a busy machine: runs scripts/test.sh ROUNDS times in a row (default 3) while
# BURNERS processes (default: one per core) spin the CPU beside it, and says how long each round
# took. A test that waits on a fixed sleep or a tight deadline fails here first.
#   scripts/test_busy.sh [ROUNDS] [-- pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
burners="${BURNERS:-$(nproc)}"

pids=()
stop_burners() { [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; }
trap stop_burners EXIT
for _ in $(seq "$burners"); do
    python3 -c 'while True: pass' &
    pids+=($!)
done
echo "test_busy: $burners CPU burner(s) running beside the suite" >&2

for round in $(seq "$rounds"); do
    started=$(date +%s)
    if bash scripts/test.sh "$@"; then
        echo "test_busy: round $round of $rounds passed in $(( $(date +%s) - started )) s" >&2
    else
        echo "test_busy: round $round of $rounds FAILED after $(( $(date +%s) - started )) s" >&2
        exit 1
    fi
done
