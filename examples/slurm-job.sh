#!/bin/bash
# One openclaw-launch per node; each finds its node in the config from SLURM_NODEID and starts that
# node's ranks (bound to their GPUs' NUMA nodes). The run id defaults to $SLURM_JOB_ID on every node.
# Submit with: sbatch examples/slurm-job.sh
#SBATCH --job-name=openclaw-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail
# Single quotes: $SLURM_NODEID is expanded by each task, not once by this batch shell.
srun --kill-on-bad-exit=1 bash -c 'exec openclaw-launch --config configs/cluster.yaml \
  --log-dir logs --report "logs/$SLURM_JOB_ID/report-$SLURM_NODEID.json" \
  examples/train.py --steps 1000'
