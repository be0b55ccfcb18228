"""The ``kubernetes`` source pointed at the API emulator, as a config would build it: through
``from_config``, with ``api_url`` and the token in an environment variable."""

from __future__ import annotations

from typing import Any

import pytest
from k8s_api_emulator import K8sApi
from waits import bound

from autoscaler.sources.kubernetes import KubernetesSource

TOKEN_ENV = "K8S_TEST_TOKEN"


def make_source(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch, name: str = "cluster", **settings: Any
) -> KubernetesSource:
    monkeypatch.setenv(TOKEN_ENV, k8s_api.token)
    given: dict[str, Any] = {
        "api_url": k8s_api.url,
        "token_env": TOKEN_ENV,
        # generous: no test here is about a slow server except the one that says so
        "request_timeout_s": bound(30.0),
        **settings,
    }
    return KubernetesSource.from_config(given, name)


def clear(k8s_api: K8sApi, *resources: str) -> None:
    """Remove every object of the kinds named (between a property test's examples)."""
    for resource in resources:
        for obj in k8s_api.items(resource):
            meta = obj["metadata"]
            k8s_api.remove(resource, meta["name"], meta.get("namespace", ""))
