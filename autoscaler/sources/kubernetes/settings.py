"""The ``kubernetes`` source's settings: how to reach the API server, which pods are demand and how
their shape is read, and what a drain that outlived its timeout ends in.

The node labels and the spot taint are not settings: they are what the join script gives every
node it starts (``autoscaler.sources.kubernetes_join``), and the two must agree. The pod
annotations are, by their prefix, so a site whose pods already carry other keys can keep them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, field_validator, model_validator

from autoscaler.model.config import EnvName
from autoscaler.sources.kubernetes_join import SPOT_TAINT_KEY, KubernetesJoinSettings

GPU_RESOURCE = "nvidia.com/gpu"
# A resource name: an optional DNS-subdomain prefix and a name (``nvidia.com/gpu``).
_RESOURCE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class KubernetesSettings(KubernetesJoinSettings):
    """What ``sources[].settings`` of ``kind: kubernetes`` hold (docs/kubernetes.md)."""

    # -- the API server --------------------------------------------------------------------------
    kubeconfig: str | None = Field(
        None,
        description="an absolute path to a kubeconfig file (a controller outside the cluster); "
        "unset with api_url unset: the pod's service account (in the cluster)",
    )
    context: str | None = Field(None, min_length=1, description="the kubeconfig's context")
    api_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+/?$",
        description="the API server's URL, with token_env (instead of a kubeconfig)",
    )
    token_env: EnvName | None = Field(
        None, description="NAME of the environment variable holding a bearer token for api_url"
    )
    ca_file: str | None = Field(
        None, description="an absolute path to the CA bundle api_url's certificate is checked with"
    )
    request_timeout_s: PositiveFloat = Field(
        30.0, le=600, description="how long one API call may take before the read fails"
    )
    watch_cache: bool = Field(
        False,
        description="read pods and nodes from a watch-fed cache (listed once, then watched) "
        "instead of listing them every tick: for clusters whose lists take too long a tick "
        "(docs/kubernetes.md, 'The watch cache')",
    )
    cache_max_failing_s: PositiveFloat = Field(
        30.0,
        le=3600,
        description="with watch_cache: how long the watch may fail (the cache kept but not "
        "renewed) before a reading fails instead of reading the cache as the truth",
    )

    # -- what is demand ------------------------------------------------------------------------
    namespaces: list[str] | None = Field(
        None, description="count pending pods of these namespaces only; unset: every namespace"
    )
    extra_gpu_resources: list[str] = Field(
        default_factory=list,
        description=f"extended resources counted as whole GPUs besides {GPU_RESOURCE}. Slices "
        "of shared GPUs (nvidia.com/gpu.shared, nvidia.com/mig-<profile>) are read as slices "
        "without it (docs/fractional-gpus.md, 'Live: Kubernetes'); one listed here counts a "
        "unit as a whole GPU, as before slices were read",
    )
    gpu_models: dict[str, str] = Field(
        default_factory=dict,
        description="a GPU model label's value -> the pools' gpu_model "
        "(NVIDIA-A100-SXM4-80GB: A100); unmapped values are taken as they are",
    )
    instance_type_gpu_models: dict[str, str] = Field(
        default_factory=dict,
        description="an instance type a pod selects (node.kubernetes.io/instance-type) -> the "
        "pools' gpu_model (p4d.24xlarge: A100); unmapped types are taken as the model",
    )
    gpu_model_labels: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu.product", "gpu-autoscaler.io/gpu-model"],
        description="node labels whose value a pod selects to ask for a GPU model",
    )
    instance_type_labels: list[str] = Field(
        default_factory=lambda: [
            "node.kubernetes.io/instance-type",
            "beta.kubernetes.io/instance-type",
        ],
        description="node labels whose value a pod selects to ask for an instance type",
    )
    high_priority_classes: list[str] = Field(
        default_factory=list,
        description="priority class names whose pods are high priority (kept off spot)",
    )
    high_priority_min: int | None = Field(
        None, description="a pod whose spec.priority is at least this is high priority"
    )
    spot_toleration_key: str = Field(
        SPOT_TAINT_KEY,
        description="the spot taint's key: a pod that tolerates it may be planned on spot",
    )
    annotation_prefix: str = Field(
        "gpu-autoscaler.io/",
        description="the prefix of the checkpoint annotations (checkpoint_interval, "
        "checkpoint_duration, checkpoint_signal) and of checkpoint-requested",
    )
    pod_group_labels: list[str] = Field(
        default_factory=lambda: [
            "scheduling.x-k8s.io/pod-group",
            "pod-group.scheduling.sigs.k8s.io",
            "kueue.x-k8s.io/pod-group-name",
        ],
        description="pod labels naming a gang (the coscheduling plugin's pod group, a Kueue "
        "plain-pod group): its pending pods are one job needing a node each, all at once",
    )
    min_available_keys: list[str] = Field(
        default_factory=lambda: [
            "pod-group.scheduling.sigs.k8s.io/min-available",
            "scheduling.x-k8s.io/min-available",
            "kueue.x-k8s.io/pod-group-total-count",
        ],
        description="pod labels or annotations giving a pod group's size",
    )
    indexed_jobs_as_gangs: bool = Field(
        True,
        description="the pending pods of an Indexed Job (completionMode: Indexed) are one gang",
    )
    team_label: str | None = Field(
        None,
        description="the pod label whose value names the team a pod's demand is counted under "
        "(the config's teams); unset: the pod's namespace, the unit Kubernetes quotas and "
        "Kueue's queues are given per; a pod without the label counts under no team",
    )

    # -- actions ----------------------------------------------------------------------------
    drain_timeout_action: Literal["evict", "delete"] = Field(
        "evict",
        description="what a drain that outlived drain_timeout_s ends in: evict (the Eviction "
        "API: a PodDisruptionBudget that refuses keeps the node, retried every tick) or delete "
        "(the pods are deleted, budgets overridden)",
    )
    delete_grace_period_s: NonNegativeInt | None = Field(
        None,
        description="the grace period of a pod deleted to requeue it or at a drain's end "
        "(unset: the pod's own terminationGracePeriodSeconds)",
    )
    move_hold_s: float = Field(
        1800.0,
        gt=0,
        le=86_400,
        description="the longest a node's room is kept (its gpu-autoscaler.io/held-for taint) "
        "for a pending pod a running pod was moved off for, while that pod has not started",
    )

    @field_validator("kubeconfig", "ca_file")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            if not _NAMESPACE.match(name) or len(name) > 63:
                raise ValueError(f"{name[:80]!r} is not a namespace name")
        return value

    @field_validator("extra_gpu_resources")
    @classmethod
    def _resources(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _RESOURCE.match(name) or "/" not in name:
                raise ValueError(f"{name[:80]!r} is not an extended resource name (domain/name)")
        return value

    @field_validator(
        "gpu_model_labels", "instance_type_labels", "pod_group_labels", "min_available_keys"
    )
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        for key in value:
            if not _KEY.match(key):
                raise ValueError(f"{key[:80]!r} is not a label key ([prefix/]name)")
        return value

    @field_validator("team_label")
    @classmethod
    def _team_label(cls, value: str | None) -> str | None:
        if value is not None and not _KEY.match(value):
            raise ValueError(f"{value[:80]!r} is not a label key ([prefix/]name)")
        return value

    @field_validator("spot_toleration_key")
    @classmethod
    def _taint_key(cls, value: str) -> str:
        if not _KEY.match(value):
            raise ValueError(f"{value[:80]!r} is not a taint key ([prefix/]name)")
        return value

    @field_validator("annotation_prefix")
    @classmethod
    def _annotation_prefix(cls, value: str) -> str:
        if value and not _PREFIX.match(value):
            raise ValueError(f"{value[:80]!r} is not an annotation prefix (a DNS name and /)")
        return value

    @model_validator(mode="after")
    def _one_way_in(self) -> KubernetesSettings:
        if self.kubeconfig and self.api_url:
            raise ValueError("give kubeconfig or api_url, not both")
        if self.context and not self.kubeconfig:
            raise ValueError("context names a context of kubeconfig: give kubeconfig too")
        if (self.token_env or self.ca_file) and not self.api_url:
            raise ValueError("token_env and ca_file go with api_url")
        return self

    @property
    def gpu_resources(self) -> tuple[str, ...]:
        return (GPU_RESOURCE, *(r for r in self.extra_gpu_resources if r != GPU_RESOURCE))

    def annotation(self, name: str) -> str:
        """The full annotation key of one of ours (``checkpoint_interval``)."""
        return f"{self.annotation_prefix}{name}"
