#!/bin/sh
# Joins a GPU instance the autoscaler launched to the Slurm cluster as a dynamic node named by its
# instance id, so what the cloud lists and what Slurm schedules onto meet on one name. Run it as
# the instance's boot script (user-data / startup-script / custom-data) once munge and the Slurm
# configuration (or configless --conf-server) are in place. See docs/slurm.md.
#
# The node carries features that say what it is (docs/slurm.md, "Cloud node features"):
#   gpu-autoscaler         every node the autoscaler launched (GPU_AUTOSCALER_FEATURE)
#   market-spot            a spot instance, or market-on-demand; partitions key on these, so that
#                          jobs that must stay off spot never see a spot node
#   pool-<pool>            the autoscaler pool it was launched in
#   gpu-<model>            the pool's GPU model, lower case (gpu-a100, gpu-a10g)
#
# Environment (all optional):
#   GPU_AUTOSCALER_NODE_NAME    node name; default: the instance id from the cloud's metadata
#   GPU_AUTOSCALER_MARKET       spot or on-demand; default: from the metadata of the cloud that
#                               named the instance (AWS instance-life-cycle, GCP scheduling,
#                               Azure priority); none without it (the node then joins no
#                               market's partition)
#   GPU_AUTOSCALER_POOL         the pool's name (pool-<name> feature)
#   GPU_AUTOSCALER_GPU_MODEL    the pool's gpu_model (gpu-<model> feature)
#   GPU_AUTOSCALER_GPUS         GPU count; default: what nvidia-smi -L lists
#   GPU_AUTOSCALER_GPU_TYPE     gres type (a100, h100, ...); default: none
#   GPU_AUTOSCALER_SHARDS       shards per GPU (Slurm's gres/shard, a pool's time-slicing
#                               replicas): the node's Gres gets shard:<GPUs x shards>; the
#                               node's gres.conf must name them (docs/fractional-gpus.md)
#   GPU_AUTOSCALER_FEATURE      the feature that marks the autoscaler's nodes (gpu-autoscaler)
#   GPU_AUTOSCALER_FEATURES     more features, comma separated (the site's own: a100, nvlink)
#   GPU_AUTOSCALER_NODE_CONF    more node attributes (CPUs=… RealMemory=… Weight=…)
#   GPU_AUTOSCALER_SLURMD       the slurmd to start (slurmd)
#   GPU_AUTOSCALER_SLURMD_ARGS  more slurmd arguments (--conf-server host:port, -f file)
#   GPU_AUTOSCALER_AWS_METADATA, GPU_AUTOSCALER_GCP_METADATA, GPU_AUTOSCALER_AZURE_METADATA
#                               the metadata servers' base URLs (http://169.254.169.254,
#                               http://metadata.google.internal, http://169.254.169.254)
set -eu

metadata_timeout=2
aws="${GPU_AUTOSCALER_AWS_METADATA:-http://169.254.169.254}"
gcp="${GPU_AUTOSCALER_GCP_METADATA:-http://metadata.google.internal}"
azure="${GPU_AUTOSCALER_AZURE_METADATA:-http://169.254.169.254}"

aws_get() {
    curl -fsS -m "$metadata_timeout" -H "X-aws-ec2-metadata-token: $aws_token" \
        "$aws/latest/meta-data/$1" 2>/dev/null
}

gcp_get() {
    curl -fsS -m "$metadata_timeout" -H "Metadata-Flavor: Google" \
        "$gcp/computeMetadata/v1/instance/$1" 2>/dev/null
}

azure_get() {
    curl -fsS -m "$metadata_timeout" -H "Metadata: true" \
        "$azure/metadata/instance/compute/$1?api-version=2021-02-01&format=text" 2>/dev/null
}

# A feature name Slurm accepts: letters, digits and _.- only.
feature_word() {
    printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '-'
}

