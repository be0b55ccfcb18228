"""The node agent: runs on every GPU node (on-prem and cloud), serves its GPUs' readings in
dcgm-exporter's names and forwards the cloud's interruption notices read on the node to the
controller's inbox and to the node's own workloads.

It is its own top-level package because it ships to nodes, not to the controller: it depends on
``autoscaler.model`` alone (what a notice is, the typed errors, secrets scrubbing, the
entry-point lookup), never on the controller's SPI, tick, ops or sources, nor on a provider or a
policy; an import-linter contract in pyproject.toml holds that. Its third-party packages are
prometheus-client, pydantic, tenacity and, lazily, nvidia-ml-py (the ``agent`` extra).

The per-cloud metadata watchers (``metadata_aws``, ``metadata_gcp``, ``metadata_azure``) are
found through the entry-point group ``gpu_autoscaler.metadata_watchers`` (``watchers``), so
another cloud plugs in by installing a package. Run it as ``gpu-autoscaler-agent`` (or
``gpu-autoscaler agent``, the same arguments); see docs/agent.md.
"""
