#!/bin/bash
# One openclaw-launch per node; each finds its node in the config from SLURM_NODEID and starts that
# node's ranks (bound to their GPUs' NUMA nodes). The run id defaults to $SLURM_JOB_ID on every node.
# Submit with: OPENCLAW_CONFIG=cluster.yaml sbatch examples/slurm-job.sh (a config listing both nodes:
# run `openclaw-launch discover` on each and join the node entries; configs/ has examples).
#SBATCH --job-name=openclaw-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail
# Single quotes: $SLURM_NODEID is expanded by each task, not once by this batch shell.
export OPENCLAW_CONFIG="${OPENCLAW_CONFIG:?set OPENCLAW_CONFIG to the cluster YAML}"
srun --kill-on-bad-exit=1 bash -c 'exec openclaw-launch --config "$OPENCLAW_CONFIG" \
  --log-dir logs --report "logs/$SLURM_JOB_ID/report-$SLURM_NODEID.json" \
  examples/train.py --steps 1000'
