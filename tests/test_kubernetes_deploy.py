"""deploy/kubernetes: `kubectl kustomize` renders the base and each overlay, every object
validates against the Kubernetes OpenAPI schemas offline (kubernetes-validate, strict: an unknown
field is an error), the ConfigMap's config passes `gpu-autoscaler validate`, and the RBAC rules
grant exactly the Kubernetes API calls the code makes (read from autoscaler/ by
tests/kubernetes_calls.py, as tests/test_terraform.py checks the cloud grants). No cluster.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_calls import code_calls, compare, granted, routes, scan_source, verb_of
from waits import bound

from autoscaler.model.config import ControllerConfig, LeaderKind, load_config
from node_agent.cli import add_arguments

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
CLI = Path(sys.executable).parent / "gpu-autoscaler"
KUSTOMIZATIONS = (".", "overlays/servicemonitor", "overlays/agent")
# the oldest Kubernetes the manifests are for (unhealthyPodEvictionPolicy is on from 1.27) and
# the newest kubernetes-validate knows
VERSIONS = ("1.27", kubernetes_validate.utils.latest_version())
# leases live in the controller's own namespace (a Role); everything else is cluster-wide
OWN_NAMESPACE = frozenset({("coordination.k8s.io", "leases")})
BASE_KINDS = {
    "Namespace",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
}
CONTROLLER = {
    "app.kubernetes.io/name": "gpu-autoscaler",
    "app.kubernetes.io/component": "controller",
}
AGENT = {"app.kubernetes.io/name": "gpu-autoscaler", "app.kubernetes.io/component": "agent"}
SPOT_TAINT = "gpu-autoscaler.io/spot"

Obj = dict[str, Any]

# prometheus-operator's ServiceMonitor (monitoring.coreos.com/v1) is a custom resource, so no
# Kubernetes schema has it: the fields used, with the CRD's types and interval pattern
# (example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml), strict alike
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": LABELS,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": LABELS},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": DURATION},
                        },
                    },
                },
            },
        },
    },
}


def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is not installed: run scripts/install-test-services.sh as root"
    return found


def kustomize(folder: Path) -> list[Obj]:
    """What ``kubectl kustomize folder`` renders, one dict per object."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: kustomize(DEPLOY / name) for name in KUSTOMIZATIONS}


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def container(pod_owner: Obj) -> Obj:
    containers = pod_owner["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: Obj = containers[0]
    return result


def config_of(objects: list[Obj], tmp_path: Path) -> tuple[Path, ControllerConfig]:
    """The controller's config as the ConfigMap holds it, written to a file."""
    configmap = one(objects, "ConfigMap")
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    return path, load_config(path)


# -- rendering and schemas ----------------------------------------------------------------------


def test_the_base_and_each_overlay_render(rendered: dict[str, list[Obj]]) -> None:
    kinds = {name: {o["kind"] for o in objects} for name, objects in rendered.items()}
    assert kinds["."] >= BASE_KINDS
    assert kinds["overlays/servicemonitor"] == kinds["."] | {"ServiceMonitor"}
    assert kinds["overlays/agent"] == kinds["."] | {"DaemonSet"}
    for objects in rendered.values():
        names = [
            (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects
        ]
        assert len(names) == len(set(names))
        for obj in objects:
            if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
                assert obj["metadata"]["namespace"] == "gpu-autoscaler", obj["metadata"]
    # no Secret is ever rendered: the operator creates them (docs/kubernetes-deploy.md)
    assert not any(o["kind"] == "Secret" for objects in rendered.values() for o in objects)


class _NoNetwork(socket.socket):
    def connect(self, *args: object) -> None:
        raise AssertionError(f"the schema check went to the network: {args}")


def test_every_object_validates_against_the_kubernetes_schemas_offline(
    rendered: dict[str, list[Obj]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "socket", _NoNetwork)
    checked = 0
    for objects in rendered.values():
        for obj in objects:
            if obj["kind"] == "ServiceMonitor":
                jsonschema.Draft202012Validator(SERVICE_MONITOR).validate(obj)
                continue
            for version in VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
                checked += 1
    assert checked >= 2 * len(BASE_KINDS)


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ("spec", "replicas"), "two"),
        ("Deployment", ("spec", "template", "spec", "containers", 0, "readOnlyRootFs"), True),
        ("PodDisruptionBudget", ("spec", "minAvailables"), 1),
        ("Role", ("rules", 0, "verb"), ["get"]),
        ("Service", ("spec", "ports", 0, "port"), "9108x"),
    ],
)
def test_the_schema_check_refuses_a_broken_object(
    rendered: dict[str, list[Obj]], kind: str, path: tuple[str | int, ...], value: object
) -> None:
    obj = copy.deepcopy(one(rendered["."], kind))
    parent: Any = obj
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)


