#!/usr/bin/env bash
# All checks from a fresh clone: install, lint, type-check, tests. What CI runs.
# The tests run in two passes: everything not marked `serial` on two workers (pytest-xdist), then
# the `serial` tests (host-wide state: podman, Slurm, network namespaces, ...) one at a time.
# Both passes run (a failure in the first still shows the second's); a pass that selects no test
# (arguments naming only serial or only parallel tests) is not a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
PY=${PYTHON:-python3}
$PY -m ruff check openclaw_launch tests benchmarks examples tools
$PY -m ruff format --check openclaw_launch tests benchmarks examples tools
$PY -m mypy
failed=0
run_pass() {
  local code=0
  $PY -m pytest -q -p no:cacheprovider --durations=25 "$@" || code=$?
  [ "$code" -eq 0 ] || [ "$code" -eq 5 ] || failed=$code
}
run_pass -n 2 --dist worksteal -m "not serial" "$@"
run_pass -m serial "$@"
exit "$failed"
