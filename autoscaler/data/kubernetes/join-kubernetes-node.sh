#!/bin/sh
# Joins a GPU instance the autoscaler launched to a Kubernetes cluster with the labels and taint
# its pool gives it, so that pods are placed on what the cloud launched as the pool says (spot
# nodes are tainted; a pod that may run on spot tolerates the taint). Rendered into the
# instance's user data by autoscaler.sources.kubernetes_join, the environment below written in.
# See docs/kubernetes-join.md.
#
# Labels: gpu-autoscaler.io/managed=true, gpu-autoscaler.io/market=spot|on-demand,
# gpu-autoscaler.io/pool=<pool>, gpu-autoscaler.io/gpu-model=<model>; spot nodes also carry the
# taint gpu-autoscaler.io/spot=true:NoSchedule.
#
# Environment:
#   GPU_AUTOSCALER_JOIN_METHOD   kubeadm (default) or eks-bootstrap (/etc/eks/bootstrap.sh)
#   GPU_AUTOSCALER_MARKET        spot or on-demand (required: a spot node must carry the taint)
#   GPU_AUTOSCALER_POOL, GPU_AUTOSCALER_GPU_MODEL   the pool's name and GPU model
#   GPU_AUTOSCALER_EXTRA_LABELS  more labels, key=value,key=value
#   GPU_AUTOSCALER_KUBELET_ARGS  more kubelet flags, name=value separated by spaces
# kubeadm:
#   GPU_AUTOSCALER_API_SERVER    the API server's host:port
#   GPU_AUTOSCALER_TOKEN         the bootstrap token itself (then it is in the user data), or
#   GPU_AUTOSCALER_TOKEN_STORE   where to read it at boot: aws-secrets-manager, aws-ssm,
#                                gcp-secret-manager or azure-key-vault, with _TOKEN_NAME and
#                                _TOKEN_REGION (AWS), _TOKEN_PROJECT, _TOKEN_VERSION (GCP),
#                                _TOKEN_VAULT, _TOKEN_VAULT_DOMAIN, _TOKEN_CLIENT_ID (Azure)
#   GPU_AUTOSCALER_CA_CERT_HASH  sha256:<hex>, or GPU_AUTOSCALER_CA_CERT_HASH_STORE etc. as above
#   GPU_AUTOSCALER_KUBEADM_API   v1beta4 (kubeadm 1.31+, default) or v1beta3
#   GPU_AUTOSCALER_NODE_NAME, GPU_AUTOSCALER_PROVIDER_ID   default: the instance's id and its
#                                providerID, from the cloud's metadata
#   GPU_AUTOSCALER_KUBERNETES_DIR   /etc/kubernetes (a kubelet.conf there: joined already)
# eks-bootstrap:
#   GPU_AUTOSCALER_EKS_CLUSTER, GPU_AUTOSCALER_EKS_API_SERVER, GPU_AUTOSCALER_EKS_CA (base64),
#   GPU_AUTOSCALER_EKS_BOOTSTRAP (/etc/eks/bootstrap.sh)
set -eu
export LC_ALL=C
umask 077

metadata_timeout=2
aws="${GPU_AUTOSCALER_AWS_METADATA:-http://169.254.169.254}"
gcp="${GPU_AUTOSCALER_GCP_METADATA:-http://metadata.google.internal}"
azure="${GPU_AUTOSCALER_AZURE_METADATA:-http://169.254.169.254}"

fail() {
    echo "join-kubernetes-node: $*" >&2
    exit 1
}

# The value of the variable named $1 (a name this script builds), or "".
var() {
    eval "printf '%s' \"\${$1:-}\""
}

# A label value Kubernetes accepts, as kubernetes_join.label_value: each byte outside
# A-Za-z0-9_.- becomes '-', the ends are trimmed to a letter or digit, 63 characters at most.
label_value() {
    printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '-' | sed -e 's/^[^A-Za-z0-9]*//' |
        cut -c1-63 | sed -e 's/[^A-Za-z0-9]*$//'
}

