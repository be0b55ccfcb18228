"""How much each install weighs: the controller, the node agent, the report, the image.

Builds the project's wheel once, then installs it into a fresh virtualenv per install, at the
versions CI tests (``-c constraints.txt``), and prints what each adds to the venv's
site-packages (bytes of files, bytecode included, as pip leaves them), its heaviest
distributions, and a smoke check that it runs: ``gpu-autoscaler --help``, the agent's own
``gpu-autoscaler-agent --help``, and ``gpu-autoscaler report`` ending in exit 2 naming the report
extra where the extra is not installed.

    .venv/bin/python bench/bench_install_size.py                # the venv installs (~2 min)
    .venv/bin/python bench/bench_install_size.py --image        # and the image, built by podman
    .venv/bin/python bench/bench_install_size.py --image --only none   # the image alone
    .venv/bin/python bench/bench_install_size.py --json sizes.json

``--image`` builds the Dockerfile with Debian's podman as tests/test_container.py does (a
debootstrap bookworm stands in for the python:3.11-slim base, so the image's total differs from
one built by Docker on the real base; the /opt/venv figure is the same). Figures only; nothing
is asserted. docs/container.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000
REPORT_HINT = "hybrid-gpu-autoscaler[report]"


@dataclass(frozen=True)
class Install:
    name: str
    extras: str
    what: str


INSTALLS = (
    Install("core", "", "the controller (gpu-autoscaler run/plan/validate), no cloud SDK"),
    Install("core+agent", "agent", "the node agent on a GPU node (gpu-autoscaler-agent)"),
    Install("core+report", "report", "the dry-run report and lower bound (every install before)"),
    Install(
        "image",
        "aws,gcp,azure,postgres,kubernetes,agent",
        "the image's venv: every cloud, the Postgres and Kubernetes locks, the agent",
    ),
    Install(
        "image+report",
        "aws,gcp,azure,postgres,kubernetes,agent,report",
        "the image's venv with the report extra",
    ),
)

SIZES_CODE = """
import importlib.metadata as m, json, os, sys, sysconfig
site = sysconfig.get_paths()["purelib"]
total = files = 0
for folder, _, names in os.walk(site):
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.islink(path):
            total += os.path.getsize(path)
            files += 1
dists = {}
for dist in m.distributions():
    size = 0
    for f in dist.files or ():
        path = f.locate()
        if os.path.isfile(path) and not os.path.islink(path):
            size += os.path.getsize(path)
    dists[dist.metadata["Name"]] = size
