"""Structured logs: one JSON object per line with the fields a search filters on, and no secret
in any line whatever the code that logged it passed along."""

from __future__ import annotations

import io
import json
import logging

from fakes import job, pool, rig

from autoscaler.app.runner import log_actions
from autoscaler.model.logs import JsonFormatter, Secrets, register_environment_secrets

TOKEN = "s3cr3t-agent-token-value"


def capture(secrets: Secrets) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(secrets))
    logger = logging.getLogger(f"test-logs-{id(stream)}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_each_action_is_one_json_event_with_tick_pool_action_and_request_id() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    report = t.controller.tick()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(Secrets()))
    runner_log = logging.getLogger("autoscaler.app.runner")
    runner_log.addHandler(handler)
    level = runner_log.level
    runner_log.setLevel(logging.INFO)
    try:
        log_actions(report)
    finally:
        runner_log.removeHandler(handler)
        runner_log.setLevel(level)
    (event,) = [e for e in lines(stream) if e.get("action") == "launch"]
    launch = next(a for a in report.actions if a.kind == "launch")
    assert event["tick"] == report.tick
    assert event["pool"] == "a"
    assert event["request_id"] == launch.request_id
    assert event["outcome"] == "ok"
    assert event["instance_ids"] == list(launch.instance_ids)
    assert event["level"] == "info" and event["logger"] == "autoscaler.app.runner"


def test_registered_and_shaped_secrets_never_reach_a_line() -> None:
    secrets = Secrets()
    secrets.add(TOKEN)
    logger, stream = capture(secrets)
    logger.info("posting with %s", TOKEN)
    logger.warning("connect failed: postgresql://ctl:hunter2pass@db:5432/journal refused")
    logger.error("header was Authorization: Bearer abc.def-ghi")
    logger.error("aws said: aws_secret_access_key=wJalrXUtnFEMI/K7MDENG")
    try:
        raise RuntimeError(f"token {TOKEN} rejected")
    except RuntimeError:
        logger.exception("request failed", extra={"request_id": "r-1", "job_id": TOKEN})
    text = stream.getvalue()
    for secret in (TOKEN, "hunter2pass", "abc.def-ghi", "wJalrXUtnFEMI/K7MDENG"):
        assert secret not in text
    events = lines(stream)
    assert len(events) == 5, "one line per event, tracebacks included"
    assert "***" in str(events[0]["msg"])
    assert "RuntimeError" in str(events[-1]["error"])
    assert events[-1]["request_id"] == "r-1"


def test_environment_credentials_are_scrubbed_by_name() -> None:
    secrets_before = Secrets()
    env = {
        "AWS_SECRET_ACCESS_KEY": "AKIAFAKESECRETVALUE123",
        "AZURE_CLIENT_SECRET": "azure-client-secret-xyz",
        "GPU_AUTOSCALER_TOKEN": "inbox-token-1234567",
        "HOME": "/root",
        "SHORT_TOKEN": "abc",
    }
    register_environment_secrets(env)
    logger, stream = capture(secrets_before)
    from autoscaler.model.logs import SECRETS

    logger.handlers[0].setFormatter(JsonFormatter(SECRETS))
    logger.info("env dump: %s", " ".join(env.values()))
    text = stream.getvalue()
    assert "AKIAFAKESECRETVALUE123" not in text
    assert "azure-client-secret-xyz" not in text
    assert "inbox-token-1234567" not in text
    assert "/root" in text, "only what is named secret is scrubbed"


def test_a_long_message_is_cut_after_it_is_scrubbed_so_no_half_secret_is_left() -> None:
    """An upstream's 100,000-character error body: the line is bounded, says how much was cut,
    and a secret straddling the cut is scrubbed whole first (cutting first would leave its
    first half in the line)."""
    from autoscaler.model.logs import MAX_FIELD_CHARS

    secrets = Secrets()
    secrets.add(TOKEN)
    logger, stream = capture(secrets)
    body = "x" * (MAX_FIELD_CHARS - 5) + TOKEN + "y" * 100_000
    logger.error("upstream said: %s", body)
    (event,) = lines(stream)
    message = str(event["msg"])
    assert TOKEN[:5] not in message and TOKEN not in stream.getvalue()
    assert len(message) < MAX_FIELD_CHARS + 100
    assert message.endswith("more characters cut]")
