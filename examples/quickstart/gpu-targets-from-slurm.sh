#!/bin/sh
# Writes where the node agents of the autoscaler's Slurm cloud nodes serve their GPU readings, as
# a Prometheus file_sd targets file: the controller's scrape source reads it (targets_file, with
# node_label: node) and re-reads it when it changes. Cloud nodes come and go, and each is a
# dynamic Slurm node named by its instance id at the address it registered from, so Slurm is
# where their addresses are. Run it on the controller's host before the controller starts and
# then every minute (docs/quickstart-slurm.md has a systemd timer for it).
#
#   gpu-targets-from-slurm.sh [FILE]        default FILE: /var/lib/gpu-autoscaler/gpu-targets.json
#
# Environment (optional): GPU_AUTOSCALER_FEATURE, the feature the autoscaler's nodes carry (the
# slurm source's cloud_feature, default gpu-autoscaler); GPU_AUTOSCALER_AGENT_PORT, the agents'
# port (default 9400); SINFO, the sinfo to run (default sinfo). The file is replaced whole
# (written beside it, then renamed), and left as it was when sinfo fails.
set -eu

out="${1:-/var/lib/gpu-autoscaler/gpu-targets.json}"
feature="${GPU_AUTOSCALER_FEATURE:-gpu-autoscaler}"
port="${GPU_AUTOSCALER_AGENT_PORT:-9400}"
case "$port" in
    "" | *[!0-9]*)
        echo "gpu-targets-from-slurm: GPU_AUTOSCALER_AGENT_PORT '$port' is not a port" >&2
        exit 2
        ;;
esac

# One line per node and partition: name, address, features.
nodes=$("${SINFO:-sinfo}" --noheader --Node --format='%N %o %f')

tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
printf '%s\n' "$nodes" | awk -v feature="$feature" -v port="$port" '
    # Node names and addresses are Slurm words; anything else is left out, never quoted wrong.
    NF < 3 || $1 !~ /^[A-Za-z0-9_.-]+$/ || $2 !~ /^[A-Za-z0-9_.:-]+$/ { next }
    {
        carries = 0
        n = split($3, features, ",")
        for (i = 1; i <= n; i++) if (features[i] == feature) carries = 1
        if (!carries || seen[$1]++) next
        address = ($2 ~ /:/) ? "[" $2 "]" : $2
        printf "%s  {\"targets\": [\"%s:%s\"], \"labels\": {\"node\": \"%s\"}}", \
            (count++ ? ",\n" : "[\n"), address, port, $1
    }
    END { print (count ? "\n]" : "[]") }
' > "$tmp"
mv -f "$tmp" "$out"
trap - EXIT
