#!/bin/bash
# One openclaw-launch per node; each finds its node in the config from SLURM_NODEID and starts that
# node's ranks (bound to their GPUs' NUMA nodes). Submit with: sbatch examples/slurm-job.sh
#SBATCH --job-name=openclaw-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail
srun --kill-on-bad-exit=1 openclaw-launch --config configs/cluster.yaml \
  --run-id "$SLURM_JOB_ID" --log-dir "logs" --report "logs/$SLURM_JOB_ID/report-$SLURM_NODEID.json" \
  examples/train.py --steps 1000
