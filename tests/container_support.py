"""Building and running the project's Dockerfile with Debian's podman, with no Docker engine and
no registry (the recipe of /work/shared/notes/container-build-locally.md).

The Dockerfile's pinned base is stood in for by a Debian bookworm rootfs made with debootstrap
(Python 3.11 in /usr/bin), tagged with the Dockerfile's exact base name and used with
``--pull=never``, so the Dockerfile built here is the one shipped. The rootfs tarball is cached
under the system temp dir, keyed by a hash of the recipe; everything podman stores for a run
lives in a private directory given through ``CONTAINERS_*`` files, never /etc/containers.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from waits import bound

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PIP_CONF = "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
HOST_CAS = Path("/usr/local/share/ca-certificates")
# Bump when the steps of make_rootfs change, so a stale cached rootfs is not reused.
RECIPE_VERSION = "1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def base_images(dockerfile: Path = DOCKERFILE) -> list[str]:
    """The images the Dockerfile's stages start from (stage names left out)."""
    stages: set[str] = set()
    bases: list[str] = []
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match is None:
            continue
        image, stage = match.group(1), match.group(2)
        if image not in stages and image not in bases:
            bases.append(image)
        if stage:
            stages.add(stage)
    return bases


def qualified(image: str) -> str:
    """The name podman stores a Docker Hub short name under."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


def debian_mirror() -> str:
    """The Debian mirror apt on this machine uses (debootstrap must reach it too)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for stanza in sources.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1)
                for line in stanza.splitlines()
                if re.match(r"^[A-Za-z-]+:", line)
            )
            suites = fields.get("Suites", "").split()
            uris = fields.get("URIs", "").split()
            if SUITE in suites and uris:
                return uris[0]
    listing = Path("/etc/apt/sources.list")
    if listing.exists():
        for line in listing.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1]
    return DEFAULT_MIRROR


def pip_index_url() -> str | None:
    """The package index pip on this machine is pointed at, when it is not PyPI's default: the
    build inside the image must use the same one."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(".index-url"):
            url = value.strip().strip("'\"")
            if url.startswith(("http://", "https://")):
                return url
    return None


def _host_cas() -> list[Path]:
    return sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []


def recipe_key(mirror: str) -> str:
    digest = hashlib.sha256()
    for part in (RECIPE_VERSION, SUITE, mirror, " ".join(PACKAGES), PIP_CONF):
        digest.update(part.encode() + b"\0")
    for ca in _host_cas():
        digest.update(ca.name.encode() + b"\0" + ca.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def make_rootfs(rootfs: Path, mirror: str) -> None:
    """A minimal bookworm with Python 3.11 and venv (no pip: the image's venv brings its own),
    trusting this machine's extra CAs so pip in the build reaches the index through them."""
    subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(rootfs),
            mirror,
        ],
        check=True,
        capture_output=True,
        timeout=bound(900),
    )
    extra = rootfs / "usr/local/share/ca-certificates"
    extra.mkdir(parents=True, exist_ok=True)
    bundle = rootfs / "etc/ssl/certs/ca-certificates.crt"
    with bundle.open("a") as out:
        for ca in _host_cas():
            shutil.copy2(ca, extra / ca.name)
            text = ca.read_text()
            out.write(text if text.endswith("\n") else text + "\n")
    (rootfs / "etc/pip.conf").write_text(PIP_CONF)
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for cached in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        cached.unlink()
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)


def cached_rootfs_tar() -> Path:
    """The base rootfs as a tarball, made once per recipe and kept in the system temp dir; a
    lock keeps parallel workers from running debootstrap twice."""
    mirror = debian_mirror()
    cache = Path(tempfile.gettempdir()) / f"gpu-autoscaler-base-{recipe_key(mirror)}"
    cache.mkdir(exist_ok=True)
    tarball = cache / "rootfs.tar"
    with (cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.exists():
            work = Path(tempfile.mkdtemp(dir=cache, prefix="build-"))
            try:
                make_rootfs(work / "rootfs", mirror)
                partial = work / "rootfs.tar"
                subprocess.run(
                    ["tar", "-C", str(work / "rootfs"), "-cf", str(partial), "."],
                    check=True,
                    capture_output=True,
                )
                os.replace(partial, tarball)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return tarball


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Podman:
    """podman with its own config, storage and runtime state under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        conf = root / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "containers.conf").write_text(
            "[containers]\n"
            # podman's default ulimits exceed this machine's hard limits.
            'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
            'log_driver = "k8s-file"\n'
            "[engine]\n"
            # crun fails on these hosts' hybrid cgroups; there is no systemd either.
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{root}/events.log"\n'
            f'tmp_dir = "{root}/libpod"\n'
        )
        (conf / "registries.conf").write_text('unqualified-search-registries = ["docker.io"]\n')
        (conf / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/storage"\nrunroot = "{root}/run"\n'
        )
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(conf / "containers.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(conf / "registries.conf"),
            "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"),
            "TMPDIR": str(root),
        }

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> Result:
        """Run podman; ``timeout`` is a ceiling scaled by the wait knob."""
        done = subprocess.run(
            ["podman", *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=bound(timeout),
            check=False,
        )
        result = Result(
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )
        if check and result.rc != 0:
            raise AssertionError(
                f"podman {' '.join(args[:3])} failed ({result.rc}):\n{result.err[-4000:]}"
            )
        return result

    def inspect(self, what: str) -> dict[str, object]:
        data = json.loads(self("inspect", what).out)
        assert isinstance(data, list) and data
        first = data[0]
        assert isinstance(first, dict)
        return first

    def image_ids(self) -> list[str]:
        return self("images", "--all", "--quiet", "--no-trunc", check=False).out.split()

    def container_ids(self) -> list[str]:
        """Containers of this storage, buildah's working ones from a failed build included."""
        return self("ps", "--all", "--external", "--quiet", "--no-trunc", check=False).out.split()


@contextlib.contextmanager
def built_image(podman: Podman, build_args: Sequence[str] = ()) -> Iterator[str]:
    """The project's image built from its Dockerfile on the local base; yields its id. Every
    container and image made in this podman's storage is removed by id afterwards."""
    try:
        tarball = cached_rootfs_tar()
        base = podman("import", "--quiet", str(tarball), "localhost/debian-python:bookworm")
        base_id = base.out.strip()
        for name in base_images():
            podman("tag", base_id, qualified(name))
        args = ["build", "--network=host", "--pull=never", "--format", "docker"]
        index = pip_index_url()
        if index is not None:
            args += ["--build-arg", f"PIP_INDEX_URL={index}"]
        args += [*build_args, "--iidfile", str(podman.root / "iid"), "-f", str(DOCKERFILE)]
        podman(*args, str(ROOT), timeout=900)
        yield (podman.root / "iid").read_text().strip()
    finally:
        for container in podman.container_ids():
            podman("rm", "--force", "--time", "0", container, check=False)
        for image in podman.image_ids():
            podman("rmi", "--force", image, check=False)
        shutil.rmtree(podman.root, ignore_errors=True)
