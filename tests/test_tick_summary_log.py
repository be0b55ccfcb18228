"""The controller's per-tick summary: its numbers are keys of the JSON event (a log search
filters on them without parsing ``msg``), while ``msg`` and the text format's line stay the
human line they were. Run as ops run it (``gpu-autoscaler run`` on the simulated cloud with a
static queue and a journal), and on a tick whose queue source failed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from fakes import job, pool, rig
from waits import bound

from autoscaler.app.runner import summary, summary_fields
from autoscaler.model.errors import SourceError
from autoscaler.model.logs import TICK_SUMMARY_FIELDS, JsonFormatter, PlainFormatter, Secrets

CONFIG = """\
fleet_id: summary-test
tick_seconds: 0.2
policy: {name: cost-aware}
providers:
  sim: {boot_seconds: 0, interruption_rate_per_hour: 0.0}
pools:
  - name: sim-spot
    provider: sim
    region: us-east-1
    instance_type: g5.xlarge
    gpus_per_instance: 1
    gpu_model: a10g
    market: spot
    max_instances: 4
sources:
  - kind: static
    name: demo-queue
    settings:
      jobs:
        - {count: 2, gpus: 1, checkpoint_interval_s: 600}
        - {count: 1, gpus: 1, checkpoint_interval_s: 600}
journal: {sqlite_path: JOURNAL}
"""


def run_controller(tmp_path: Path, log_format: str) -> list[str]:
    config = tmp_path / f"{log_format}.yaml"
    config.write_text(CONFIG.replace("JOURNAL", str(tmp_path / f"{log_format}.db")))
    command = [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(config)]
    done = subprocess.run(
        [*command, "--ticks", "2", "--log-format", log_format],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_run_logs_each_ticks_numbers_as_keys_of_its_json_event(tmp_path: Path) -> None:
    logged = [json.loads(line) for line in run_controller(tmp_path, "json")]
    ticks = [e for e in logged if "launched" in e]
    assert [e["tick"] for e in ticks] == [0, 1], "ticks count from 0"
    first, second = ticks
    for event in ticks:
        assert (event["level"], event["logger"]) == ("info", "autoscaler.app.runner")
        assert event["demand_known"] is True
        assert (event["pending_gpus"], event["pending_jobs"]) == (3, 3)
        assert isinstance(event["duration_ms"], float) and event["duration_ms"] >= 0
        assert isinstance(event["month_spend_dollars"], float), "a journal is configured"
        assert (event["drained"], event["terminated"], event["notices"]) == (0, 0, 0)
        assert event["errors"] == 0
        assert "held" not in event and "clamps" not in event
        assert set(event) - {"ts", "level", "logger", "msg", "fencing_token"} <= {
            "tick",
            *TICK_SUMMARY_FIELDS,
        }
        # msg is the line the text format prints, the same numbers in it
        assert str(event["msg"]).startswith(
            f"tick={event['tick']} pending_gpus=3 instances={event['instances']} "
            f"launched={event['launched']} terminated=0 notices=0 ms="
        )
    assert first["launched"] == 3 and first["instances"] == 0
    assert second["launched"] == 0 and second["instances"] == 3


def test_the_text_format_keeps_the_summary_line_and_no_json(tmp_path: Path) -> None:
    lines = run_controller(tmp_path, "text")
    [first] = [line for line in lines if " tick=0 pending_gpus=" in line]
    assert " INFO autoscaler.app.runner tick=0 pending_gpus=3 instances=0 launched=3 " in first
    assert " month_spend=$" in first
    assert not any(line.startswith("{") for line in lines)


def test_a_tick_without_demand_says_demand_known_false_and_leaves_the_counts_out() -> None:
    """An unknown demand is never a count of 0 nor the word "unknown" under a count's key (one
    key, one type, for the log store's index); the text line still says unknown."""
    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    t.queue.error = SourceError("queue down")
    report = t.controller.tick()
    values = summary_fields(report)
    assert values["demand_known"] is False
    assert "pending_gpus" not in values and "pending_jobs" not in values
    assert values["errors"] == len(report.errors) >= 1
    assert " pending_gpus=unknown " in summary(report)

    # the formatters on a record made as logger.warning(..., extra=...) makes it: no handler, so
    # no level or logging.disable an earlier test in this worker left behind can swallow it
    record = logging.getLogger("test-tick-summary").makeRecord(
        "test-tick-summary",
        logging.WARNING,
        __file__,
        0,
        summary(report),
        (),
        None,
        extra={"tick": report.tick, **values},
    )
    event = json.loads(JsonFormatter(Secrets()).format(record))
    assert event["demand_known"] is False and event["errors"] == values["errors"]
    assert "pending_gpus" not in event
    assert PlainFormatter(Secrets()).format(record).rstrip().endswith(summary(report))


def test_clamps_are_the_sorted_names_of_the_rules_that_clamped_and_only_then() -> None:
    t = rig([pool("a")], {"a": 1.0}, limits={"max_instances": 1, "max_cost_per_hour": 1.5})
    t.queue.jobs = [job(f"j{i}") for i in range(3)]
    report = t.controller.tick()
    values = summary_fields(report)
    assert values["clamps"] == sorted({c.rule for c in report.clamps})
    assert values["clamps"] and values["clamps"] == sorted(values["clamps"])
    assert "clamps=" + ",".join(values["clamps"]) in summary(report)
    assert values["launched"] == 1

    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    report = t.controller.tick()
    assert not report.clamps and "clamps" not in summary_fields(report)
    assert "clamps=" not in summary(report)
