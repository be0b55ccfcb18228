"""How a cloud GPU instance joins a Kubernetes cluster, rendered from its pool.

A node the autoscaler launched carries labels that say what it is (``gpu-autoscaler.io/managed``,
``/market``, ``/pool``, ``/gpu-model``) and, on spot, the taint ``gpu-autoscaler.io/spot=true:
NoSchedule``: a pod that may run on spot tolerates it, a protected pod simply lacks the
toleration and never lands there. The node's ``spec.providerID`` is what the controller matches
it to its instance by.

Two ways in (docs/kubernetes-join.md):

* ``kubeadm``: ``join-kubernetes-node.sh`` reads the bootstrap token and the CA cert hash at boot
  from the cloud's secret store through the instance's own identity (AWS Secrets Manager or SSM
  Parameter Store, GCP Secret Manager, Azure Key Vault), so neither is in the user data, which
  anyone on the instance and anyone allowed to describe it can read. ``store: user-data`` writes
  the token into the user data instead, where the operator chooses that. The node is named by
  its instance id and the kubelet is given ``--provider-id``.
* ``eks``: the AMI's own bootstrap with the labels and taint as kubelet flags: ``nodeadm``
  (AL2023; the user data is a MIME document holding a ``NodeConfig``) or
  ``/etc/eks/bootstrap.sh`` (AL2; the same script, ``eks-bootstrap`` branch). EKS names the node
  by its private DNS name and sets the providerID itself.

``node_labels`` and ``node_taints`` are the rendering in Python, for the source's placement code
and the tests to agree with the script on (the script computes the labels from the pool's
environment the same way, so it also works on its own).
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscaler.model import Pool
from autoscaler.model.config import EnvName
from autoscaler.model.errors import InputError
from autoscaler.model.secrets import read_secret_env

MANAGED_LABEL = "gpu-autoscaler.io/managed"
MARKET_LABEL = "gpu-autoscaler.io/market"
POOL_LABEL = "gpu-autoscaler.io/pool"
GPU_MODEL_LABEL = "gpu-autoscaler.io/gpu-model"
SPOT_TAINT_KEY = "gpu-autoscaler.io/spot"
SPOT_TAINT = f"{SPOT_TAINT_KEY}=true:NoSchedule"
OUR_PREFIX = "gpu-autoscaler.io/"
# Flags the join sets itself; an operator's kubelet_extra_args may not set them again.
OWN_KUBELET_FLAGS = frozenset(
    {"node-labels", "register-with-taints", "provider-id", "hostname-override"}
)
NODEADM_BOUNDARY = "gpu-autoscaler-nodeconfig"

_NOT_LABEL_CHAR = re.compile(rb"[^A-Za-z0-9_.-]")
_LEADING = re.compile(r"^[^A-Za-z0-9]+")
_TRAILING = re.compile(r"[^A-Za-z0-9]+\Z")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\Z")
_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\Z")
_FLAG_VALUE = re.compile(r'^[^\s"\\]*\Z')
_HOST_PORT = re.compile(r"^(https://)?([A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):([0-9]{1,5})/?\Z")
_HTTPS_URL = re.compile(r"^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?\Z")
_CA_HASH = re.compile(r"^sha256:[0-9a-f]{64}\Z")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}\Z")
_CIDR = re.compile(r"^[0-9a-fA-F.:]+/[0-9]{1,3}\Z")
_EKS_CLUSTER = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}\Z")
_AWS_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]+\Z")
# What each store names a secret with: a Secrets Manager name or ARN, a parameter name or ARN,
# a Secret Manager secret id, a Key Vault secret name.
_SECRET_NAMES = {
    "aws-secrets-manager": re.compile(r"^[A-Za-z0-9/_+=.@:-]{1,2048}\Z"),
    "aws-ssm": re.compile(r"^[A-Za-z0-9/_.:-]{1,2048}\Z"),
    "gcp-secret-manager": re.compile(r"^[A-Za-z0-9_-]{1,255}\Z"),
    "azure-key-vault": re.compile(r"^[A-Za-z0-9-]{1,127}\Z"),
}
_GCP_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]\Z")
_GCP_VERSION = re.compile(r"^(latest|[1-9][0-9]*)\Z")
_AZURE_VAULT = re.compile(r"^[A-Za-z][A-Za-z0-9-]{1,22}[A-Za-z0-9]\Z")
_AZURE_CLIENT_ID = re.compile(r"^[0-9a-fA-F-]{36}\Z")

Store = Literal[
    "aws-secrets-manager", "aws-ssm", "gcp-secret-manager", "azure-key-vault", "user-data"
]
# The fields each store reads; any other field given with it is a mistake.
_STORE_FIELDS: dict[str, frozenset[str]] = {
    "aws-secrets-manager": frozenset({"name", "region"}),
    "aws-ssm": frozenset({"name", "region"}),
    "gcp-secret-manager": frozenset({"name", "project", "version"}),
    "azure-key-vault": frozenset({"name", "vault", "vault_domain", "client_id"}),
    "user-data": frozenset({"value_env"}),
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "aws-secrets-manager": ("name",),
    "aws-ssm": ("name",),
    "gcp-secret-manager": ("name",),
    "azure-key-vault": ("name", "vault"),
    "user-data": ("value_env",),
}


class SecretRef(BaseModel):
    """Where the join script reads one secret at boot, through the instance's own identity; or,
    with ``store: user-data``, the controller's environment variable whose value is written into
    the user data in clear text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: Store = Field(
        description="aws-secrets-manager, aws-ssm (Parameter Store), gcp-secret-manager, "
        "azure-key-vault, or user-data (the value itself in the user data: readable on the "
        "instance and by anyone who may describe it)"
    )
    name: str | None = Field(
        None,
        description="the secret's name or ARN (Secrets Manager), the parameter's name or ARN "
        "(SSM), the secret id (GCP), the secret's name (Key Vault)",
    )
    region: str | None = Field(None, description="AWS: the store's region (default: the pool's)")
    project: str | None = Field(None, description="GCP: the project (default: the VM's own)")
    version: str | None = Field(None, description="GCP: the secret version (default: latest)")
    vault: str | None = Field(None, description="Azure: the Key Vault's name")
    vault_domain: str | None = Field(
        None, description="Azure: the Key Vault DNS suffix (default vault.azure.net)"
    )
    client_id: str | None = Field(
        None, description="Azure: the client id of the user-assigned identity to read it with"
    )
    value_env: EnvName | None = Field(
        None,
        description="user-data: the controller's environment variable that holds the value",
    )

    @model_validator(mode="after")
    def _fields_of_store(self) -> SecretRef:
        given = {name for name in _ALL_REF_FIELDS if getattr(self, name) is not None}
        stray = sorted(given - _STORE_FIELDS[self.store])
        if stray:
            raise ValueError(f"{stray[0]} is not read by store {self.store}")
        for name in _REQUIRED[self.store]:
            if name not in given:
                raise ValueError(f"store {self.store} needs {name}")
        problem = _ref_problem(self)
        if problem:
            raise ValueError(problem)
        return self


