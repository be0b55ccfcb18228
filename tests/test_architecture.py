"""The folders are the architecture: the core's layers point one way (import-linter's contracts in
pyproject.toml); the core imports no cloud SDK and no provider or policy by name; policies see
only the model (and their own building blocks); the node agent only the model."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLOUD_SDKS = ("boto3", "botocore", "google", "azure", "moto")


def imports(folder: str) -> dict[Path, set[str]]:
    found: dict[Path, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[path] = names
    return found


def test_the_layers_point_one_way_and_no_package_imports_past_its_contract() -> None:
    """Every import, at module level or inside a function, counts (grimp reads them all)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 kept, 0 broken" in done.stdout, done.stdout


def test_the_core_imports_no_cloud_sdk_provider_or_policy() -> None:
    for path, names in imports("autoscaler").items():
        for name in names:
            top = name.split(".")[0]
            assert top not in CLOUD_SDKS, f"{path} imports {name}"
            assert top not in ("providers", "policies"), f"{path} imports {name} by name"


def test_policies_see_only_the_model() -> None:
    allowed_core = {"autoscaler.model"}
    for path, names in imports("policies").items():
        for name in names:
            top = name.split(".")[0]
            assert top not in CLOUD_SDKS and top != "providers", f"{path} imports {name}"
            if top == "autoscaler":
                assert name in allowed_core, f"{path} imports {name}; policies see only the model"


def test_the_package_imports_and_runs_without_any_cloud_sdk() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {CLOUD_SDKS!r}:\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import autoscaler.cli, autoscaler.tick.controller, autoscaler.sim.engine, providers.sim\n"
        "import policies.cost_aware, policies.baselines\n"
        "from autoscaler.cli import main\n"
        "sys.exit(main(['policies']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "cost-aware" in done.stdout


def test_the_tick_asks_for_capabilities_by_declared_protocols_not_attribute_probes() -> None:
    """An optional capability of a provider or scheduler is a small protocol in ``spi``; the
    steps, the assembly and the fleet memory never probe with ``getattr``/``hasattr``."""
    for folder in ("autoscaler/tick", "autoscaler/app", "autoscaler/fleet"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    assert node.func.id not in ("getattr", "hasattr"), (
                        f"{path.relative_to(ROOT)}:{node.lineno} probes with {node.func.id}"
                    )
