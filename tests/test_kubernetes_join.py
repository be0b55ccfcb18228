"""Cloud nodes join the Kubernetes cluster (issue 18, item 2), tested by rendering.

``kubernetes_join.user_data`` renders a pool's boot script: ``join-kubernetes-node.sh`` with the
pool's environment written in (kubeadm, or EKS's ``bootstrap.sh``), or a MIME document holding an
EKS ``NodeConfig`` (nodeadm). Each rendered script is checked by ``bash -n`` and run, under dash
(``sh``) and bash, in a sandbox whose ``PATH`` holds recording stand-ins for ``kubeadm``,
``aws``, ``curl`` (the clouds' metadata servers, GCP Secret Manager and Azure Key Vault answer
through it, by exact URL) and ``bootstrap.sh``: the join must carry exactly the labels and taint
``node_labels``/``node_taints`` give, the token and CA hash of the store the settings name, and
the instance's id and providerID from its cloud's metadata. The token must not be in the user
data unless the operator asked for it (``store: user-data``).
"""

from __future__ import annotations

import email
import shutil
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waits import bound

from autoscaler.model import Market, Pool
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import validate_settings
from autoscaler.model.secrets import scrub
from autoscaler.sources.kubernetes_join import (
    SPOT_TAINT,
    JoinSettings,
    KubernetesJoinSettings,
    join_script,
    join_user_data,
    kubelet_flags,
    label_value,
    node_labels,
    node_taints,
    user_data,
)

SEP = "\x1f"
AWS_TOKEN = "aws001.0123456789abcdef"
SSM_TOKEN = "ssm002.0123456789abcdef"
GCP_TOKEN = "gcp003.0123456789abcdef"
AZURE_TOKEN = "azr004.0123456789abcdef"
CLEAR_TOKEN = "clr005.0123456789abcdef"
CA_HASH = "sha256:" + "ab" * 32
STORED_HASH = "sha256:" + "cd" * 32
API_SERVER = "k8s-api.example.internal:6443"

AWS_ID, AWS_ZONE = "i-0abc123def4567890", "us-east-1a"
GCP_NAME, GCP_PROJECT, GCP_ZONE = "gpu-join-3f2a9c-0", "gpu-project-1", "us-central1-a"
AZURE_NAME = "gpu-9c1e7b5d2a04-0"
AZURE_RESOURCE = (
    "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/gpu-rg"
    f"/providers/Microsoft.Compute/virtualMachines/{AZURE_NAME}"
)
GCP_ACCESS, AZURE_ACCESS = "ya29.fake-access", "eyJ0eXAi.fake-access"
VAULT = "gpu-join-vault"

AWS_MD = "http://169.254.169.254/latest"
GCP_MD = "http://metadata.google.internal/computeMetadata/v1"
AZURE_MD = "http://169.254.169.254/metadata"
AZURE_QUERY = "api-version=2021-02-01&format=text"
GCP_SECRETS = f"https://secretmanager.googleapis.com/v1/projects/{GCP_PROJECT}/secrets"


def gcp_payload(text: str) -> str:
    """Secret Manager's answer to versions/...:access, pretty-printed as Google's APIs answer."""
    import base64

    data = base64.b64encode(text.encode()).decode()
    return (
        "{\n"
        f'  "name": "projects/123/secrets/x/versions/1",\n'
        '  "payload": {\n'
        f'    "data": "{data}",\n'
        '    "dataCrc32c": "12345"\n'
        "  }\n"
        "}\n"
    )


# What each cloud's endpoints answer, by exact URL (anything else: curl's exit 22, as a 404).
CLOUD_ANSWERS: dict[str, dict[str, str]] = {
    "aws": {
        f"{AWS_MD}/api/token": "imds-session-token",
        f"{AWS_MD}/meta-data/instance-id": AWS_ID,
        f"{AWS_MD}/meta-data/placement/availability-zone": AWS_ZONE,
    },
    "gcp": {
        f"{GCP_MD}/instance/name": GCP_NAME,
        f"{GCP_MD}/instance/zone": f"projects/123456789/zones/{GCP_ZONE}",
        f"{GCP_MD}/project/project-id": GCP_PROJECT,
        f"{GCP_MD}/instance/service-accounts/default/token": (
            f'{{"access_token":"{GCP_ACCESS}","expires_in":3599,"token_type":"Bearer"}}'
        ),
        f"{GCP_SECRETS}/k8s-join-token/versions/latest:access": gcp_payload(GCP_TOKEN + "\n"),
        f"{GCP_SECRETS}/k8s-ca-hash/versions/3:access": gcp_payload(STORED_HASH),
    },
    "azure": {
        f"{AZURE_MD}/instance/compute/name?{AZURE_QUERY}": AZURE_NAME,
        f"{AZURE_MD}/instance/compute/resourceId?{AZURE_QUERY}": AZURE_RESOURCE,
        f"{AZURE_MD}/identity/oauth2/token?api-version=2018-02-01"
        "&resource=https%3A%2F%2Fvault.azure.net": (
            f'{{"access_token":"{AZURE_ACCESS}","expires_in":"86399",'
            '"resource":"https://vault.azure.net","token_type":"Bearer"}'
        ),
        f"https://{VAULT}.vault.azure.net/secrets/k8s-join-token?api-version=7.4": (
            f'{{"value":"{AZURE_TOKEN}","id":"https://{VAULT}.vault.azure.net/secrets/'
            'k8s-join-token/0a1b","attributes":{"enabled":true}}'
        ),
    },
}
AWS_SECRETS = {
    "secretsmanager:k8s-join-token": AWS_TOKEN,
    "ssm:/k8s/join-token": SSM_TOKEN,
    "ssm:/k8s/ca-hash": STORED_HASH,
}
EXPECTED_NODE = {
    "aws": (AWS_ID, f"aws:///{AWS_ZONE}/{AWS_ID}"),
    "gcp": (GCP_NAME, f"gce://{GCP_PROJECT}/{GCP_ZONE}/{GCP_NAME}"),
    "azure": (AZURE_NAME, f"azure://{AZURE_RESOURCE}"),
}


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def recorder(path: Path, log: Path, body: str = "") -> None:
    """A stand-in command: records its arguments (one call a line, fields split by 0x1f), then
    runs ``body``."""
    path.write_text(
        "#!/bin/sh\n"
        f"{{ for a; do printf '%s\\037' \"$a\"; done; printf '\\n'; }} >> {shell_quote(str(log))}\n"
        + body
    )
    path.chmod(0o755)


