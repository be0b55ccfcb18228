#!/bin/sh
# Installs the real services the test suite runs against (Slurm with munge, Redis, Prometheus,
# PostgreSQL) and the tools that build and run the container image (podman, buildah, runc,
# debootstrap) from Debian's packages. Idempotent: does nothing when they are already there. The
# tests start and stop their own instances on loopback; nothing is started here and no system
# service runs.
set -eu

missing=""
for command in slurmctld slurmd squeue munged redis-server prometheus podman buildah runc debootstrap; do
    command -v "$command" >/dev/null 2>&1 || missing="$missing $command"
done
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing initdb"
# headless Chromium renders the HTML report in tests/test_report_chromium.py
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
# slurmdbd on MariaDB keeps Slurm's accounting for sacct (tests/test_trace_import_slurm.py)
for command in slurmdbd mariadbd mariadb; do
    command -v "$command" >/dev/null 2>&1 || missing="$missing $command"
done
# kubectl kustomize renders deploy/kubernetes (tests/test_kubernetes_deploy.py). Any kubectl
# will do, so Debian's goes in only where there is none: another package's /usr/bin/kubectl
# (Google's kubectl) would make apt refuse it.
kubectl_package=""
command -v kubectl >/dev/null 2>&1 || { missing="$missing kubectl"; kubectl_package=kubernetes-client; }
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "install-test-services: missing$missing; run as root (or install slurmctld slurmd slurm-client munge redis-server prometheus postgresql podman buildah runc debootstrap chromium slurmdbd mariadb-server kubernetes-client)" >&2
    exit 1
fi
echo "install-test-services: installing Slurm, munge, Redis, Prometheus, PostgreSQL and podman from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge redis-server redis-tools prometheus \
    postgresql postgresql-client \
    podman buildah runc fuse-overlayfs slirp4netns uidmap debootstrap \
    chromium \
    slurmdbd mariadb-server \
    $kubectl_package >/dev/null
# Debian's packages start their services where an init system runs; the tests want none running.
for service in slurmctld slurmd munge redis-server prometheus postgresql slurmdbd mariadb; do
    service "$service" stop >/dev/null 2>&1 || true
done
