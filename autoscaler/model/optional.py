"""Optional packages: each cloud's SDK, redis, psycopg, kubernetes, nvidia-ml-py, ray and the
report's numpy family are pip extras, imported lazily where they are used, so an install carries
only what its config needs. An install that lacks one a config asks for is a person's to fix, not
a bug: it ends in one line naming the extra to install (exit 2), never ``No module named 'boto3'``.

Two places say so. A part that needs a package checks for it when it is built
(``require_extra``), so ``validate`` and the start of ``run`` say it before anything runs; and the
command line's one ending (``autoscaler.model.exits``) reads any ``ModuleNotFoundError`` that still
gets there by the package's name (``extra_of``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from autoscaler.model.errors import InputError

DISTRIBUTION = "hybrid-gpu-autoscaler"

EXTRA_OF_PACKAGE: dict[str, str] = {
    "boto3": "aws",
    "botocore": "aws",
    "google.cloud": "gcp",
    "google.auth": "gcp",
    "google.api_core": "gcp",
    "azure": "azure",
    "redis": "redis",
    "psycopg": "postgres",
    "kubernetes": "kubernetes",
    "pynvml": "agent",
    "ray": "ray",
    "numpy": "report",
    "scipy": "report",
    "matplotlib": "report",
    "tqdm": "report",
}
"""The packages each extra brings, as pyproject.toml's optional-dependencies say (Google's by
their subpackage: ``google.protobuf`` comes with other packages too)."""


def install_hint(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The modules of ``modules`` this Python cannot find. Found, not imported: a check at build
    time must not pay for importing a cloud SDK (seconds for some) that the first call imports
    anyway."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken one
            found = False
        if not found:
            missing.append(name)
    return missing


def require_extra(
    what: str, extra: str, modules: Iterable[str], where: str = "config", field: str | None = None
) -> None:
    """Raise the one-line error (exit 2) naming the extra when ``what`` cannot run without
    ``modules``."""
    missing = missing_modules(modules)
    if missing:
        raise InputError(
            where,
            f"{what} needs {_listed(missing)}, which this install does not have: "
            f"{install_hint(extra)}",
            field=field,
        )


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def extra_of(error: ModuleNotFoundError) -> str | None:
    """The extra that brings the module ``error`` says is missing, if it is one of ours."""
    name = error.name or ""
    if name == "google":  # the namespace itself: nothing of Google's is installed
        return "gcp"
    for package, extra in EXTRA_OF_PACKAGE.items():
        if name == package or name.startswith(package + "."):
            return extra
    return None


def missing_extra_message(error: ModuleNotFoundError) -> str | None:
    """One line for a missing extra's module, or None when the module is no extra's (a bug)."""
    extra = extra_of(error)
    if extra is None:
        return None
    return f"{error.name} is not installed; it comes with the {extra} extra: {install_hint(extra)}"
