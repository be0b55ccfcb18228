"""The report extra: numpy, scipy, matplotlib and tqdm serve only the dry-run report, the lower
bound and synthetic traces, so the controller, the node agent and the image install without them
(about 310 MB less: bench/bench_install_size.py). A command that needs them and finds them
missing ends in one line naming the pip extra, never an ImportError traceback."""

from __future__ import annotations

import importlib

from autoscaler.model.errors import InputError

REPORT_MODULES = ("numpy", "scipy", "matplotlib", "tqdm")
REPORT_INSTALL = "pip install 'hybrid-gpu-autoscaler[report]'"


def missing_report_modules() -> list[str]:
    """The report extra's modules this Python cannot import. Importing (not ``find_spec``) is
    the honest test: a module that is found but broken is as missing as an absent one."""
    missing = []
    for name in REPORT_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def require_report_extra(what: str) -> None:
    """Raise the one-line error (exit 2) when ``what`` cannot run for want of the report extra."""
    missing = missing_report_modules()
    if missing:
        raise InputError(
            what,
            f"needs {', '.join(missing)}, which a lean install leaves out: {REPORT_INSTALL}",
        )