# Whether $2 is one line that the extended regular expression $1 matches whole.
matches() {
    case "$2" in
        *"
"*) return 1 ;;
    esac
    printf '%s\n' "$2" | grep -Eqx "$1"
}

# --- what the node carries ------------------------------------------------------------------
market="${GPU_AUTOSCALER_MARKET:-}"
case "$market" in
    spot | on-demand) ;;
    *) fail "GPU_AUTOSCALER_MARKET '$market' is not spot or on-demand" ;;
esac
labels="gpu-autoscaler.io/managed=true,gpu-autoscaler.io/market=$market"
value=$(label_value "${GPU_AUTOSCALER_POOL:-}")
if [ -n "$value" ]; then
    labels="$labels,gpu-autoscaler.io/pool=$value"
fi
value=$(label_value "${GPU_AUTOSCALER_GPU_MODEL:-}")
if [ -n "$value" ]; then
    labels="$labels,gpu-autoscaler.io/gpu-model=$value"
fi
if [ -n "${GPU_AUTOSCALER_EXTRA_LABELS:-}" ]; then
    matches '[^"\[:space:]]+' "$GPU_AUTOSCALER_EXTRA_LABELS" ||
        fail "GPU_AUTOSCALER_EXTRA_LABELS holds a quote, backslash or blank"
    labels="$labels,$GPU_AUTOSCALER_EXTRA_LABELS"
fi
taint=""
if [ "$market" = spot ]; then
    taint="gpu-autoscaler.io/spot=true:NoSchedule"
fi
kubelet_args="${GPU_AUTOSCALER_KUBELET_ARGS:-}"
if [ -n "$kubelet_args" ]; then
    matches '[^"\]+' "$kubelet_args" || fail "GPU_AUTOSCALER_KUBELET_ARGS holds a quote or backslash"
fi

# --- EKS: the AMI's own bootstrap ----------------------------------------------------------
if [ "${GPU_AUTOSCALER_JOIN_METHOD:-kubeadm}" = eks-bootstrap ]; then
    cluster="${GPU_AUTOSCALER_EKS_CLUSTER:-}"
    [ -n "$cluster" ] || fail "GPU_AUTOSCALER_EKS_CLUSTER is not set"
    extra="--node-labels=$labels"
    if [ -n "$taint" ]; then
        extra="$extra --register-with-taints=$taint"
    fi
    set -f
    for arg in $kubelet_args; do
        extra="$extra --$arg"
    done
    set +f
    set -- "$cluster" --kubelet-extra-args "$extra"
    if [ -n "${GPU_AUTOSCALER_EKS_API_SERVER:-}" ]; then
        set -- "$@" --apiserver-endpoint "$GPU_AUTOSCALER_EKS_API_SERVER" \
            --b64-cluster-ca "${GPU_AUTOSCALER_EKS_CA:-}"
    fi
    exec "${GPU_AUTOSCALER_EKS_BOOTSTRAP:-/etc/eks/bootstrap.sh}" "$@"
fi
[ "${GPU_AUTOSCALER_JOIN_METHOD:-kubeadm}" = kubeadm ] ||
    fail "GPU_AUTOSCALER_JOIN_METHOD '$GPU_AUTOSCALER_JOIN_METHOD' is not kubeadm or eks-bootstrap"

# --- kubeadm --------------------------------------------------------------------------------
kube_dir="${GPU_AUTOSCALER_KUBERNETES_DIR:-/etc/kubernetes}"
if [ -e "$kube_dir/kubelet.conf" ]; then
    # A boot script that runs at every boot (GCP's startup-script) finds the node joined.
    echo "join-kubernetes-node: $kube_dir/kubelet.conf exists: joined already"
    exit 0
fi

aws_token=""
aws_get() {
    curl -fsS -m "$metadata_timeout" -H "X-aws-ec2-metadata-token: $aws_token" \
        "$aws/latest/meta-data/$1" 2>/dev/null
}
gcp_get() {
    curl -fsS -m "$metadata_timeout" -H "Metadata-Flavor: Google" \
        "$gcp/computeMetadata/v1/$1" 2>/dev/null
}
azure_get() {
    curl -fsS -m "$metadata_timeout" -H "Metadata: true" \
        "$azure/metadata/instance/compute/$1?api-version=2021-02-01&format=text" 2>/dev/null
}

