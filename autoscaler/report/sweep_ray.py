"""A sweep's tasks on a Ray cluster (``gpu-autoscaler sweep --ray ADDRESS``).

Ray is an optional extra (``pip install 'hybrid-gpu-autoscaler[ray]'``), imported only here and
only when a sweep asks for it; without it the command ends in one line naming the extra. Each
prepared scenario goes into Ray's object store once (``ray.put``) and every task of that
scenario refers to it, so a node fetches a scenario once, however many runs it gets. The nodes
need the package (with the report extra) installed, not the sweep's files.

``ADDRESS`` is what ``ray.init`` takes: ``auto`` (the cluster ``ray start`` began on this
machine), ``HOST:PORT`` (its head's GCS address), ``ray://HOST:10001`` (Ray Client) or
``local`` (a new Ray on this machine, for the sweep's length).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from typing import Any

from autoscaler.model.errors import InputError
from autoscaler.report.sweep import Done, Failure, Outcome, Task, execute
from autoscaler.sim.engine import Prepared

RAY_INSTALL = "pip install 'hybrid-gpu-autoscaler[ray]'"
NODE_INSTALL = "pip install 'hybrid-gpu-autoscaler[report,ray]'"


def import_ray() -> Any:
    """The ``ray`` module, or the one-line error (exit 2) naming the extra."""
    try:
        import ray
    except ImportError as exc:
        raise InputError(
            "--ray", f"needs ray, which is not installed ({exc.msg}): {RAY_INSTALL}"
        ) from None
    return ray


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) that nothing answers on is one line at once:
    ``ray.init`` would retry it for minutes, printing warnings."""
    hostport = address.removeprefix("ray://")
    host, colon, port = hostport.rpartition(":")
    if address in ("auto", "local") or not colon or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(
            "--ray", f"nothing answers at {hostport} ({reason}); is the Ray head running there?"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RayCluster:
    """Tasks as Ray tasks of one CPU each, collected as they finish."""

    def __init__(self, address: str) -> None:
        self.address = address

    def describe(self) -> str:
        return f"on the Ray cluster at {self.address}"

    def run(self, tasks: Sequence[Task], prepared: Sequence[Prepared], done: Done) -> None:
        ray = import_ray()
        check_reachable(self.address)
        try:
            # a Ray started for this sweep alone needs no dashboard; a cluster's is its own
            local: dict[str, Any] = {"include_dashboard": False} if self.address == "local" else {}
            ray.init(
                address=self.address, logging_level=logging.WARNING, log_to_driver=False, **local
            )
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
            raise InputError(
                "--ray", f"cannot connect to Ray at {self.address}: {_first_line(exc)}"
            ) from None
        pending: dict[Any, Task] = {}
        try:
            remote = ray.remote(num_cpus=1)(execute)
            stored = [ray.put(p) for p in prepared]
            pending = {remote.remote(task, stored[task.scenario]): task for task in tasks}
            waiting = list(pending)
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=1)
                for ref in ready:
                    task = pending.pop(ref)
                    done(self._outcome(ray, ref, task))
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.shutdown()

    def _outcome(self, ray: Any, ref: Any, task: Task) -> Outcome:
        """The task's outcome; Ray's own failures (a node that cannot import the package, a
        worker killed for memory, a node lost) as the failure of that task."""
        try:
            outcome: Outcome = ray.get(ref)
        except ray.exceptions.RayError as exc:
            text = str(exc)
            if "No module named" in text or "ModuleNotFoundError" in text:
                message = (
                    "a Ray worker cannot import this package; install it on every node: "
                    f"{NODE_INSTALL} ({_first_line(exc)})"
                )
            else:
                message = f"a Ray task failed: {type(exc).__name__}: {_first_line(exc)}"
            return Outcome(task, failure=Failure(True, "--ray", message, None, text))
        return outcome