json.dump({"bytes": total, "files": files, "dists": dists}, sys.stdout)
"""


@dataclass
class Measured:
    name: str
    what: str
    extras: str
    added_bytes: int
    added_files: int
    distributions: int
    heaviest: list[tuple[str, int]]
    install_s: float
    checks: dict[str, str] = field(default_factory=dict)


def run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, check=False)


def sizes(python: Path) -> dict[str, object]:
    done = run([str(python), "-c", SIZES_CODE])
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def build_wheel(into: Path) -> Path:
    done = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(into), str(ROOT)]
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel failed:\n{done.stderr}")
    return next(into.glob("hybrid_gpu_autoscaler-*.whl"))


def checks(venv: Path, install: Install) -> dict[str, str]:
    """Does the install run what it is for (and refuse what it leaves out, in one line)?"""
    out: dict[str, str] = {}
    bin_ = venv / "bin"
    helped = run([str(bin_ / "gpu-autoscaler"), "--help"])
    out["gpu-autoscaler --help"] = "ok" if helped.returncode == 0 else f"exit {helped.returncode}"
    agent = run([str(bin_ / "gpu-autoscaler-agent"), "--help"])
    out["gpu-autoscaler-agent --help"] = (
        "ok" if agent.returncode == 0 else f"exit {agent.returncode}"
    )
    if "report" not in install.extras.split(","):
        with tempfile.TemporaryDirectory() as scratch:
            done = run([str(bin_ / "gpu-autoscaler"), "report", "--out", scratch])
        lines = done.stderr.strip().splitlines()
        one_line = len(lines) == 1 and REPORT_HINT in lines[0]
        out["report without the extra"] = (
            f"exit {done.returncode}, one line naming the extra"
            if one_line
            else f"exit {done.returncode}: {done.stderr.strip()[:300]}"
        )
        for module in ("numpy", "scipy", "matplotlib"):
            found = run([str(venv / "bin" / "python"), "-c", f"import {module}"])
            if found.returncode == 0:
                out[f"{module} installed"] = "YES (should not be)"
    return out


def measure(install: Install, wheel: Path, scratch: Path) -> Measured:
    venv = scratch / install.name
    run([sys.executable, "-m", "venv", str(venv)]).check_returncode()
    python = venv / "bin" / "python"
    before = sizes(python)
    target = f"{wheel}[{install.extras}]" if install.extras else str(wheel)
    started = time.perf_counter()
    done = run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "-c",
            str(ROOT / "constraints.txt"),
            target,
        ]
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"pip install {target} failed:\n{done.stderr[-3000:]}")
    after = sizes(python)
    old = before["dists"]
    new = after["dists"]
    assert isinstance(old, dict) and isinstance(new, dict)
    added = {name: size for name, size in new.items() if name not in old}
    heaviest = sorted(added.items(), key=lambda item: -item[1])[:6]
    assert isinstance(after["bytes"], int) and isinstance(before["bytes"], int)
    assert isinstance(after["files"], int) and isinstance(before["files"], int)
    return Measured(
        name=install.name,
        what=install.what,
        extras=install.extras,
        added_bytes=after["bytes"] - before["bytes"],
        added_files=after["files"] - before["files"],
        distributions=len(added),
        heaviest=heaviest,
        install_s=round(took, 1),
        checks=checks(venv, install),
    )


def image_sizes() -> dict[str, object]:
    """The image built by podman: its total and its /opt/venv."""
    sys.path.insert(0, str(ROOT / "tests"))
    from container_support import Podman, built_image  # type: ignore[import-not-found]

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-autoscaler-size-") as root:
        podman = Podman(Path(root))
        with built_image(podman) as image:
            inspected = podman.inspect(image)
            venv = podman(
                "run", "--rm", "--network=none", "--entrypoint", "du", image, "-sb", "/opt/venv"
            )
            modules = podman(
                "run",
                "--rm",
                "--network=none",
                "--entrypoint",
                "python3",
                image,
                "-c",
                "import importlib.util as u; "
                "print([m for m in ('numpy', 'scipy', 'matplotlib') if u.find_spec(m)])",
            )
    size = inspected.get("Size")
    return {
        "image_bytes": int(size) if isinstance(size, (int, float)) else None,
        "opt_venv_bytes": int(venv.out.split()[0]),
        "report_modules_in_image": modules.out.strip(),
        "build_and_measure_s": round(time.perf_counter() - started, 1),
        "base": "debootstrap bookworm minbase + python3 (podman), standing in for python:3.11-slim",
    }


def print_installs(results: Sequence[Measured]) -> None:
    print()
    print("| install | extras | adds to site-packages | files | distributions | heaviest |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for m in results:
        heaviest = ", ".join(f"{n} {s / MB:.0f}" for n, s in m.heaviest[:4])
        print(
            f"| {m.name} | {m.extras or '-'} | {m.added_bytes / MB:.0f} MB | {m.added_files:,} | "
            f"{m.distributions} | {heaviest} |"
        )
    print()
    for m in results:
        print(
            f"- {m.name} ({m.what}), pip install {m.install_s:.0f} s: "
            + "; ".join(f"{k}: {v}" for k, v in m.checks.items())
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--image", action="store_true", help="also build the image with podman")
    parser.add_argument(
        "--only", action="append", help="only this install (repeatable; 'none' for the image alone)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    wanted = [i for i in INSTALLS if not args.only or i.name in args.only]
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="gpu-autoscaler-size-") as scratch_name:
        scratch = Path(scratch_name)
        wheel = build_wheel(scratch / "wheel") if wanted else None
        for install in wanted:
            assert wheel is not None
            print(f"installing {install.name} ({install.extras or 'no extras'}) ...", flush=True)
            results.append(measure(install, wheel, scratch))
    if results:
        print_installs(results)
    image = None
    if args.image:
        print("\nbuilding the image with podman ...", flush=True)
        try:
            image = image_sizes()
        except Exception as exc:  # figures only: say why there is no image figure
            print(f"image: not measured: {type(exc).__name__}: {str(exc)[:500]}")
        else:
            total = image["image_bytes"]
            venv_bytes = image["opt_venv_bytes"]
            assert isinstance(venv_bytes, int)
            print(
                f"image: {total / MB:.0f} MB in all ({image['base']}), /opt/venv "
                f"{venv_bytes / MB:.0f} MB; report modules in it: "
                f"{image['report_modules_in_image']}"
                if isinstance(total, int)
                else f"image: /opt/venv {venv_bytes / MB:.0f} MB"
            )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"installs": [asdict(m) for m in results], "image": image}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
