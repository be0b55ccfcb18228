# syntax=docker/dockerfile:1
# The controller's image: `gpu-autoscaler run` as a non-root user, with the config and every
# credential mounted at run time (docs/container.md). Build:
#   docker build -t gpu-autoscaler .
# The base is pinned by exact tag so a rebuild gets the same Python; bump it on purpose.

FROM python:3.11.13-slim-bookworm AS builder

# An index other than PyPI (a mirror, a proxy) for the build; nothing of it reaches the image.
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# `python3 -m venv`, not /usr/local/bin/python: the same line works on any Debian-based Python.
RUN python3 -m venv /opt/venv

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY autoscaler ./autoscaler
COPY providers ./providers
COPY policies ./policies
COPY node_agent ./node_agent

# Every cloud, the Postgres leader lock, the Kubernetes client (the Lease lock a pod takes under
# the default `leader: {kind: auto}`, and the kubernetes source) and the node agent's NVML
# binding (deploy/kubernetes/overlays/agent runs `gpu-autoscaler-agent` from this image), at the
# versions CI tests (constraints.txt), and not the report extra: numpy, scipy and matplotlib
# serve only `gpu-autoscaler report` and the lower bound, never the controller (the build fails
# if one of them crept in). The venv's own installers go afterwards: the final image installs
# nothing at run time.
RUN /opt/venv/bin/pip install -c constraints.txt ".[aws,gcp,azure,postgres,kubernetes,agent]" \
 && /opt/venv/bin/pip uninstall -y pip setuptools \
 && /opt/venv/bin/gpu-autoscaler --help > /dev/null \
 && /opt/venv/bin/gpu-autoscaler-agent --help > /dev/null \
 && /opt/venv/bin/python -c "import kubernetes.client, pynvml" \
 && /opt/venv/bin/python -c "import importlib.util as u, sys; \
        m = [n for n in ('numpy', 'scipy', 'matplotlib') if u.find_spec(n)]; \
        sys.exit(f'the report extra is in the image: {m}' if m else 0)"


FROM python:3.11.13-slim-bookworm

LABEL org.opencontainers.image.title="gpu-autoscaler" \
      org.opencontainers.image.description="Keeps GPU work flowing at the lowest cost across on-prem GPUs and spot instances on AWS, GCP and Azure." \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPU_AUTOSCALER_HEALTH_PORT=9108

# A fixed uid/gid so mounted secrets can be made readable to exactly this user, and so
# Kubernetes' runAsNonRoot can check it. The base's own pip goes too: nothing is installed later.
RUN groupadd --gid 10001 autoscaler \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin autoscaler \
 && mkdir -p /etc/gpu-autoscaler /run/secrets/gpu-autoscaler /var/lib/gpu-autoscaler \
 && chown 10001:10001 /var/lib/gpu-autoscaler \
 && if python3 -m pip --version > /dev/null 2>&1; then \
        python3 -m pip uninstall -y --root-user-action=ignore pip setuptools wheel; \
    fi \
 && rm -rf /root/.cache /tmp/*

COPY --from=builder /opt/venv /opt/venv

USER 10001:10001
# The journal's SQLite file (journal.sqlite_path) belongs here; mount a volume to keep it.
WORKDIR /var/lib/gpu-autoscaler

# 9108: /metrics, /healthz and /readyz; 8081: the node agents' notice inbox.
EXPOSE 9108 8081
STOPSIGNAL SIGTERM

# No curl in a slim image: Python's urllib asks /healthz. Set GPU_AUTOSCALER_HEALTH_PORT when
# the config's metrics port is not 9108.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GPU_AUTOSCALER_HEALTH_PORT', '9108'), timeout=4)"]

# Config and credentials are mounted, never baked in:
#   -v ./config.yaml:/etc/gpu-autoscaler/config.yaml:ro
#   -v ./secrets:/run/secrets/gpu-autoscaler:ro
#   -v gpu-autoscaler-state:/var/lib/gpu-autoscaler
ENTRYPOINT ["gpu-autoscaler", "run"]
CMD ["--config", "/etc/gpu-autoscaler/config.yaml"]