# The string value of key $1 in the JSON document $2 (an access token, a secret's payload).
json_string() {
    printf '%s' "$2" | tr -d '\r\n' |
        sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p"
}

# The node's name (its instance id, as the cloud lists it) and its providerID, which the kubelet
# writes into the node's spec.providerID: how the controller matches node and instance.
name="${GPU_AUTOSCALER_NODE_NAME:-}"
provider_id="${GPU_AUTOSCALER_PROVIDER_ID:-}"
if [ -z "$name" ] || [ -z "$provider_id" ]; then
    if aws_token=$(curl -fsS -m "$metadata_timeout" -X PUT "$aws/latest/api/token" \
        -H "X-aws-ec2-metadata-token-ttl-seconds: 60" 2>/dev/null) &&
        id=$(aws_get instance-id); then
        zone=$(aws_get placement/availability-zone) || fail "AWS metadata: no availability zone"
        found="aws:///$zone/$id"
    elif id=$(gcp_get instance/name); then
        zone=$(gcp_get instance/zone) || fail "GCP metadata: no zone"
        project=$(gcp_get project/project-id) || fail "GCP metadata: no project"
        found="gce://$project/${zone##*/}/$id"
    elif id=$(azure_get name); then
        resource=$(azure_get resourceId) || fail "Azure metadata: no resourceId"
        found="azure://$resource"
    else
        fail "no cloud metadata answered; set GPU_AUTOSCALER_NODE_NAME and _PROVIDER_ID"
    fi
    name="${name:-$id}"
    provider_id="${provider_id:-$found}"
fi
name=$(printf '%s' "$name" | tr 'A-Z' 'a-z')
matches '[a-z0-9]([a-z0-9.-]*[a-z0-9])?' "$name" || fail "'$name' is not a usable node name"
matches '[A-Za-z0-9_.:/()-]+' "$provider_id" || fail "'$provider_id' is not a usable providerID"

# A secret from the store the variables GPU_AUTOSCALER_$1_* name, through the instance's own
# identity (instance profile, service account, managed identity); never printed.
gcp_secret() {
    project="$1"
    if [ -z "$project" ]; then
        project=$(gcp_get project/project-id) || return 1
    fi
    reply=$(gcp_get instance/service-accounts/default/token) || return 1
    bearer=$(json_string access_token "$reply")
    reply=$(curl -fsS -m 30 -H "Authorization: Bearer $bearer" \
        "https://secretmanager.googleapis.com/v1/projects/$project/secrets/$2/versions/$3:access") ||
        return 1
    json_string data "$reply" | base64 -d
}
azure_secret() {
    query="api-version=2018-02-01&resource=https%3A%2F%2F$2${4:+&client_id=$4}"
    reply=$(curl -fsS -m 10 -H "Metadata: true" "$azure/metadata/identity/oauth2/token?$query") ||
        return 1
    bearer=$(json_string access_token "$reply")
    reply=$(curl -fsS -m 30 -H "Authorization: Bearer $bearer" \
        "https://$1.$2/secrets/$3?api-version=7.4") || return 1
    json_string value "$reply"
}
secret() {
    given=$(var "GPU_AUTOSCALER_$1")
    if [ -n "$given" ]; then
        printf '%s' "$given"
        return 0
    fi
    store=$(var "GPU_AUTOSCALER_$1_STORE")
    secret_name=$(var "GPU_AUTOSCALER_$1_NAME")
    case "$store" in
        aws-secrets-manager)
            aws secretsmanager get-secret-value --region "$(var "GPU_AUTOSCALER_$1_REGION")" \
                --secret-id "$secret_name" --query SecretString --output text
            ;;
        aws-ssm)
            aws ssm get-parameter --region "$(var "GPU_AUTOSCALER_$1_REGION")" \
                --name "$secret_name" --with-decryption --query Parameter.Value --output text
            ;;
        gcp-secret-manager)
            gcp_secret "$(var "GPU_AUTOSCALER_$1_PROJECT")" "$secret_name" \
                "$(var "GPU_AUTOSCALER_$1_VERSION")"
            ;;
        azure-key-vault)
            azure_secret "$(var "GPU_AUTOSCALER_$1_VAULT")" \
                "$(var "GPU_AUTOSCALER_$1_VAULT_DOMAIN")" "$secret_name" \
                "$(var "GPU_AUTOSCALER_$1_CLIENT_ID")"
            ;;
        "") echo "join-kubernetes-node: GPU_AUTOSCALER_$1 and _$1_STORE are unset" >&2 && return 1 ;;
        *) echo "join-kubernetes-node: no store '$store' (GPU_AUTOSCALER_$1_STORE)" >&2 && return 1 ;;
    esac
}
token=$(secret TOKEN | tr -d '[:space:]') && [ -n "$token" ] ||
    fail "cannot read the bootstrap token (${GPU_AUTOSCALER_TOKEN_STORE:-} ${GPU_AUTOSCALER_TOKEN_NAME:-})"