# The instance's name, and which cloud's metadata gave it (the one asked for its market).
cloud=""
aws_token=""
if [ -n "${GPU_AUTOSCALER_NODE_NAME:-}" ]; then
    name="$GPU_AUTOSCALER_NODE_NAME"
elif aws_token=$(curl -fsS -m "$metadata_timeout" -X PUT "$aws/latest/api/token" \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 60" 2>/dev/null) &&
    name=$(aws_get instance-id); then
    cloud=aws
elif name=$(gcp_get name); then
    cloud=gcp
elif name=$(azure_get name); then
    cloud=azure
else
    echo "join-cloud-node: cannot find this instance's id (no cloud metadata answered); set GPU_AUTOSCALER_NODE_NAME" >&2
    exit 1
fi
case "$name" in
    "" | *[!A-Za-z0-9_.-]*)
        echo "join-cloud-node: '$name' is not a usable Slurm node name" >&2
        exit 1
        ;;
esac

market="${GPU_AUTOSCALER_MARKET:-}"
if [ -z "$market" ]; then
    case "$cloud" in
        aws)
            case "$(aws_get instance-life-cycle || true)" in
                spot) market=spot ;;
                on-demand | scheduled) market=on-demand ;;
            esac
            ;;
        gcp)
            case "$(gcp_get scheduling/provisioning-model || gcp_get scheduling/preemptible || true)" in
                SPOT | TRUE) market=spot ;;
                STANDARD | FALSE) market=on-demand ;;
            esac
            ;;
        azure)
            case "$(azure_get priority || true)" in
                Spot | Low) market=spot ;;
                Regular) market=on-demand ;;
            esac
            ;;
    esac
fi
case "$market" in
    spot | on-demand) ;;
    "") echo "join-cloud-node: market unknown (set GPU_AUTOSCALER_MARKET): no market-* feature" >&2 ;;
    *)
        echo "join-cloud-node: GPU_AUTOSCALER_MARKET '$market' is not spot or on-demand" >&2
        exit 1
        ;;
esac

gpus=$(
    if [ -n "${GPU_AUTOSCALER_GPUS:-}" ]; then
        printf '%s\n' "$GPU_AUTOSCALER_GPUS"
    else
        nvidia-smi -L | grep -c '^GPU '
    fi
) || {
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
shards="${GPU_AUTOSCALER_SHARDS:-}"
case "$shards" in
    "") ;;
    *[!0-9]* | 0*)
        echo "join-cloud-node: GPU_AUTOSCALER_SHARDS '$shards' is not a number of shards per GPU" >&2
        exit 1
        ;;
    *) gres="$gres,shard:$((gpus * shards))" ;;
esac
features="${GPU_AUTOSCALER_FEATURE:-gpu-autoscaler}"
if [ -n "$market" ]; then
    features="$features,market-$market"
fi
if [ -n "${GPU_AUTOSCALER_POOL:-}" ]; then
    features="$features,pool-$(feature_word "$GPU_AUTOSCALER_POOL")"
fi
if [ -n "${GPU_AUTOSCALER_GPU_MODEL:-}" ]; then
    model=$(printf '%s' "$GPU_AUTOSCALER_GPU_MODEL" | tr 'A-Z' 'a-z')
    features="$features,gpu-$(feature_word "$model")"
fi
if [ -n "${GPU_AUTOSCALER_FEATURES:-}" ]; then
    features="$features,$GPU_AUTOSCALER_FEATURES"
fi
node_conf="Gres=$gres Feature=$features${GPU_AUTOSCALER_NODE_CONF:+ $GPU_AUTOSCALER_NODE_CONF}"

# slurmd forks into the background once registered; word splitting of the extra arguments is
# what lets several be given.
# shellcheck disable=SC2086
exec "${GPU_AUTOSCALER_SLURMD:-slurmd}" -Z -N "$name" --conf "$node_conf" ${GPU_AUTOSCALER_SLURMD_ARGS:-}
