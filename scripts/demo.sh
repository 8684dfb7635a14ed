#!/usr/bin/env bash
# The main job on this machine: a 4-rank DDP training under openclaw-launch.
# No GPU here? Each rank gets its own cores and the gloo backend.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec openclaw-launch --nproc-per-node "${NPROC:-4}" examples/train.py "$@"