_ALL_REF_FIELDS = (
    "name",
    "region",
    "project",
    "version",
    "vault",
    "vault_domain",
    "client_id",
    "value_env",
)


def _ref_problem(ref: SecretRef) -> str | None:
    pattern = _SECRET_NAMES.get(ref.store)
    if pattern is not None and ref.name is not None and not pattern.match(ref.name):
        return f"name {ref.name[:80]!r} is not a secret name {ref.store} takes"
    checks = (
        (ref.region, _AWS_REGION, "region", "an AWS region (us-east-1)"),
        (ref.project, _GCP_PROJECT, "project", "a GCP project id"),
        (ref.version, _GCP_VERSION, "version", "latest or a version number"),
        (ref.vault, _AZURE_VAULT, "vault", "a Key Vault name (3 to 24 letters, digits, -)"),
        (ref.vault_domain, _DNS_SUBDOMAIN, "vault_domain", "a DNS suffix (vault.azure.net)"),
        (ref.client_id, _AZURE_CLIENT_ID, "client_id", "a client id (a GUID)"),
    )
    for value, pattern, field, expected in checks:
        if value is not None and not pattern.match(value):
            return f"{field} {value[:80]!r} is not {expected}"
    return None


def _checked_hash(value: str | None) -> str | None:
    if value is not None and not _CA_HASH.match(value):
        raise ValueError("expected sha256: and 64 lower-case hex digits (kubeadm's hash)")
    return value


