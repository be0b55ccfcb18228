#!/bin/bash
# Submit train.py as a Slurm batch job that speaks the gpu-autoscaler checkpoint protocol.
#
#   GPU_AUTOSCALER_URL=https://autoscaler.example:8443 GPU_AUTOSCALER_TOKEN=... \
#   CHECKPOINT_DIR=/shared/ckpt/run1 ./submit.sh [sbatch options] [-- train.py options]
#
# --requeue           a requeued job (its node was taken away) runs again and resumes from its
#                     checkpoint
# --open-mode=append  every run's output lands in the same log instead of replacing it
# --comment           declares how often the job saves, how long a save takes and the signal its
#                     script traps; checkpoint_interval is also what train.py is told
# No --signal=B:USR1@...: the controller sends the signal when the node is about to go.
# GPU_AUTOSCALER_URL, GPU_AUTOSCALER_TOKEN and CHECKPOINT_DIR reach the job through sbatch's
# default --export=ALL. CHECKPOINT_DIR must be storage every node sees.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
interval=${CHECKPOINT_INTERVAL:-600}
duration=${CHECKPOINT_DURATION:-30}
export CHECKPOINT_DIR=${CHECKPOINT_DIR:-$PWD/checkpoints}
mkdir -p "$CHECKPOINT_DIR"

sbatch_options=()
while (($#)) && [[ $1 != -- ]]; do
    sbatch_options+=("$1")
    shift
done
(($#)) && shift

exec sbatch \
    --job-name=checkpointing-example \
    --gres=gpu:1 \
    --requeue \
    --open-mode=append \
    --output="$CHECKPOINT_DIR/train.log" \
    --comment="checkpoint_interval=$interval checkpoint_duration=$duration checkpoint_signal=USR1" \
    "${sbatch_options[@]}" \
    "$here/train.py" --checkpoint-interval "$interval" "$@"
