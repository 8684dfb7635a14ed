#!/bin/bash
# One openclaw-launch per node (srun --ntasks-per-node=1); each finds its node in the config from
# the host Slurm gives the step. The agents meet on the first node (port MASTER_PORT+1) before any
# worker starts, stop together, and the first node prints and writes one report for the job.
# The run id defaults to $SLURM_JOB_ID on every node. Submit with: OPENCLAW_CONFIG=cluster.yaml sbatch examples/slurm-job.sh
#
# Checkpoint before the time limit: --signal=B:USR1@90 sends SIGUSR1 to this batch shell only,
# 90 s before the end. The trap passes it to srun, which signals every task of the step: each
# launcher forwards SIGUSR1 to its workers WITHOUT stopping them (openclaw-launch --forward-signals,
# default SIGUSR1,SIGUSR2), so the training can save a checkpoint and go on. Slurm also delivers a
# step signal to every process of the step itself, so a worker may see it twice: make the handler
# idempotent (set a flag, checkpoint at the next step). After the step ends, a job that was told
# to checkpoint is put back in the queue (scontrol requeue; needs --requeue and JobRequeue).
#SBATCH --job-name=openclaw-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --signal=B:USR1@90
#SBATCH --requeue
set -euo pipefail
# The cluster YAML (run `openclaw-launch discover` on each node and join the node entries).
export CONFIG="${CONFIG:-${OPENCLAW_CONFIG:?set OPENCLAW_CONFIG to the cluster YAML}}"
read -r -a TRAIN <<<"${TRAIN:-examples/train.py --steps 1000}"
REQUEUE=${REQUEUE:-1}
mkdir -p "logs/$SLURM_JOB_ID"

# Single quotes: $SLURM_NODEID is expanded by each task, not once by this batch shell.
srun --kill-on-bad-exit=1 bash -c 'exec openclaw-launch --config "$CONFIG" --log-dir logs \
  --report "logs/$SLURM_JOB_ID/report-$SLURM_NODEID.json" "$@"' bash "${TRAIN[@]}" &
step=$!
told=0
trap 'told=1; kill -USR1 "$step"' USR1

status=0
while :; do
  wait "$step" && status=0 || status=$?
  kill -0 "$step" 2>/dev/null || break  # else the trap interrupted the wait: srun still runs
done
if ((told && REQUEUE)); then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
