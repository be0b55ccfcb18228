"""``trace import prometheus`` against a real Prometheus (Debian's 2.42): six hours of per-minute
pending and running GPUs by partition are pushed into its storage (``promtool tsdb
create-blocks-from openmetrics``, Prometheus's own backfill: scraping six hours would take six
hours), real ``/api/v1/query_range`` answers are exported, imported as a demand series equal to
what was pushed, and replayed by ``gpu-autoscaler report``."""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_server import READY_WITHIN_S, _stop, free_port
from test_trace_import import cli, read_csv, replay_report, tiny_scenario
from waits import bound

STEP_S = 60
POINTS = 361  # six hours


def pending(i: int) -> int:
    return max(0, round(4 * math.sin(i / 9)))


def running(i: int) -> int:
    return 6 + round(3 * math.sin(i / 13))


@dataclass(frozen=True)
class Pushed:
    url: str
    start: int
    end: int

    def query_range(self, promql: str) -> bytes:
        query = urllib.parse.urlencode(
            {"query": promql, "start": self.start, "end": self.end, "step": STEP_S}
        )
        with urllib.request.urlopen(
            f"{self.url}/api/v1/query_range?{query}", timeout=bound(30)
        ) as answer:
            body: bytes = answer.read()
        return body


def _openmetrics(start: int) -> str:
    """Both gauges for partitions gpu (the curves) and onprem (one GPU pending and running)."""
    lines = []
    for name, curve in (("slurm_gpus_pending", pending), ("slurm_gpus_running", running)):
        lines.append(f"# TYPE {name} gauge")
        for partition in ("gpu", "onprem"):
            for i in range(POINTS):
                value = curve(i) if partition == "gpu" else 1
                lines.append(f'{name}{{partition="{partition}"}} {value} {start + STEP_S * i}')
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    folder = tmp_path_factory.mktemp("prometheus-backfill")
    end = int(time.time()) // STEP_S * STEP_S - 600  # ten minutes ago: older than the head
    start = end - STEP_S * (POINTS - 1)
    (folder / "series.om").write_text(_openmetrics(start))
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", "series.om", "data"],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=bound(60),
    )
    (folder / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    port = free_port()
    log = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + bound(READY_WITHIN_S)
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=bound(10)):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"prometheus did not start; see {folder}/prometheus.log"
                    ) from None
                time.sleep(0.1)
        yield Pushed(url, start, end)
    finally:
        _stop(process)


def test_a_real_range_query_imports_as_the_series_pushed_and_replays(
    pushed: Pushed, tmp_path: Path
) -> None:
    by_partition = tmp_path / "pending.json"
    by_partition.write_bytes(pushed.query_range("slurm_gpus_pending"))
    assert len(json.loads(by_partition.read_bytes())["data"]["result"]) == 2  # summed on import
    summed = tmp_path / "running.json"
    summed.write_bytes(pushed.query_range("sum(slurm_gpus_running)"))
    out = tmp_path / "series.csv"
    run = cli(
        "trace", "import", "prometheus", "--pending", by_partition, "--running", summed,
        "--out", out,
    )  # fmt: skip
    assert run.rc == 0, run.err
    assert [(int(r["time_s"]), float(r["pending_gpus"]), float(r["running_gpus"])) for r in
            read_csv(out)] == [
        (pushed.start + STEP_S * i, pending(i) + 1.0, running(i) + 1.0) for i in range(POINTS)
    ]  # fmt: skip
    assert f"from {POINTS} samples over 0.25 days (median step 60 s)" in run.out
    assert "(+0.00%)" in run.out

    start = datetime.fromtimestamp(pushed.start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    scenario = tiny_scenario(tmp_path, "{series: {file: series.csv}}", start)
    report = replay_report(scenario, tmp_path / "report")
    jobs = report["window"]["jobs"]
    assert jobs > 0 and report["window"]["days"] == 0.25
    assert "demand series" in report["window"]["trace"]
    for policy in report["policies"]:
        assert policy["jobs_total"] == jobs
