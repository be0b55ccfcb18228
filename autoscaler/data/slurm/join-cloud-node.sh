#!/bin/sh
# Joins a GPU instance the autoscaler launched to the Slurm cluster as a dynamic node named by its
# instance id, so what the cloud lists and what Slurm schedules onto meet on one name. Run it as
# the instance's boot script (user-data / startup-script / custom-data) once munge and the Slurm
# configuration (or configless --conf-server) are in place. See docs/slurm.md.
#
# Environment (all optional):
#   GPU_AUTOSCALER_NODE_NAME    node name; default: the instance id from the cloud's metadata
#   GPU_AUTOSCALER_GPUS         GPU count; default: what nvidia-smi -L lists
#   GPU_AUTOSCALER_GPU_TYPE     gres type (a100, h100, ...); default: none
#   GPU_AUTOSCALER_FEATURE      the feature that marks the autoscaler's nodes (gpu-autoscaler)
#   GPU_AUTOSCALER_FEATURES     more features, comma separated (pool name, spot, ...)
#   GPU_AUTOSCALER_NODE_CONF    more node attributes (CPUs=… RealMemory=… Weight=…)
#   GPU_AUTOSCALER_SLURMD       the slurmd to start (slurmd)
#   GPU_AUTOSCALER_SLURMD_ARGS  more slurmd arguments (--conf-server host:port, -f file)
set -eu

metadata_timeout=2

instance_name() {
    if [ -n "${GPU_AUTOSCALER_NODE_NAME:-}" ]; then
        printf '%s\n' "$GPU_AUTOSCALER_NODE_NAME"
        return 0
    fi
    # AWS (IMDSv2): a session token first, then the instance id.
    token=$(curl -fsS -m "$metadata_timeout" -X PUT "http://169.254.169.254/latest/api/token" \
        -H "X-aws-ec2-metadata-token-ttl-seconds: 60" 2>/dev/null) &&
        curl -fsS -m "$metadata_timeout" -H "X-aws-ec2-metadata-token: $token" \
            "http://169.254.169.254/latest/meta-data/instance-id" 2>/dev/null && return 0
    # GCP: the instance name (what the autoscaler lists and deletes by).
    curl -fsS -m "$metadata_timeout" -H "Metadata-Flavor: Google" \
        "http://metadata.google.internal/computeMetadata/v1/instance/name" 2>/dev/null && return 0
    # Azure IMDS: the VM name.
    curl -fsS -m "$metadata_timeout" -H "Metadata: true" \
        "http://169.254.169.254/metadata/instance/compute/name?api-version=2021-02-01&format=text" \
        2>/dev/null && return 0
    return 1
}

gpu_count() {
    if [ -n "${GPU_AUTOSCALER_GPUS:-}" ]; then
        printf '%s\n' "$GPU_AUTOSCALER_GPUS"
    else
        nvidia-smi -L | grep -c '^GPU '
    fi
}

name=$(instance_name) || {
    echo "join-cloud-node: cannot find this instance's id (no cloud metadata answered); set GPU_AUTOSCALER_NODE_NAME" >&2
    exit 1
}
case "$name" in
    "" | *[!A-Za-z0-9_.-]*)
        echo "join-cloud-node: '$name' is not a usable Slurm node name" >&2
        exit 1
        ;;
esac

gpus=$(gpu_count) || {
    echo "join-cloud-node: cannot count GPUs (nvidia-smi failed); set GPU_AUTOSCALER_GPUS" >&2
    exit 1
}
case "$gpus" in
    "" | *[!0-9]*)
        echo "join-cloud-node: GPU count '$gpus' is not a number" >&2
        exit 1
        ;;
esac

gres="gpu:$gpus"
if [ -n "${GPU_AUTOSCALER_GPU_TYPE:-}" ]; then
    gres="gpu:$GPU_AUTOSCALER_GPU_TYPE:$gpus"
fi
features="${GPU_AUTOSCALER_FEATURE:-gpu-autoscaler}"
if [ -n "${GPU_AUTOSCALER_FEATURES:-}" ]; then
    features="$features,$GPU_AUTOSCALER_FEATURES"
fi
node_conf="Gres=$gres Feature=$features${GPU_AUTOSCALER_NODE_CONF:+ $GPU_AUTOSCALER_NODE_CONF}"

# slurmd forks into the background once registered; word splitting of the extra arguments is
# what lets several be given.
# shellcheck disable=SC2086
exec "${GPU_AUTOSCALER_SLURMD:-slurmd}" -Z -N "$name" --conf "$node_conf" ${GPU_AUTOSCALER_SLURMD_ARGS:-}