def test_the_service_monitor_schema_refuses_a_typo(rendered: dict[str, list[Obj]]) -> None:
    monitor = copy.deepcopy(one(rendered["overlays/servicemonitor"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SERVICE_MONITOR).validate(monitor)
    monitor["spec"]["endpoints"][0] = {"port": "metrics", "interval": "30 seconds"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SERVICE_MONITOR).validate(monitor)


# -- the controller's config --------------------------------------------------------------------


def test_the_configmap_config_passes_validate(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    path, _ = config_of(rendered["."], tmp_path)
    done = subprocess.run(
        [str(CLI), "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
        env={**os.environ, "KUBERNETES_SERVICE_HOST": ""},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{path}: ok: fleet ")


def test_the_pod_serves_and_mounts_what_the_config_names(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    objects = rendered["."]
    _, config = config_of(objects, tmp_path)
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    main = container(deployment)
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert config.metrics is not None and config.inbox is not None
    assert ports == {"metrics": config.metrics.listen.port, "inbox": config.inbox.listen.port}
    assert main["args"] == ["--config", "/etc/gpu-autoscaler/config.yaml"]

    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["config"] == "/etc/gpu-autoscaler"
    assert volumes["config"]["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
    # the token file is in the inbox Secret's mount, the journal on a writable volume
    assert config.inbox.token_file is not None
    token = config.inbox.token_file
    assert str(token.parent) == mounts["inbox-token"]
    assert volumes["inbox-token"]["secret"]["secretName"] == "gpu-autoscaler-inbox"
    assert volumes["inbox-token"]["secret"]["defaultMode"] == 0o440
    assert str(config.journal.sqlite_path.parent) == mounts["state"]
    assert "emptyDir" in volumes["state"]

    # the Lease: the default kind picks it in a pod, and the Role is held to its name
    assert config.leader.kind in (LeaderKind.AUTO, LeaderKind.KUBERNETES)
    role = one(objects, "Role")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named and all(r["resourceNames"] == [config.leader.name] for r in named)


def test_the_deployment_is_two_locked_down_replicas(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["."]
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"] == CONTROLLER
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user (Dockerfile)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    main = container(deployment)
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert main["resources"]["requests"].keys() == {"cpu", "memory"}
    assert "memory" in main["resources"]["limits"]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # both replicas Ready (a standby's inbox refuses with 503 instead), so a drain may take either
    assert main["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # credentials only by reference: no literal value in the pod's environment
    assert "env" not in main
    assert main["envFrom"] == [{"secretRef": {"name": "gpu-autoscaler-cloud", "optional": True}}]


def test_the_service_and_the_budget_select_the_controller(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["."]
    service = one(objects, "Service")
    assert service["spec"]["selector"] == CONTROLLER
    assert {(p["name"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("metrics", "metrics"),
        ("inbox", "inbox"),
    }
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == {"matchLabels": CONTROLLER}
    # a replica that is not Ready (starting, wedged) must stay evictable
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_service_monitor_scrapes_the_metrics_port(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["overlays/servicemonitor"]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"] == {
        "matchLabels": one(objects, "Service")["metadata"]["labels"]
    }
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]


# -- the node agent -----------------------------------------------------------------------------


def test_the_agent_runs_on_gpu_nodes_and_posts_to_the_inbox(
    rendered: dict[str, list[Obj]],
) -> None:
    objects = rendered["overlays/agent"]
    daemonset = one(objects, "DaemonSet")
    assert daemonset["spec"]["selector"]["matchLabels"] == AGENT
    pod = daemonset["spec"]["template"]["spec"]
    agent = container(daemonset)
    assert agent["command"] == ["gpu-autoscaler-agent"]
    assert agent["image"] == container(one(objects, "Deployment"))["image"]

    # the arguments are ones the agent takes, pointing at the Service's inbox port
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in agent["args"]])
    assert args.hostname == "node-1"
    service = one(objects, "Service")
    inbox = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "inbox")
    assert args.controller_url == f"http://{service['metadata']['name']}:{inbox}"
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert str(Path(args.token_file).parent) == mounts["inbox-token"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["inbox-token"]["secret"]["secretName"] == "gpu-autoscaler-inbox"
    port = int(args.listen.rsplit(":", 1)[1])
    assert agent["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}

    # GPU nodes (ours or any NVIDIA one), spot ones included
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    selected = {
        (e["key"], tuple(e["values"]))
        for term in terms["nodeSelectorTerms"]
        for e in term["matchExpressions"]
    }
    assert ("gpu-autoscaler.io/managed", ("true",)) in selected
    assert ("nvidia.com/gpu.present", ("true",)) in selected
    assert {"key": SPOT_TAINT, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]

    # the host's network for the metadata server; nothing else of the host, no API token
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert not {"hostPID", "hostIPC"} & set(pod)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # host networking is admitted only at the privileged Pod Security level
    labels = one(objects, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert (
        one(rendered["."], "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        == "restricted"
    )


def test_a_site_overlay_moves_the_namespace_and_the_image(tmp_path: Path) -> None:
    """What docs/kubernetes-deploy.md tells an operator to write: their own kustomization over
    an overlay, with their namespace and their registry's image."""
    base = os.path.relpath(DEPLOY / "overlays" / "agent", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "namespace: gpu-fleet\n"
        f"bases:\n  - {base}\n"
        "images:\n"
        "  - name: gpu-autoscaler\n"
        "    newName: registry.example.com/gpu-autoscaler\n"
        "    newTag: 1.2.3\n"
    )
    objects = kustomize(tmp_path)
    for obj in objects:
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "gpu-fleet", obj["metadata"]
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "gpu-fleet"
    for kind in ("Deployment", "DaemonSet"):
        assert container(one(objects, kind))["image"] == "registry.example.com/gpu-autoscaler:1.2.3"


# -- RBAC: exactly what the code calls ----------------------------------------------------------


def test_rbac_grants_exactly_what_the_code_calls(rendered: dict[str, list[Obj]]) -> None:
    assert compare(code_calls(), granted(rendered["."])) == []


def test_leases_are_granted_in_the_namespace_and_the_rest_cluster_wide(
    rendered: dict[str, list[Obj]],
) -> None:
    objects = rendered["."]
    for rule in granted(objects):
        own = rule.grant[:2] in OWN_NAMESPACE
        assert rule.kind == ("Role" if own else "ClusterRole"), rule
    account = one(objects, "ServiceAccount")["metadata"]
    bound_to = {
        (b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in objects
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and b["subjects"]
        == [{"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}]
    }
    roles = {
        (o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in ("Role", "ClusterRole")
    }
    assert bound_to == roles


def test_the_code_side_finds_every_kind_of_use() -> None:
    """A call, a watch by keyword and through Watch().stream (made there or bound to a name), a
    method handed to a helper, a subresource, a custom object by literal and by constant; and
    what it cannot read. Another object's stream() (urllib3's body) is not a watch."""
    code = (
        "from kubernetes import watch\n"
        'KUEUE = "kueue.x-k8s.io"\n'
        "def f(core, policy, custom, helper):\n"
        "    core.read_namespaced_lease('x', 'ns')\n"
        "    core.list_node(watch=True)\n"
        "    watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=5)\n"
        "    helper(core.patch_node, 'n', {})\n"
        "    policy.create_namespaced_pod_eviction('p', 'ns', body)\n"
        "    custom.list_cluster_custom_object(KUEUE, 'v1beta1', 'workloads')\n"
        "    custom.get_namespaced_custom_object(group='scheduling.x-k8s.io', version='v1',\n"
        "                                        namespace='ns', plural='podgroups', name='g')\n"
        "    custom.list_cluster_custom_object(group, 'v1', 'things')\n"
        "    watch.Watch().stream(some_function)\n"
        "    core.api_client.call_api('/api/v1/pods', 'GET')\n"
        "    core.connect_get_namespaced_pod_exec('p', 'ns')\n"
        "    core.read_namespaced_event('e', 'ns')\n"
        "    response.stream(1024, decode_content=True)\n"
        "    w = watch.Watch()\n"
        "    w.stream(some_function)\n"
        "    for _ in w.stream(policy.list_namespaced_pod_disruption_budget, 'ns'): pass\n"
    )
    calls = scan_source(code, "x.py")
    assert set(calls.grants) == {
        ("coordination.k8s.io", "leases", "get"),
        ("", "nodes", "watch"),
        ("", "pods", "watch"),
        ("", "nodes", "patch"),
        ("", "pods/eviction", "create"),
        ("kueue.x-k8s.io", "workloads", "list"),
        ("scheduling.x-k8s.io", "podgroups", "get"),
        ("policy", "poddisruptionbudgets", "watch"),
    }
    assert calls.grants[("", "nodes", "patch")] == ["x.py:7"]
    unknown = "\n".join(calls.unknown)
    assert "x.py:12: list_cluster_custom_object's group" in unknown
    assert "x.py:13: stream()" in unknown
    assert "x.py:14: a raw call_api()" in unknown
    assert "x.py:15: connect_get_namespaced_pod_exec is outside the name grammar" in unknown
    assert "x.py:16: read_namespaced_event is CoreV1Api or EventsV1Api" in unknown
    assert "x.py:19: stream()" in unknown
    assert len(calls.unknown) == 6  # urllib3's response.stream (line 17) is no watch
    named = scan_source("from kubernetes.client import CoreV1Api\n" + code, "y.py")
    assert ("", "events", "get") in named.grants


def test_the_lease_lock_is_what_the_scan_finds_today() -> None:
    grants = code_calls().grants
    leases = {g for g in grants if g[:2] == ("coordination.k8s.io", "leases")}
    assert leases == {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")
    }
    assert all(
        w.startswith("autoscaler/ops/leader/kubernetes.py:") for g in leases for w in grants[g]
    )


def test_the_name_grammar_agrees_with_the_route_of_every_client_method() -> None:
    """read/list/get are GETs, create a POST, replace a PUT, patch a PATCH, delete a DELETE:
    for every object method of the installed client (connect_* are outside the grammar)."""
    checked = 0
    for name, candidates in routes().items():
        grammar = verb_of(name)
        if name.startswith("connect_"):
            assert grammar is None
            continue
        assert grammar is not None, name
        for route in candidates:
            assert route.method == grammar[1], (name, route)
            checked += 1
    assert checked > 500


def _rules_of(objects: list[Obj], kind: str) -> list[Obj]:
    found: list[Obj] = one(objects, kind)["rules"]
    return found


@pytest.mark.parametrize(
    ("kind", "removed"),
    [
        ("Role", ("coordination.k8s.io", "leases", "update")),
        ("Role", ("coordination.k8s.io", "leases", "create")),
        ("ClusterRole", ("", "pods/eviction", "create")),
        ("ClusterRole", ("", "nodes", "patch")),
        ("ClusterRole", ("", "pods", "delete")),
    ],
)
def test_rules_that_drift_from_the_code_fail(
    rendered: dict[str, list[Obj]], kind: str, removed: tuple[str, str, str]
) -> None:
    code = code_calls()
    missing = copy.deepcopy(rendered["."])
    for rule in _rules_of(missing, kind):
        if removed[0] in rule["apiGroups"] and removed[1] in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != removed[2]]
    problems = compare(code, granted(missing))
    assert len(problems) == 1
    assert problems[0].startswith(f"needed but not granted: {removed[2]} {removed[1]} ")

    extra = copy.deepcopy(rendered["."])
    _rules_of(extra, kind).append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]})
    assert compare(code, granted(extra)) == ["granted but not needed by the code: list secrets"]
    # a wildcard is never what the code calls: it is refused, and hides nothing it replaced
    wildcard = copy.deepcopy(rendered["."])
    for rule in _rules_of(wildcard, kind):
        if removed[0] in rule["apiGroups"] and removed[1] in rule["resources"]:
            rule["verbs"] = ["*"]
    problems = compare(code, granted(wildcard))
    assert any(
        p.startswith(f"needed but not granted: {removed[2]} {removed[1]} ") for p in problems
    )
    shown = removed[1] + (f" ({removed[0]})" if removed[0] else "")
    assert f"granted but not needed by the code: * {shown}" in problems


def test_a_new_call_in_the_code_fails_until_granted(rendered: dict[str, list[Obj]]) -> None:
    code = code_calls()
    scan_source("def f(core):\n    core.create_namespaced_pod('ns', {})\n", "new.py", code)
    assert compare(code, granted(rendered["."])) == [
        "needed but not granted: create pods (used at new.py:2)"
    ]


def _method_names() -> list[str]:
    return sorted(
        n
        for n, c in routes().items()
        if len(c) == 1 and verb_of(n) is not None and not c[0].takes_arguments
    )


@given(st.lists(st.sampled_from(_method_names()), min_size=1, max_size=8, unique=True))
def test_the_scan_finds_exactly_the_methods_a_module_uses(methods: list[str]) -> None:
    body = "".join(f"    api.{m}()\n" for m in methods)
    calls = scan_source(f"def f(api):\n{body}", "m.py")
    table = routes()
    expected = {table[m][0].grant(verb_of(m)[0], {}) for m in methods}  # type: ignore[index]
    assert not calls.unknown
    assert set(calls.grants) == expected


# -- the image ----------------------------------------------------------------------------------


def _image_extras() -> set[str]:
    found = re.findall(r'pip install .*"\.\[([a-z,]+)\]"', (ROOT / "Dockerfile").read_text())
    assert len(found) == 1
    return set(found[0].split(","))


def test_the_image_carries_the_kubernetes_client_and_the_agent() -> None:
    """A pod on the default `leader: {kind: auto}` takes the Lease, which needs the client; the
    agent DaemonSet runs gpu-autoscaler-agent from the same image, which reads NVML."""
    extras = _image_extras()
    assert {"kubernetes", "agent"} <= extras
    row = next(
        line
        for line in (ROOT / "docs" / "container.md").read_text().splitlines()
        if line.startswith("| stages |")
    )
    listed = re.search(r"the `([a-z,]+)` extras", row)
    assert listed is not None and set(listed[1].split(",")) == extras


def test_the_docs_say_what_each_rule_is_for(rendered: dict[str, list[Obj]]) -> None:
    doc = (ROOT / "docs" / "kubernetes-deploy.md").read_text()
    for rule in granted(rendered["."]):
        assert f"`{rule.grant[1]}`" in doc, rule
    for command in (
        "kubectl apply -k deploy/kubernetes",
        "kubectl apply -k deploy/kubernetes/overlays/servicemonitor",
        "kubectl apply -k deploy/kubernetes/overlays/agent",
    ):
        assert command in doc
    for secret in ("gpu-autoscaler-inbox", "gpu-autoscaler-cloud"):
        assert secret in doc