class Sandbox:
    """A directory with the stand-ins on ``PATH`` and an instance of ``cloud`` behind ``curl``."""

    def __init__(self, root: Path, cloud: str) -> None:
        self.root = root
        self.bin = root / "bin"
        self.answers = root / "answers"
        self.tmp = root / "tmp"
        self.kube_dir = root / "etc-kubernetes"
        for folder in (self.bin, self.answers, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        self._curl(CLOUD_ANSWERS[cloud])
        self._aws()
        recorder(
            self.bin / "kubeadm",
            self.log("kubeadm"),
            "while [ $# -gt 0 ]; do\n"
            '  if [ "$1" = --config ]; then\n'
            f'    cp "$2" {shell_quote(str(root / "join.yaml"))}\n'
            f'    stat -c %a "$2" > {shell_quote(str(root / "join.mode"))}\n'
            "  fi\n"
            "  shift\n"
            "done\n"
            'exit "${KUBEADM_EXIT:-0}"\n',
        )
        self.bootstrap = self.bin / "bootstrap.sh"
        recorder(self.bootstrap, self.log("bootstrap"))

    def log(self, name: str) -> Path:
        return self.root / f"{name}.calls"

    def _curl(self, answers: Mapping[str, str]) -> None:
        cases = []
        for index, (url, text) in enumerate(answers.items()):
            (self.answers / str(index)).write_text(text)
            cases.append(
                f"  {shell_quote(url)}) cat {shell_quote(str(self.answers / str(index)))} ;;\n"
            )
        recorder(
            self.bin / "curl",
            self.log("curl"),
            'url=""\nfor a; do case "$a" in http*) url="$a" ;; esac; done\n'
            'case "$url" in\n' + "".join(cases) + "  *) exit 22 ;;\nesac\n",
        )

    def _aws(self) -> None:
        cases = []
        for key, text in AWS_SECRETS.items():
            cases.append(f"  {shell_quote(key)}) printf '%s\\n' {shell_quote(text)} ;;\n")
        recorder(
            self.bin / "aws",
            self.log("aws"),
            'service="$1"; name=""\n'
            'while [ $# -gt 0 ]; do\n  case "$1" in --secret-id | --name) name="$2" ;; esac\n'
            "  shift\ndone\n"
            'case "$service:$name" in\n' + "".join(cases) + "  *) exit 254 ;;\nesac\n",
        )

    def run(
        self, script: str, shell: str = "sh", env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        path = self.root / "boot.sh"
        path.write_text(script)
        return subprocess.run(
            [shell, str(path)],
            env={
                "PATH": f"{self.bin}:/usr/bin:/bin",
                "TMPDIR": str(self.tmp),
                "GPU_AUTOSCALER_KUBERNETES_DIR": str(self.kube_dir),
                "GPU_AUTOSCALER_EKS_BOOTSTRAP": str(self.bootstrap),
                **(env or {}),
            },
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )

    def calls(self, name: str) -> list[list[str]]:
        log = self.log(name)
        if not log.exists():
            return []
        return [line.split(SEP)[:-1] for line in log.read_text().splitlines()]

    def join_config(self) -> dict[str, Any]:
        loaded = yaml.safe_load((self.root / "join.yaml").read_text())
        assert isinstance(loaded, dict)
        return loaded

    def reset(self) -> None:
        for name in ("kubeadm", "bootstrap", "curl", "aws"):
            self.log(name).unlink(missing_ok=True)
        (self.root / "join.yaml").unlink(missing_ok=True)


def pool(
    name: str = "gpu-a100-spot",
    market: Market = Market.SPOT,
    provider: str = "aws",
    gpu_model: str | None = "NVIDIA A100 40GB",
) -> Pool:
    return Pool(
        name=name,
        provider=provider,
        region="us-east-1",
        instance_type="p4d.24xlarge",
        gpus_per_instance=8,
        gpu_model=gpu_model,
        market=market,
    )


def kubeadm(**fields: Any) -> JoinSettings:
    return JoinSettings.model_validate({"method": "kubeadm", "api_server": API_SERVER, **fields})


# The stores a kubeadm join reads its token (and CA hash) from, with the cloud that can.
STORES: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "aws-secrets-manager": (
        "aws",
        {
            "token_secret": {"store": "aws-secrets-manager", "name": "k8s-join-token"},
            "ca_cert_hash": CA_HASH,
        },
        AWS_TOKEN,
        CA_HASH,
    ),
    "aws-ssm": (
        "aws",
        {
            "token_secret": {"store": "aws-ssm", "name": "/k8s/join-token", "region": "eu-west-1"},
            "ca_cert_hash_secret": {"store": "aws-ssm", "name": "/k8s/ca-hash"},
        },
        SSM_TOKEN,
        STORED_HASH,
    ),
    "gcp-secret-manager": (
        "gcp",
        {
            "token_secret": {"store": "gcp-secret-manager", "name": "k8s-join-token"},
            "ca_cert_hash_secret": {
                "store": "gcp-secret-manager",
                "name": "k8s-ca-hash",
                "project": GCP_PROJECT,
                "version": "3",
            },
        },
        GCP_TOKEN,
        STORED_HASH,
    ),
    "azure-key-vault": (
        "azure",
        {
            "token_secret": {"store": "azure-key-vault", "name": "k8s-join-token", "vault": VAULT},
            "ca_cert_hash": CA_HASH,
        },
        AZURE_TOKEN,
        CA_HASH,
    ),
    "user-data": (
        "gcp",
        {
            "token_secret": {"store": "user-data", "value_env": "K8S_JOIN_TOKEN"},
            "ca_cert_hash": CA_HASH,
        },
        CLEAR_TOKEN,
        CA_HASH,
    ),
}


def taint_strings(config: dict[str, Any]) -> list[str]:
    return [f"{t['key']}={t['value']}:{t['effect']}" for t in config["nodeRegistration"]["taints"]]


def kubelet_args(config: dict[str, Any]) -> dict[str, str]:
    """nodeRegistration.kubeletExtraArgs as name -> value (a list in v1beta4, a map in v1beta3)."""
    args = config["nodeRegistration"]["kubeletExtraArgs"]
    if isinstance(args, dict):
        return {str(k): str(v) for k, v in args.items()}
    names = [item["name"] for item in args]
    assert len(names) == len(set(names)), "a flag given twice"
    return {item["name"]: item["value"] for item in args}


def labels_of(flag_value: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in flag_value.split(",")]
    assert len({key for key, _ in pairs}) == len(pairs), "a label given twice"
    return dict(pairs)


def syntax_ok(script: str, tmp_path: Path) -> None:
    path = tmp_path / "rendered.sh"
    path.write_text(script)
    for shell in ("bash", "sh"):
        checked = subprocess.run(
            [shell, "-n", str(path)], capture_output=True, text=True, timeout=bound(60), check=False
        )
        assert checked.returncode == 0, (shell, checked.stderr)


# -- kubeadm, on each cloud, with each store ----------------------------------------------------


@pytest.mark.parametrize("market", [Market.SPOT, Market.ON_DEMAND], ids=lambda m: m.value)
@pytest.mark.parametrize("store", list(STORES))
def test_kubeadm_join_carries_the_pools_labels_taint_token_and_node_name(
    store: str, market: Market, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud, fields, token, ca_hash = STORES[store]
    monkeypatch.setenv("K8S_JOIN_TOKEN", CLEAR_TOKEN)
    the_pool = pool(f"{cloud}-a100-{market.value}", market, provider=cloud)
    join = kubeadm(**fields)
    script = user_data(the_pool, join)

    if store == "user-data":
        assert token in script and "clear text" in script
        assert token not in scrub(script), "the controller's logs never show it"
    else:
        assert token not in script and "clear text" not in script
    if "ca_cert_hash_secret" in fields:
        assert ca_hash not in script
    assert script.startswith("#!/bin/sh\n") and script.endswith(join_script().partition("\n")[2])
    syntax_ok(script, tmp_path)

    sandbox = Sandbox(tmp_path / "sandbox", cloud)
    for shell in ("sh", "bash"):
        sandbox.reset()
        done = sandbox.run(script, shell)
        assert done.returncode == 0, done.stderr
        assert token not in done.stdout + done.stderr

        (call,) = sandbox.calls("kubeadm")
        assert call[:2] == ["join", "--config"] and len(call) == 3
        assert (tmp_path / "sandbox" / "join.mode").read_text().strip() == "600"
        assert not list(sandbox.tmp.iterdir()), "the file holding the token is removed"

        config = sandbox.join_config()
        assert config["apiVersion"] == "kubeadm.k8s.io/v1beta4"
        assert config["kind"] == "JoinConfiguration"
        discovery = config["discovery"]
        assert discovery["bootstrapToken"] == {
            "apiServerEndpoint": API_SERVER,
            "token": token,
            "caCertHashes": [ca_hash],
        }
        assert discovery["tlsBootstrapToken"] == token
        name, provider_id = EXPECTED_NODE[cloud]
        assert config["nodeRegistration"]["name"] == name
        assert taint_strings(config) == node_taints(the_pool)
        assert taint_strings(config) == ([SPOT_TAINT] if market is Market.SPOT else [])
        args = kubelet_args(config)
        assert args == {"node-labels": args["node-labels"], "provider-id": provider_id}
        assert labels_of(args["node-labels"]) == node_labels(the_pool)
        assert node_labels(the_pool) == {
            "gpu-autoscaler.io/managed": "true",
            "gpu-autoscaler.io/market": market.value,
            "gpu-autoscaler.io/pool": the_pool.name,
            "gpu-autoscaler.io/gpu-model": "NVIDIA-A100-40GB",
        }
        assert_read_from(store, sandbox)


def assert_read_from(store: str, sandbox: Sandbox) -> None:
    """The secrets were read from the store the settings name, as each store is asked."""
    aws_calls = sandbox.calls("aws")
    secret_urls = [
        call for call in sandbox.calls("curl") if any(a.startswith("https://") for a in call)
    ]
    if store == "aws-secrets-manager":
        assert aws_calls == [
            [
                "secretsmanager",
                "get-secret-value",
                "--region",
                "us-east-1",
                "--secret-id",
                "k8s-join-token",
                "--query",
                "SecretString",
                "--output",
                "text",
            ]
        ]
    elif store == "aws-ssm":
        decrypted = ["--with-decryption", "--query", "Parameter.Value", "--output", "text"]
        assert aws_calls == [
            [
                "ssm",
                "get-parameter",
                "--region",
                "eu-west-1",
                "--name",
                "/k8s/join-token",
                *decrypted,
            ],
            ["ssm", "get-parameter", "--region", "us-east-1", "--name", "/k8s/ca-hash", *decrypted],
        ]
    else:
        assert aws_calls == []
    if store == "gcp-secret-manager":
        assert [call[-1] for call in secret_urls] == [
            f"{GCP_SECRETS}/k8s-join-token/versions/latest:access",
            f"{GCP_SECRETS}/k8s-ca-hash/versions/3:access",
        ]
        assert all(f"Authorization: Bearer {GCP_ACCESS}" in call for call in secret_urls)
    elif store == "azure-key-vault":
        assert [call[-1] for call in secret_urls] == [
            f"https://{VAULT}.vault.azure.net/secrets/k8s-join-token?api-version=7.4"
        ]
        assert all(f"Authorization: Bearer {AZURE_ACCESS}" in call for call in secret_urls)
    else:
        assert secret_urls == []


def test_v1beta3_and_the_operators_labels_and_kubelet_flags(tmp_path: Path) -> None:
    the_pool = pool(market=Market.ON_DEMAND)
    join = kubeadm(
        token_secret={"store": "aws-secrets-manager", "name": "k8s-join-token"},
        ca_cert_hash=CA_HASH,
        kubeadm_api="v1beta3",
        extra_labels={"team": "ml", "example.com/tier": "batch"},
        kubelet_extra_args={"max-pods": "110", "cloud-provider": "external"},
    )
    sandbox = Sandbox(tmp_path, "aws")
    done = sandbox.run(user_data(the_pool, join))
    assert done.returncode == 0, done.stderr
    config = sandbox.join_config()
    assert config["apiVersion"] == "kubeadm.k8s.io/v1beta3"
    assert config["nodeRegistration"]["taints"] == []
    args = config["nodeRegistration"]["kubeletExtraArgs"]
    assert args == {
        "node-labels": args["node-labels"],
        "provider-id": f"aws:///{AWS_ZONE}/{AWS_ID}",
        "max-pods": "110",
        "cloud-provider": "external",
    }
    assert labels_of(args["node-labels"]) == {
        **node_labels(the_pool),
        "team": "ml",
        "example.com/tier": "batch",
    }


def test_pools_on_several_clouds_read_their_own_clouds_store(tmp_path: Path) -> None:
    join = kubeadm(
        token_secret={"store": "aws-secrets-manager", "name": "k8s-join-token"},
        ca_cert_hash=CA_HASH,
        by_provider={
            "gcp-east": {
                "token_secret": {"store": "gcp-secret-manager", "name": "k8s-join-token"},
            }
        },
    )
    on_gcp = pool("gcp-spot", provider="gcp-east")
    script = user_data(on_gcp, join)
    sandbox = Sandbox(tmp_path, "gcp")
    done = sandbox.run(script)
    assert done.returncode == 0, done.stderr
    config = sandbox.join_config()
    assert config["discovery"]["bootstrapToken"]["token"] == GCP_TOKEN
    assert config["discovery"]["bootstrapToken"]["caCertHashes"] == [CA_HASH]
    assert "GPU_AUTOSCALER_TOKEN_STORE=aws-secrets-manager" in user_data(pool(), join)

    only_gcp = kubeadm(
        ca_cert_hash=CA_HASH,
        by_provider={"gcp-east": {"token_secret": {"store": "gcp-secret-manager", "name": "t"}}},
    )
    with pytest.raises(InputError) as raised:
        user_data(pool("aws-spot", provider="aws"), only_gcp, field="sources.k8s.join")
    assert str(raised.value).startswith("config: sources.k8s.join.by_provider: pool aws-spot")
    assert "gcp-east" in str(raised.value)


def test_a_joined_node_is_left_alone_at_its_next_boot(tmp_path: Path) -> None:
    """GCP runs the startup-script at every boot: kubeadm join must not run twice."""
    sandbox = Sandbox(tmp_path, "gcp")
    sandbox.kube_dir.mkdir()
    (sandbox.kube_dir / "kubelet.conf").write_text("apiVersion: v1\n")
    join = kubeadm(
        token_secret={"store": "gcp-secret-manager", "name": "k8s-join-token"},
        ca_cert_hash=CA_HASH,
    )
    done = sandbox.run(user_data(pool(provider="gcp"), join))
    assert done.returncode == 0, done.stderr
    assert "joined already" in done.stdout
    assert sandbox.calls("kubeadm") == [] and sandbox.calls("curl") == []


def test_a_failed_join_fails_the_boot_script_and_leaves_no_token_behind(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path, "aws")
    join = kubeadm(
        token_secret={"store": "aws-secrets-manager", "name": "k8s-join-token"},
        ca_cert_hash=CA_HASH,
    )
    done = sandbox.run(user_data(pool(), join), env={"KUBEADM_EXIT": "3"})
    assert done.returncode == 3
    assert not list(sandbox.tmp.iterdir())


def test_a_secret_that_is_no_token_stops_the_join_without_showing_it(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path, "aws")
    # the store answers with something else (a JSON secret, an error text)
    join = kubeadm(
        token_secret={"store": "aws-ssm", "name": "/k8s/ca-hash"},
        ca_cert_hash=CA_HASH,
    )
    done = sandbox.run(user_data(pool(), join))
    assert done.returncode == 1
    assert "bootstrap token read is not of the form" in done.stderr
    assert STORED_HASH not in done.stderr + done.stdout
    assert sandbox.calls("kubeadm") == []

    missing = kubeadm(
        token_secret={"store": "aws-secrets-manager", "name": "no-such-secret"},
        ca_cert_hash=CA_HASH,
    )
    done = sandbox.run(user_data(pool(), missing))
    assert done.returncode == 1
    assert "cannot read the bootstrap token (aws-secrets-manager no-such-secret)" in done.stderr
    assert sandbox.calls("kubeadm") == []


def test_the_script_alone_refuses_a_node_that_does_not_know_its_market(tmp_path: Path) -> None:
    """A spot node joined without the taint would take protected pods: no market, no join."""
    sandbox = Sandbox(tmp_path, "aws")
    done = sandbox.run(
        join_script(),
        env={
            "GPU_AUTOSCALER_API_SERVER": API_SERVER,
            "GPU_AUTOSCALER_TOKEN": CLEAR_TOKEN,
            "GPU_AUTOSCALER_CA_CERT_HASH": CA_HASH,
        },
    )
    assert done.returncode == 1
    assert "GPU_AUTOSCALER_MARKET '' is not spot or on-demand" in done.stderr
    assert sandbox.calls("kubeadm") == []


def test_the_script_alone_without_a_token_or_its_store_says_so(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path, "aws")
    base = {"GPU_AUTOSCALER_MARKET": "spot", "GPU_AUTOSCALER_API_SERVER": API_SERVER}
    for extra, says in (
        ({}, "join-kubernetes-node: GPU_AUTOSCALER_TOKEN and _TOKEN_STORE are unset"),
        (
            {"GPU_AUTOSCALER_TOKEN_STORE": "vault"},
            "join-kubernetes-node: no store 'vault' (GPU_AUTOSCALER_TOKEN_STORE)",
        ),
    ):
        done = sandbox.run(join_script(), env={**base, **extra})
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert lines[0] == says
        assert lines[1].startswith("join-kubernetes-node: cannot read the bootstrap token")
        assert sandbox.calls("kubeadm") == []


def test_no_cloud_metadata_and_no_name_given_is_one_line(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path, "aws")
    (sandbox.bin / "curl").write_text("#!/bin/sh\nexit 7\n")
    join = kubeadm(
        token_secret={"store": "aws-secrets-manager", "name": "k8s-join-token"},
        ca_cert_hash=CA_HASH,
    )
    done = sandbox.run(user_data(pool(), join))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "join-kubernetes-node: no cloud metadata answered; set GPU_AUTOSCALER_NODE_NAME and "
        "_PROVIDER_ID"
    ]
    done = sandbox.run(
        user_data(pool(), join),
        env={"GPU_AUTOSCALER_NODE_NAME": "GPU-Node-7", "GPU_AUTOSCALER_PROVIDER_ID": "kwok://n7"},
    )
    assert done.returncode == 0, done.stderr
    assert sandbox.join_config()["nodeRegistration"]["name"] == "gpu-node-7"


# -- EKS ------------------------------------------------------------------------------------------

EKS_ENDPOINT = "https://ABCDEF0123456789.gr7.us-east-1.eks.amazonaws.com"
EKS_CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUM="


@pytest.mark.parametrize("market", [Market.SPOT, Market.ON_DEMAND], ids=lambda m: m.value)
def test_eks_bootstrap_sh_gets_the_labels_and_taint_as_kubelet_flags(
    market: Market, tmp_path: Path
) -> None:
    the_pool = pool(market=market)
    join = JoinSettings(
        method="eks",
        cluster_name="gpu-cluster",
        eks_bootstrap="bootstrap.sh",
        api_server=EKS_ENDPOINT,
        certificate_authority=EKS_CA,
        kubelet_extra_args={"max-pods": "58"},
    )
    script = user_data(the_pool, join)
    syntax_ok(script, tmp_path)
    sandbox = Sandbox(tmp_path / "sandbox", "aws")
    done = sandbox.run(script)
    assert done.returncode == 0, done.stderr
    (call,) = sandbox.calls("bootstrap")
    expected_flags = kubelet_flags(the_pool, join)
    assert call == [
        "gpu-cluster",
        "--kubelet-extra-args",
        " ".join(expected_flags),
        "--apiserver-endpoint",
        EKS_ENDPOINT,
        "--b64-cluster-ca",
        EKS_CA,
    ]
    labels = labels_of(expected_flags[0].removeprefix("--node-labels="))
    assert labels == node_labels(the_pool)
    taints = [f for f in expected_flags if f.startswith("--register-with-taints=")]
    assert taints == [f"--register-with-taints={t}" for t in node_taints(the_pool)]
    assert sandbox.calls("kubeadm") == [] and sandbox.calls("curl") == []

    # without the endpoint bootstrap.sh asks EKS (eks:DescribeCluster)
    bare = JoinSettings(method="eks", cluster_name="gpu-cluster", eks_bootstrap="bootstrap.sh")
    sandbox.reset()
    done = sandbox.run(user_data(the_pool, bare))
    assert done.returncode == 0, done.stderr
    (call,) = sandbox.calls("bootstrap")
    assert call == ["gpu-cluster", "--kubelet-extra-args", " ".join(kubelet_flags(the_pool, bare))]


def nodeconfig(rendered: str) -> dict[str, Any]:
    """The NodeConfig of an AL2023 user data, read the way a MIME reader reads it."""
    message = email.message_from_string(rendered)
    assert message.is_multipart()
    parts = [part for part in message.walk() if not part.is_multipart()]
    assert [part.get_content_type() for part in parts] == ["application/node.eks.aws"]
    payload = parts[0].get_payload()
    assert isinstance(payload, str)
    loaded = yaml.safe_load(payload)
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize("market", [Market.SPOT, Market.ON_DEMAND], ids=lambda m: m.value)
def test_eks_nodeadm_user_data_is_a_nodeconfig_with_the_labels_and_taint(market: Market) -> None:
    the_pool = pool(market=market)
    join = JoinSettings(
        method="eks",
        cluster_name="gpu-cluster",
        api_server=EKS_ENDPOINT,
        certificate_authority=EKS_CA,
        service_cidr="10.100.0.0/16",
    )
    config = nodeconfig(user_data(the_pool, join))
    assert config["apiVersion"] == "node.eks.aws/v1alpha1" and config["kind"] == "NodeConfig"
    assert config["spec"]["cluster"] == {
        "name": "gpu-cluster",
        "apiServerEndpoint": EKS_ENDPOINT,
        "certificateAuthority": EKS_CA,
        "cidr": "10.100.0.0/16",
    }
    flags = config["spec"]["kubelet"]["flags"]
    labels = [f.removeprefix("--node-labels=") for f in flags if f.startswith("--node-labels=")]
    assert [labels_of(value) for value in labels] == [node_labels(the_pool)]
    taints = [f for f in flags if f.startswith("--register-with-taints=")]
    assert taints == [f"--register-with-taints={t}" for t in node_taints(the_pool)]
    assert len(flags) == 1 + len(taints)


# -- labels and taints agree with the script, for any pool --------------------------------------

pool_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", fullmatch=True)
gpu_models = st.none() | st.text(max_size=140)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=pool_names, market=st.sampled_from(Market), model=gpu_models)
def test_the_script_labels_and_taints_every_pool_as_node_labels_says(
    name: str, market: Market, model: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K8S_JOIN_TOKEN", CLEAR_TOKEN)
    the_pool = pool(name, market, gpu_model=model)
    labels, taints = node_labels(the_pool), node_taints(the_pool)
    for key, value in labels.items():
        assert len(value) <= 63 and (value == "" or (value[0].isalnum() and value[-1].isalnum()))
        assert key.startswith("gpu-autoscaler.io/")
    assert taints == ([SPOT_TAINT] if market is Market.SPOT else [])

    join = kubeadm(
        token_secret={"store": "user-data", "value_env": "K8S_JOIN_TOKEN"}, ca_cert_hash=CA_HASH
    )
    root = tmp_path / "example"
    shutil.rmtree(root, ignore_errors=True)
    sandbox = Sandbox(root, "aws")
    done = sandbox.run(user_data(the_pool, join))
    assert done.returncode == 0, done.stderr
    config = sandbox.join_config()
    assert labels_of(kubelet_args(config)["node-labels"]) == labels
    assert taint_strings(config) == taints

    eks = JoinSettings(
        method="eks",
        cluster_name="c",
        api_server=EKS_ENDPOINT,
        certificate_authority=EKS_CA,
        service_cidr="10.100.0.0/16",
    )
    flags = nodeconfig(user_data(the_pool, eks))["spec"]["kubelet"]["flags"]
    assert flags == kubelet_flags(the_pool, eks)
    assert labels_of(flags[0].removeprefix("--node-labels=")) == labels


@given(st.text(max_size=200))
def test_label_value_is_always_a_label_value(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63
    assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in value)
    assert value == "" or (value[0].isalnum() and value[-1].isalnum())
    assert label_value(value) == value


# -- what is rendered, and when ---------------------------------------------------------------


def test_the_largest_rendering_fits_aws_user_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS takes 16 KB of user data (Azure 64 KB, GCP 256 KB): the script with every variable
    at its longest still fits."""
    monkeypatch.setenv("K8S_JOIN_TOKEN", CLEAR_TOKEN)
    longest = pool("p" * 128, gpu_model="G" * 128)
    join = kubeadm(
        token_secret={
            "store": "azure-key-vault",
            "name": "t" * 127,
            "vault": "v" * 24,
            "client_id": "0" * 36,
        },
        ca_cert_hash_secret={"store": "gcp-secret-manager", "name": "h" * 255, "project": "p" * 30},
        extra_labels={f"example.com/label-{i}": "v" * 63 for i in range(8)},
        kubelet_extra_args={f"flag-{i}": "x" * 60 for i in range(8)},
    )
    assert len(user_data(longest, join).encode()) < 16 * 1024


def test_join_user_data_renders_only_when_asked() -> None:
    settings = KubernetesJoinSettings()
    assert join_user_data(pool(), settings, "k8s") is None
    asked = KubernetesJoinSettings.model_validate(
        {
            "join_user_data": True,
            "join": {
                "method": "kubeadm",
                "api_server": "https://10.0.0.10:6443/",
                "token_secret": {"store": "aws-ssm", "name": "/k8s/join-token"},
                "ca_cert_hash": CA_HASH,
            },
        }
    )
    rendered = join_user_data(pool(), asked, "k8s")
    assert rendered is not None
    assert "export GPU_AUTOSCALER_API_SERVER=10.0.0.10:6443\n" in rendered


def test_a_user_data_token_needs_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("K8S_JOIN_TOKEN", raising=False)
    asked = KubernetesJoinSettings.model_validate(
        {
            "join_user_data": True,
            "join": {
                "method": "kubeadm",
                "api_server": API_SERVER,
                "token_secret": {"store": "user-data", "value_env": "K8S_JOIN_TOKEN"},
                "ca_cert_hash": CA_HASH,
            },
        }
    )
    with pytest.raises(InputError) as raised:
        join_user_data(pool(), asked, "k8s")
    assert str(raised.value) == (
        "config: sources.k8s.join.token_secret.value_env: K8S_JOIN_TOKEN is not set in the "
        "controller's environment (the value the user data is to carry)"
    )


# -- bad settings: one line naming the field ----------------------------------------------------

GOOD_KUBEADM: dict[str, Any] = {
    "method": "kubeadm",
    "api_server": API_SERVER,
    "token_secret": {"store": "aws-secrets-manager", "name": "k8s-join-token"},
    "ca_cert_hash": CA_HASH,
}
GOOD_EKS: dict[str, Any] = {
    "method": "eks",
    "cluster_name": "gpu",
    "api_server": EKS_ENDPOINT,
    "certificate_authority": EKS_CA,
    "service_cidr": "10.100.0.0/16",
}


def joined(join: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"join_user_data": True, "join": join, **more}


BAD_SETTINGS: list[tuple[dict[str, Any], str, str]] = [
    ({"join_user_data": True}, "sources.k8s", "join_user_data renders the boot script from join"),
    ({"join": GOOD_KUBEADM}, "sources.k8s", "set join_user_data: true, or remove join"),
    (joined({**GOOD_KUBEADM, "method": "gke"}), "sources.k8s.join.method", "'kubeadm' or 'eks'"),
    (
        joined({k: v for k, v in GOOD_KUBEADM.items() if k != "api_server"}),
        "sources.k8s.join",
        "method kubeadm needs api_server",
    ),
    (joined({**GOOD_KUBEADM, "api_server": "10.0.0.1"}), "sources.k8s.join", "is not host:port"),
    (
        joined({k: v for k, v in GOOD_KUBEADM.items() if k != "token_secret"}),
        "sources.k8s.join",
        "method kubeadm needs token_secret",
    ),
    (
        joined({k: v for k, v in GOOD_KUBEADM.items() if k != "ca_cert_hash"}),
        "sources.k8s.join",
        "needs ca_cert_hash or ca_cert_hash_secret",
    ),
    (
        joined({**GOOD_KUBEADM, "ca_cert_hash": "sha256:abc"}),
        "sources.k8s.join.ca_cert_hash",
        "expected sha256: and 64 lower-case hex digits",
    ),
    (
        joined({**GOOD_KUBEADM, "token_secret": {"store": "azure-key-vault", "name": "t"}}),
        "sources.k8s.join.token_secret",
        "store azure-key-vault needs vault",
    ),
    (
        joined(
            {
                **GOOD_KUBEADM,
                "token_secret": {"store": "aws-ssm", "name": "/t", "project": "gpu-project-1"},
            }
        ),
        "sources.k8s.join.token_secret",
        "project is not read by store aws-ssm",
    ),
    (
        joined({**GOOD_KUBEADM, "token_secret": {"store": "vault", "name": "t"}}),
        "sources.k8s.join.token_secret.store",
        "'aws-secrets-manager'",
    ),
    (
        joined({**GOOD_KUBEADM, "token_secret": {"store": "aws-ssm", "name": "bad name"}}),
        "sources.k8s.join.token_secret",
        "is not a secret name aws-ssm takes",
    ),
    (
        joined({**GOOD_KUBEADM, "tokn_secret": {"store": "aws-ssm", "name": "/t"}}),
        "sources.k8s.join.tokn_secret",
        "unknown field; expected one of:",
    ),
    (joined({**GOOD_KUBEADM, "cluster_name": "gpu"}), "sources.k8s.join", "is for method eks"),
    (
        joined({**GOOD_EKS, "token_secret": GOOD_KUBEADM["token_secret"]}),
        "sources.k8s.join",
        "is for method kubeadm",
    ),
    (
        joined({k: v for k, v in GOOD_EKS.items() if k != "cluster_name"}),
        "sources.k8s.join",
        "method eks needs cluster_name",
    ),
    (
        joined({k: v for k, v in GOOD_EKS.items() if k != "service_cidr"}),
        "sources.k8s.join",
        "eks_bootstrap nodeadm needs service_cidr",
    ),
    (
        joined({**GOOD_EKS, "api_server": "10.0.0.1:443"}),
        "sources.k8s.join",
        "is not the cluster's https:// endpoint",
    ),
    (
        joined({**GOOD_KUBEADM, "extra_labels": {"node-role.kubernetes.io/gpu": ""}}),
        "sources.k8s.join.extra_labels",
        "NodeRestriction",
    ),
    (
        joined({**GOOD_KUBEADM, "extra_labels": {"gpu-autoscaler.io/pool": "x"}}),
        "sources.k8s.join.extra_labels",
        "the gpu-autoscaler.io/ labels are the pool's",
    ),
    (
        joined({**GOOD_KUBEADM, "extra_labels": {"team": "ml\n"}}),
        "sources.k8s.join.extra_labels",
        "is not a label value",
    ),
    (
        joined({**GOOD_KUBEADM, "api_server": API_SERVER + "\n"}),
        "sources.k8s.join",
        "is not host:port",
    ),
    (
        joined({**GOOD_KUBEADM, "extra_labels": {"team": "a b"}}),
        "sources.k8s.join.extra_labels",
        "is not a label value",
    ),
    (
        joined({**GOOD_KUBEADM, "kubelet_extra_args": {"node-labels": "a=b"}}),
        "sources.k8s.join.kubelet_extra_args",
        "node-labels is set by the join itself",
    ),
    (
        joined({**GOOD_KUBEADM, "kubelet_extra_args": {"max-pods": "1 0"}}),
        "sources.k8s.join.kubelet_extra_args",
        "holds a blank, quote or backslash",
    ),
]


@pytest.mark.parametrize(("data", "field", "says"), BAD_SETTINGS)
def test_bad_settings_are_one_line_naming_the_field(
    data: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(InputError) as raised:
        validate_settings(KubernetesJoinSettings, data, field="sources.k8s")
    text = str(raised.value)
    assert "\n" not in text and "Traceback" not in text
    assert raised.value.field == field, text
    assert says in text, text


def test_a_token_pasted_where_its_variable_belongs_is_not_echoed() -> None:
    data = joined(
        {**GOOD_KUBEADM, "token_secret": {"store": "user-data", "value_env": CLEAR_TOKEN}}
    )
    with pytest.raises(InputError) as raised:
        validate_settings(KubernetesJoinSettings, data, field="sources.k8s")
    assert raised.value.field == "sources.k8s.join.token_secret.value_env"
    assert CLEAR_TOKEN not in str(raised.value)
    assert "NAME of an environment variable" in str(raised.value)


def test_the_shipped_script_is_executable_and_posix(tmp_path: Path) -> None:
    from importlib import resources

    shipped = resources.files("autoscaler") / "data/kubernetes/join-kubernetes-node.sh"
    assert shipped.is_file()
    path = Path(str(shipped))
    assert path.stat().st_mode & stat.S_IXUSR
    syntax_ok(join_script(), tmp_path)
