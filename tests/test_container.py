"""The shipped Dockerfile, built with podman and run: the controller on the simulated cloud with
the example config and a mounted token, probed over real HTTP, then stopped with SIGTERM.

One test builds and runs the image (about 100 s, most of it pip in the build, plus about a minute
of debootstrap the first time on a machine), so parallel workers never build it twice."""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from container_support import DOCKERFILE, ROOT, Podman, base_images, built_image, free_port
from waits import bound

UID = 10001
JOURNAL = "/var/lib/gpu-autoscaler/journal.db"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=bound(30)) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post(url: str, token: str) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=bound(30)) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_healthy(url: str, podman: Podman, container: str, within_s: float = 60.0) -> None:
    """Until ``url`` answers 200; ``within_s`` is a ceiling scaled by the wait knob."""
    within_s = bound(within_s)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if get(url)[0] == 200:
                return
        except OSError:
            pass
        state = podman.inspect(container)["State"]
        assert isinstance(state, dict)
        if not state.get("Running"):
            logs = podman("logs", container, check=False)
            raise AssertionError(f"the container exited early:\n{logs.out}{logs.err}")
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {within_s:.0f}s")


def wait_stopped(podman: Podman, container: str, within_s: float) -> dict[str, object]:
    """Until the container has stopped; ``within_s`` is a ceiling scaled by the wait knob."""
    within_s = bound(within_s)
    deadline = time.monotonic() + within_s
    while True:
        state = podman.inspect(container)["State"]
        assert isinstance(state, dict)
        if not state.get("Running"):
            return state
        if time.monotonic() > deadline:
            processes = podman("top", container, "pid", "user", "args", check=False).out
            logs = podman("logs", "--tail", "20", container, check=False)
            raise AssertionError(
                f"still running {within_s:.0f}s after SIGTERM:\n{processes}\n{logs.out}{logs.err}"
            )
        time.sleep(0.2)


def write_config(folder: Path, metrics_port: int, inbox_port: int) -> Path:
    """The example config, on ports free on this host (the container shares its network)."""
    config = yaml.safe_load((ROOT / "examples/container/config.yaml").read_text())
    config["metrics"]["listen"]["port"] = metrics_port
    config["inbox"]["listen"]["port"] = inbox_port
    config["tick_seconds"] = 1
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o444)
    return path


def write_secrets(folder: Path) -> Path:
    """The inbox token as a secret file readable by the image's user alone."""
    secrets = folder / "secrets"
    secrets.mkdir()
    token = secrets / "inbox-token"
    token.write_text("container-test-token\n")
    os.chown(token, UID, UID)
    token.chmod(0o400)
    secrets.chmod(0o755)
    return secrets


def test_dockerfile_pins_its_base_and_runs_the_controller_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    bases = base_images()
    assert len(bases) == 1
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", bases[0]), bases
    assert text.count("FROM ") == 2, "a builder stage and a final stage"
    final = text[text.rindex("FROM ") :]
    assert "COPY --from=builder /opt/venv /opt/venv" in final
    assert re.search(r"^USER 10001:10001$", final, re.MULTILINE)
    assert 'ENTRYPOINT ["gpu-autoscaler", "run"]' in final
    assert 'CMD ["--config", "/etc/gpu-autoscaler/config.yaml"]' in final
    assert "STOPSIGNAL SIGTERM" in final
    assert re.search(r"^HEALTHCHECK .*/healthz", final, re.MULTILINE | re.DOTALL)
    assert not re.search(r"^(COPY|ADD) .*(config|secret|credential)", text, re.MULTILINE | re.I)


def test_image_serves_health_and_metrics_as_non_root_and_stops_on_sigterm(tmp_path: Path) -> None:
    podman = Podman(tmp_path / "podman")
    metrics_port, inbox_port = free_port(), free_port()
    config = write_config(tmp_path, metrics_port, inbox_port)
    secrets = write_secrets(tmp_path)
    with built_image(podman) as image:
        made = podman.inspect(image)
        settings = made["Config"]
        assert isinstance(settings, dict)
        assert settings["User"] == f"{UID}:{UID}"
        assert settings["Entrypoint"] == ["gpu-autoscaler", "run"]
        healthcheck = made.get("Healthcheck") or settings.get("Healthcheck")
        assert isinstance(healthcheck, dict), "the docker format keeps HEALTHCHECK"
        probe = healthcheck["Test"]
        assert isinstance(probe, list) and probe[0] == "CMD"

        run = podman(
            "run",
            "--detach",
            "--network=host",
            "--env",
            f"GPU_AUTOSCALER_HEALTH_PORT={metrics_port}",
            "--volume",
            f"{config}:/etc/gpu-autoscaler/config.yaml:ro",
            "--volume",
            f"{secrets}:/run/secrets/gpu-autoscaler:ro",
            image,
        )
        container = run.out.strip()
        base = f"http://127.0.0.1:{metrics_port}"
        wait_healthy(f"{base}/healthz", podman, container)

        # healthy can come before the first tick has read its source: wait for that tick
        source_up = re.compile(r'^gpu_autoscaler_source_up\{[^}]*source="sim"[^}]*\} 1\.0$', re.M)
        deadline = time.monotonic() + bound(120)
        status, metrics = get(f"{base}/metrics")
        while not source_up.search(metrics) and time.monotonic() < deadline:
            time.sleep(0.5)
            status, metrics = get(f"{base}/metrics")
        assert status == 200
        assert source_up.search(metrics), metrics
        assert re.search(r"^gpu_autoscaler_pending_gpus 3\.0$", metrics, re.MULTILINE), metrics
        # The inbox took its token from the mounted secret: a wrong token is refused, the
        # right one gets as far as reading the (empty) body.
        inbox = f"http://127.0.0.1:{inbox_port}/v1/notices"
        assert post(inbox, "wrong-token")[0] == 401
        assert post(inbox, "container-test-token")[0] == 400

        assert podman("exec", container, "id", "-u").out.strip() == str(UID)
        journal = podman("exec", container, "stat", "-c", "%u %s", JOURNAL).out.split()
        assert journal[0] == str(UID) and int(journal[1]) > 0, "the journal is written"
        users = podman("top", container, "user", "comm").out.splitlines()[1:]
        assert users and all(line.split()[0] != "root" for line in users), users

        tools = podman(
            "exec",
            "--user",
            "root",
            container,
            "sh",
            "-c",
            "for tool in gcc cc c++ make ld pip pip3; do command -v $tool; done;"
            " python3 -m pip --version 2>/dev/null;"
            " find / -xdev -path '*/.cache/pip' -print 2>/dev/null;"
            " find /opt/venv /root /tmp -name '*.whl' -print 2>/dev/null;"
            " true",
        )
        assert tools.out.strip() == "", f"build tools or caches in the image:\n{tools.out}"

        assert podman("healthcheck", "run", container, check=False).rc == 0
        wrong_port = podman(
            "exec", "--env", "GPU_AUTOSCALER_HEALTH_PORT=1", container, *probe[1:], check=False
        )
        assert wrong_port.rc != 0, "the healthcheck must fail when /healthz does not answer"

        podman("kill", "--signal", "TERM", container)
        # A clean stop finishes the tick in flight (1 s here), well inside this bound. The
        # state is polled: Debian's podman 4.3 `podman wait` was seen to hang here after the
        # container had exited.
        state = wait_stopped(podman, container, within_s=60.0)
        assert state["ExitCode"] == 0, state
        logs = podman("logs", container)
        assert "controller stopped after" in logs.out + logs.err
        assert "Traceback" not in logs.out + logs.err
        assert "container-test-token" not in logs.out + logs.err