matches '[a-z0-9]{6}\.[a-z0-9]{16}' "$token" ||
    fail "the bootstrap token read is not of the form [a-z0-9]{6}.[a-z0-9]{16} (not shown)"
ca_hash=$(secret CA_CERT_HASH | tr -d '[:space:]') && [ -n "$ca_hash" ] ||
    fail "cannot read the CA cert hash (${GPU_AUTOSCALER_CA_CERT_HASH_STORE:-} ${GPU_AUTOSCALER_CA_CERT_HASH_NAME:-})"
matches 'sha256:[0-9a-f]{64}' "$ca_hash" ||
    fail "the CA cert hash read is not of the form sha256:<64 hex digits>"
api_server="${GPU_AUTOSCALER_API_SERVER:-}"
matches '([A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):[0-9]+' "$api_server" ||
    fail "GPU_AUTOSCALER_API_SERVER '$api_server' is not host:port"
api="${GPU_AUTOSCALER_KUBEADM_API:-v1beta4}"
case "$api" in
    v1beta3 | v1beta4) ;;
    *) fail "GPU_AUTOSCALER_KUBEADM_API '$api' is not v1beta3 or v1beta4" ;;
esac

# One kubelet flag in nodeRegistration.kubeletExtraArgs (a map in v1beta3, a list in v1beta4).
kubelet_arg() {
    if [ "$api" = v1beta3 ]; then
        printf '    %s: "%s"\n' "$1" "$2"
    else
        printf '    - name: "%s"\n      value: "%s"\n' "$1" "$2"
    fi
}

# The JoinConfiguration holds the token: a private file in a private directory, gone after.
work=$(mktemp -d "${TMPDIR:-/run}/gpu-autoscaler-join.XXXXXX")
trap 'rm -rf "$work"' EXIT
config="$work/join.yaml"
{
    printf 'apiVersion: kubeadm.k8s.io/%s\nkind: JoinConfiguration\n' "$api"
    printf 'discovery:\n  bootstrapToken:\n    apiServerEndpoint: "%s"\n' "$api_server"
    printf '    token: "%s"\n    caCertHashes:\n      - "%s"\n' "$token" "$ca_hash"
    printf '  tlsBootstrapToken: "%s"\n' "$token"
    printf 'nodeRegistration:\n  name: "%s"\n' "$name"
    if [ -n "$taint" ]; then
        printf '  taints:\n    - key: "gpu-autoscaler.io/spot"\n      value: "true"\n'
        printf '      effect: "NoSchedule"\n'
    else
        printf '  taints: []\n'
    fi
    printf '  kubeletExtraArgs:\n'
    kubelet_arg node-labels "$labels"
    kubelet_arg provider-id "$provider_id"
    set -f
    for arg in $kubelet_args; do
        kubelet_arg "${arg%%=*}" "${arg#*=}"
    done
    set +f
} >"$config"
kubeadm join --config "$config"
