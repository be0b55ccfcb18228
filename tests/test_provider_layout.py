"""The providers' layout, as README "Architecture" draws it: one folder per cloud with the same
files, the cloud's SDK imported only by the folder's ``sdk.py`` (inside functions, so everything
else imports without the SDK), and no credential path that only tests take.

import-linter (tests/test_architecture.py) keeps what providers import from the core; this keeps
what they import from the clouds and where each concern lives, so that a reader who knows one
cloud's folder knows where to look in the others."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

PROVIDERS = Path(__file__).resolve().parent.parent / "providers"
CLOUDS = ("aws", "gcp", "azure")
COMMON = frozenset(
    {
        "__init__.py",
        "settings.py",  # the provider's and its pools' pydantic settings
        "sdk.py",  # the one lazy SDK adaptor
        "errors.py",  # the SDK's errors as the core's typed errors
        "instances.py",  # launch, list, terminate; tags or labels
        "pricing.py",
        "notices.py",  # interruption notices
        "gang.py",  # launch_gang, all or none
        "provider.py",  # the class composing the above
    }
)
EXTRAS = {"aws": frozenset({"events.py", "queue.py"})}  # EventBridge events, the SQS queue source
SHARED = frozenset({"__init__.py", "placement.py", "sim.py"})
SDK_PACKAGES = frozenset({"boto3", "botocore", "google", "azure"})
# what a credential path only tests take has been made of: an anonymous Google credential, a
# fixed ARM token sent by a header policy, the bearer policy's TLS rule switched off
TEST_ONLY_AUTH = ("AnonymousCredentials", "HeadersPolicy", "authentication_policy", "enforce_https")


def imported(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Every module an import names, wherever the import is, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module, node.lineno


def modules() -> list[Path]:
    return sorted(PROVIDERS.rglob("*.py"))


@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_cloud_folder_holds_the_same_files(cloud: str) -> None:
    names = {path.name for path in (PROVIDERS / cloud).glob("*.py")}
    assert names == COMMON | EXTRAS.get(cloud, frozenset())


def test_no_provider_module_is_left_beside_the_folders() -> None:
    assert {path.name for path in PROVIDERS.glob("*.py")} == SHARED
    assert {path.name for path in PROVIDERS.iterdir() if path.is_dir()} - {"__pycache__"} == set(
        CLOUDS
    )


def test_only_a_clouds_sdk_py_imports_its_sdk_and_only_inside_functions() -> None:
    wrong = []
    for path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(PROVIDERS.parent)
        for module, line in imported(tree):
            if module.split(".")[0] in SDK_PACKAGES and path.name != "sdk.py":
                wrong.append(f"{where}:{line} imports {module}")
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for module, line in imported(node):
                    if module.split(".")[0] in SDK_PACKAGES:
                        wrong.append(f"{where}:{line} imports {module} when it is imported")
    assert wrong == []
    for cloud in CLOUDS:
        sdk = ast.parse((PROVIDERS / cloud / "sdk.py").read_text())
        assert any(m.split(".")[0] in SDK_PACKAGES for m, _ in imported(sdk)), cloud


def test_no_credential_path_only_tests_take() -> None:
    found = [
        f"{path.relative_to(PROVIDERS.parent)}: {name}"
        for path in modules()
        for name in TEST_ONLY_AUTH
        if name in path.read_text()
    ]
    assert found == []


def test_the_entry_points_load_the_providers_from_their_folders() -> None:
    providers = {e.name: e for e in entry_points(group="gpu_autoscaler.providers")}
    for cloud in CLOUDS:
        assert providers[cloud].module == f"providers.{cloud}"
        assert providers[cloud].load().__module__ == f"providers.{cloud}.provider"
    (sqs,) = [e for e in entry_points(group="gpu_autoscaler.sources") if e.name == "sqs"]
    assert sqs.value == "providers.aws.queue:SqsQueueSource" and sqs.load().__name__ == (
        "SqsQueueSource"
    )