class ProviderSecrets(BaseModel):
    """The token and CA hash for the pools of one provider, read from that cloud's own store
    (a pool in GCP cannot read AWS Secrets Manager through its identity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token_secret: SecretRef
    ca_cert_hash: str | None = None
    ca_cert_hash_secret: SecretRef | None = None

    @field_validator("ca_cert_hash")
    @classmethod
    def _hash(cls, value: str | None) -> str | None:
        return _checked_hash(value)

    @model_validator(mode="after")
    def _one_hash(self) -> ProviderSecrets:
        if self.ca_cert_hash is not None and self.ca_cert_hash_secret is not None:
            raise ValueError("give ca_cert_hash or ca_cert_hash_secret, not both")
        return self


class JoinSettings(BaseModel):
    """How a cloud node joins the cluster: ``method: kubeadm`` (a bootstrap token read at boot)
    or ``method: eks`` (the EKS AMI's own bootstrap). One flat block, each method's fields
    checked by the method, so an error names the field in the file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["kubeadm", "eks"]
    api_server: str | None = Field(
        None,
        description="kubeadm: the API server's host:port (the control plane endpoint); eks: "
        "the cluster's endpoint https://... (nodeadm needs it; bootstrap.sh asks EKS without it)",
    )
    token_secret: SecretRef | None = Field(
        None, description="kubeadm: where the bootstrap token is read from (docs)"
    )
    ca_cert_hash: str | None = Field(
        None,
        description="kubeadm: sha256:<hex> of the cluster CA's public key (not a secret: "
        "anyone who can reach the API server can compute it)",
    )
    ca_cert_hash_secret: SecretRef | None = Field(
        None, description="kubeadm: where the CA cert hash is read from, instead of ca_cert_hash"
    )
    by_provider: dict[str, ProviderSecrets] = Field(
        default_factory=dict,
        description="kubeadm: provider name -> its pools' token_secret and CA hash, for pools on "
        "several clouds (each reads its own cloud's store); others take the ones above",
    )
    kubeadm_api: Literal["v1beta3", "v1beta4"] = Field(
        "v1beta4",
        description="kubeadm: the JoinConfiguration's API version (v1beta4: kubeadm 1.31 and "
        "later; v1beta3: 1.22 to 1.30 and later ones that still read it)",
    )
    cluster_name: str | None = Field(None, description="eks: the EKS cluster's name")
    eks_bootstrap: Literal["nodeadm", "bootstrap.sh"] = Field(
        "nodeadm", description="eks: nodeadm (AL2023 AMIs) or bootstrap.sh (AL2 AMIs)"
    )
    certificate_authority: str | None = Field(
        None, description="eks: the cluster's CA data, base64 (as describe-cluster gives it)"
    )
    service_cidr: str | None = Field(
        None, description="eks: the cluster's service CIDR (nodeadm needs it)"
    )
    extra_labels: dict[str, str] = Field(
        default_factory=dict,
        description="more node labels (not gpu-autoscaler.io/, nor kubernetes.io/ or k8s.io/, "
        "which the NodeRestriction admission plugin refuses a kubelet)",
    )
    kubelet_extra_args: dict[str, str] = Field(
        default_factory=dict,
        description="more kubelet flags, name without -- : value (cloud-provider: external "
        "where a cloud controller manager runs)",
    )

    @field_validator("ca_cert_hash")
    @classmethod
    def _hash(cls, value: str | None) -> str | None:
        return _checked_hash(value)

    @field_validator("extra_labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            problem = label_problem(key, text)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("kubelet_extra_args")
    @classmethod
    def _kubelet_args(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _FLAG_NAME.match(name):
                raise ValueError(f"{name[:40]!r} is not a kubelet flag name (without --)")
            if name in OWN_KUBELET_FLAGS:
                raise ValueError(f"{name} is set by the join itself")
            if not _FLAG_VALUE.match(text):
                raise ValueError(f"{name}: the value holds a blank, quote or backslash")
        return value

    @model_validator(mode="after")
    def _fields_of_method(self) -> JoinSettings:
        problem = _kubeadm_problem(self) if self.method == "kubeadm" else _eks_problem(self)
        if problem:
            raise ValueError(problem)
        return self


_KUBEADM_ONLY = ("token_secret", "ca_cert_hash", "ca_cert_hash_secret")
_EKS_ONLY = ("cluster_name", "certificate_authority", "service_cidr")


def _kubeadm_problem(join: JoinSettings) -> str | None:
    for name in _EKS_ONLY:
        if getattr(join, name) is not None:
            return f"{name} is for method eks"
    if join.api_server is None:
        return "method kubeadm needs api_server (the API server's host:port)"
    if not _HOST_PORT.match(join.api_server):
        return f"api_server {join.api_server[:80]!r} is not host:port"
    if join.token_secret is None and not join.by_provider:
        return "method kubeadm needs token_secret (where the bootstrap token is read from)"
    if join.ca_cert_hash is not None and join.ca_cert_hash_secret is not None:
        return "give ca_cert_hash or ca_cert_hash_secret, not both"
    if join.ca_cert_hash is None and join.ca_cert_hash_secret is None:
        for provider, secrets in sorted(join.by_provider.items()):
            if secrets.ca_cert_hash is None and secrets.ca_cert_hash_secret is None:
                return (
                    "method kubeadm needs ca_cert_hash or ca_cert_hash_secret: "
                    f"by_provider.{provider} gives neither"
                )
        if not join.by_provider:
            return "method kubeadm needs ca_cert_hash or ca_cert_hash_secret"
    return None


def _eks_problem(join: JoinSettings) -> str | None:
    for name in _KUBEADM_ONLY:
        if getattr(join, name) is not None:
            return f"{name} is for method kubeadm"
    if join.by_provider:
        return "by_provider is for method kubeadm"
    if join.kubeadm_api != "v1beta4":
        return "kubeadm_api is for method kubeadm"
    if join.cluster_name is None:
        return "method eks needs cluster_name"
    if not _EKS_CLUSTER.match(join.cluster_name):
        return f"cluster_name {join.cluster_name[:80]!r} is not an EKS cluster name"
    if join.api_server is not None and not _HTTPS_URL.match(join.api_server):
        return f"api_server {join.api_server[:80]!r} is not the cluster's https:// endpoint"
    if join.certificate_authority is not None and not _BASE64.match(join.certificate_authority):
        return "certificate_authority is not base64 (the CA data describe-cluster gives)"
    if join.service_cidr is not None and not _CIDR.match(join.service_cidr):
        return f"service_cidr {join.service_cidr[:40]!r} is not a CIDR (10.100.0.0/16)"
    if (join.api_server is None) != (join.certificate_authority is None):
        return "give api_server and certificate_authority together, or neither"
    if join.eks_bootstrap == "nodeadm":
        missing = [
            name
            for name in ("api_server", "certificate_authority", "service_cidr")
            if getattr(join, name) is None
        ]
        if missing:
            return f"eks_bootstrap nodeadm needs {', '.join(missing)} (nodeadm asks EKS nothing)"
    elif join.service_cidr is not None:
        return "service_cidr is for eks_bootstrap nodeadm"
    return None


class KubernetesJoinSettings(BaseModel):
    """The join part of the ``kubernetes`` source's settings (the source's settings model
    inherits it): whether to render each pool's boot script, and how its nodes join."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    join_user_data: bool = Field(
        False,
        description="render the boot script of every pool that joins the scheduler (the join "
        "with the pool's labels and taint): the providers put it on the instances they launch "
        "as user data, startup-script or custom data (docs/kubernetes-join.md)",
    )
    join: JoinSettings | None = Field(
        None, description="how cloud nodes join: {method: kubeadm|eks, ...}"
    )

    @model_validator(mode="after")
    def _join_needs_both(self) -> KubernetesJoinSettings:
        if self.join_user_data and self.join is None:
            raise ValueError(
                "join_user_data renders the boot script from join: give join: {method: "
                "kubeadm, api_server, token_secret, ca_cert_hash} or {method: eks, cluster_name}"
            )
        if self.join is not None and not self.join_user_data:
            raise ValueError(
                "join shapes the boot script that join_user_data renders: set join_user_data: "
                "true, or remove join"
            )
        return self


# -- labels and taints ------------------------------------------------------------------------


def label_value(text: str) -> str:
    """``text`` as a label value (as the script's ``label_value``): each UTF-8 byte outside
    ``A-Za-z0-9_.-`` becomes ``-``, the ends are trimmed to a letter or digit, at most 63."""
    raw = _NOT_LABEL_CHAR.sub(b"-", text.encode()).decode("ascii")
    return _TRAILING.sub("", _LEADING.sub("", raw)[:63])


def label_problem(key: str, value: str) -> str | None:
    """Why ``key=value`` cannot be one of the operator's extra node labels, or None."""
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or (prefix and not _DNS_SUBDOMAIN.match(prefix)):
        return f"{key[:80]!r} is not a label key ([prefix/]name)"
    if key.startswith(OUR_PREFIX):
        return f"{key}: the gpu-autoscaler.io/ labels are the pool's"
    kube = prefix in ("kubernetes.io", "k8s.io") or prefix.endswith((".kubernetes.io", ".k8s.io"))
    allowed = any(
        prefix == space or prefix.endswith("." + space)
        for space in ("node.kubernetes.io", "kubelet.kubernetes.io")
    )
    if kube and not allowed:
        return f"{key}: a kubelet may not set labels under {prefix}/ (NodeRestriction)"
    if not _LABEL_VALUE.match(value):
        return f"{key}: {value[:80]!r} is not a label value"
    return None


def node_labels(pool: Pool) -> dict[str, str]:
    """The labels a node of ``pool`` joins with, in the script's order (no pool or model label
    when the name or model leaves nothing a label value may hold)."""
    labels = {MANAGED_LABEL: "true", MARKET_LABEL: pool.market.value}
    name = label_value(pool.name)
    if name:
        labels[POOL_LABEL] = name
    model = label_value(pool.gpu_model or "")
    if model:
        labels[GPU_MODEL_LABEL] = model
    return labels


def node_taints(pool: Pool) -> list[str]:
    """The taints a node of ``pool`` joins with (``key=value:Effect``): spot nodes only."""
    return [SPOT_TAINT] if pool.is_spot else []


# -- rendering --------------------------------------------------------------------------------


def join_script() -> str:
    """The text of ``join-kubernetes-node.sh`` as shipped."""
    return (resources.files("autoscaler") / "data/kubernetes/join-kubernetes-node.sh").read_text()


def join_user_data(pool: Pool, settings: KubernetesJoinSettings, source: str) -> str | None:
    """The boot script of an instance of ``pool`` when ``join_user_data`` asks for it (what the
    source's ``RendersJoinScript.join_user_data`` returns); ``source`` is the source's name, for
    an error to name its field."""
    if not settings.join_user_data or settings.join is None:
        return None
    return user_data(pool, settings.join, field=f"sources.{source}.join")


def user_data(pool: Pool, join: JoinSettings, field: str = "join") -> str:
    """The user data that joins an instance of ``pool`` the way ``join`` says: the script with
    the pool's environment written in, or (EKS nodeadm) a MIME document holding a NodeConfig.
    Raises ``InputError`` naming ``field``'s part when a ``user-data`` secret's variable is
    unset or a pool's provider has no secrets to read."""
    if join.method == "eks" and join.eks_bootstrap == "nodeadm":
        return nodeadm_user_data(pool, join)
    environment = join_environment(pool, join, field)
    exports = "".join(
        f"export {name}={shlex.quote(value)}\n" for name, value in environment.items()
    )
    shebang, _, body = join_script().partition("\n")
    clear = "GPU_AUTOSCALER_TOKEN" in environment
    warning = "# holds the bootstrap token in clear text (store: user-data)\n" if clear else ""
    return f"{shebang}\n# gpu-autoscaler pool {pool.name}\n{warning}{exports}{body}"


def join_environment(pool: Pool, join: JoinSettings, field: str = "join") -> dict[str, str]:
    """The script's environment for a node of ``pool``: what it carries, then how it joins."""
    environment = {
        "GPU_AUTOSCALER_JOIN_METHOD": "kubeadm" if join.method == "kubeadm" else "eks-bootstrap",
        "GPU_AUTOSCALER_MARKET": pool.market.value,
        "GPU_AUTOSCALER_POOL": pool.name,
    }
    if pool.gpu_model:
        # NUL cannot be in a shell's variable; it is a '-' in the label either way.
        environment["GPU_AUTOSCALER_GPU_MODEL"] = pool.gpu_model.replace("\0", "-")
    if join.extra_labels:
        environment["GPU_AUTOSCALER_EXTRA_LABELS"] = ",".join(
            f"{key}={value}" for key, value in join.extra_labels.items()
        )
    if join.kubelet_extra_args:
        environment["GPU_AUTOSCALER_KUBELET_ARGS"] = " ".join(
            f"{name}={value}" for name, value in join.kubelet_extra_args.items()
        )
    if join.method == "eks":
        assert join.cluster_name is not None  # checked by JoinSettings
        environment["GPU_AUTOSCALER_EKS_CLUSTER"] = join.cluster_name
        if join.api_server is not None and join.certificate_authority is not None:
            environment["GPU_AUTOSCALER_EKS_API_SERVER"] = join.api_server
            environment["GPU_AUTOSCALER_EKS_CA"] = join.certificate_authority
        return environment
    assert join.api_server is not None  # checked by JoinSettings
    environment["GPU_AUTOSCALER_API_SERVER"] = _host_port(join.api_server)
    environment["GPU_AUTOSCALER_KUBEADM_API"] = join.kubeadm_api
    token, hash_value, hash_ref, where = _secrets_of(pool, join, field)
    environment.update(_secret_environment("TOKEN", token, pool, f"{where}.token_secret"))
    if hash_ref is not None:
        environment.update(
            _secret_environment("CA_CERT_HASH", hash_ref, pool, f"{where}.ca_cert_hash_secret")
        )
    else:
        assert hash_value is not None  # checked by JoinSettings
        environment["GPU_AUTOSCALER_CA_CERT_HASH"] = hash_value
    return environment


def _host_port(api_server: str) -> str:
    return api_server.removeprefix("https://").rstrip("/")


def _secrets_of(
    pool: Pool, join: JoinSettings, field: str
) -> tuple[SecretRef, str | None, SecretRef | None, str]:
    """The token reference and the CA hash (a value or a reference) for ``pool``: its
    provider's ``by_provider`` entry over the defaults, and the field they were given at."""
    own = join.by_provider.get(pool.provider)
    if own is None:
        if join.token_secret is None:
            raise InputError(
                "config",
                f"pool {pool.name}'s provider {pool.provider!r} has no entry here and join has "
                f"no token_secret: add by_provider.{pool.provider} (entries: "
                f"{', '.join(sorted(join.by_provider))})",
                field=f"{field}.by_provider",
            )
        return join.token_secret, join.ca_cert_hash, join.ca_cert_hash_secret, field
    where = f"{field}.by_provider.{pool.provider}"
    if own.ca_cert_hash is None and own.ca_cert_hash_secret is None:
        return own.token_secret, join.ca_cert_hash, join.ca_cert_hash_secret, where
    return own.token_secret, own.ca_cert_hash, own.ca_cert_hash_secret, where


def _secret_environment(what: str, ref: SecretRef, pool: Pool, field: str) -> dict[str, str]:
    """The script's variables for one secret: its store and name, or (user-data) its value."""
    prefix = f"GPU_AUTOSCALER_{what}"
    if ref.store == "user-data":
        assert ref.value_env is not None  # checked by SecretRef
        value = read_secret_env(ref.value_env, "config", f"{field}.value_env").strip()
        if not value:
            raise InputError(
                "config",
                f"{ref.value_env} is not set in the controller's environment (the value the "
                "user data is to carry)",
                field=f"{field}.value_env",
            )
        return {prefix: value}
    assert ref.name is not None  # checked by SecretRef
    environment = {f"{prefix}_STORE": ref.store, f"{prefix}_NAME": ref.name}
    if ref.store.startswith("aws-"):
        environment[f"{prefix}_REGION"] = ref.region or pool.region
    elif ref.store == "gcp-secret-manager":
        environment[f"{prefix}_PROJECT"] = ref.project or ""
        environment[f"{prefix}_VERSION"] = ref.version or "latest"
    else:
        assert ref.vault is not None  # checked by SecretRef
        environment[f"{prefix}_VAULT"] = ref.vault
        environment[f"{prefix}_VAULT_DOMAIN"] = ref.vault_domain or "vault.azure.net"
        if ref.client_id:
            environment[f"{prefix}_CLIENT_ID"] = ref.client_id
    return environment


def kubelet_flags(pool: Pool, join: JoinSettings) -> list[str]:
    """The kubelet flags an EKS node of ``pool`` joins with: labels, taint, the operator's."""
    labels = {**node_labels(pool), **join.extra_labels}
    flags = ["--node-labels=" + ",".join(f"{key}={value}" for key, value in labels.items())]
    taints = node_taints(pool)
    if taints:
        flags.append("--register-with-taints=" + ",".join(taints))
    flags += [f"--{name}={value}" for name, value in join.kubelet_extra_args.items()]
    return flags


def nodeadm_user_data(pool: Pool, join: JoinSettings) -> str:
    """An AL2023 EKS node's user data: a MIME multi-part document with one NodeConfig, which
    nodeadm reads at boot (it asks EKS nothing, so the endpoint, CA and CIDR are written in)."""
    node_config = {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {
                "name": join.cluster_name,
                "apiServerEndpoint": join.api_server,
                "certificateAuthority": join.certificate_authority,
                "cidr": join.service_cidr,
            },
            "kubelet": {"flags": kubelet_flags(pool, join)},
        },
    }
    document = yaml.safe_dump(node_config, sort_keys=False, width=1_000_000)
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{NODEADM_BOUNDARY}"\n'
        "\n"
        f"--{NODEADM_BOUNDARY}\n"
        "Content-Type: application/node.eks.aws\n"
        "\n"
        f"# gpu-autoscaler pool {pool.name}\n"
        "---\n"
        f"{document}\n"
        f"--{NODEADM_BOUNDARY}--\n"
    )
