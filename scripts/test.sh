#!/usr/bin/env bash
# All checks from a fresh clone: install, lint, type-check, tests. What CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
PY=${PYTHON:-python3}
$PY -m ruff check openclaw_launch tests benchmarks examples
$PY -m ruff format --check openclaw_launch tests benchmarks examples
$PY -m mypy
$PY -m pytest -q -p no:cacheprovider "$@"
