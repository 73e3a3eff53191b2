#!/usr/bin/env bash
# Runs every test plus ruff and mypy (CI runs this). Does its own set-up (see scripts/setup.sh).
#   scripts/test.sh --quick   the inner loop: all but the tests marked slow (pyproject.toml's markers:
#                             many real agents, the install, broker outages), in a few minutes
# Any other arguments go to pytest (a file, -k EXPR, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

select=()
args=()
for arg in "$@"; do
    if [ "$arg" = "--quick" ]; then
        select=(-m "not slow")
    else
        args+=("$arg")
    fi
done

source scripts/setup.sh

echo "== ruff" >&2
ruff check agent providers tests scripts
echo "== mypy" >&2
mypy
echo "== pytest" >&2
# Any skipped test is a failure here: a test that cannot run is not a passing test.
log="$(mktemp)"
set +e
# Two worker processes, each taking whole test files (module fixtures stay shared within a file).
python -m pytest -q -p no:cacheprovider -n "${EDGE_AGENT_TEST_WORKERS:-2}" --dist loadfile \
    ${select[@]+"${select[@]}"} ${args[@]+"${args[@]}"} 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -eq 0 ] && grep -Eq '[0-9]+ skipped' "$log"; then
    echo "test.sh: tests were skipped; that counts as a failure" >&2
    exit 1
fi
exit "$status"
