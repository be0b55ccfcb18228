"""Structured logs: one JSON object per line, with the tick, pool, action and request id a line
is about as fields (and the numbers of the controller's tick summary), and every secret the
process knows scrubbed before a line is written. The controller and the node agent both log
through ``configure``, so their lines have the same shape and the same scrubbing.

Secrets are scrubbed at the handler, not at each call site: a token read from a file, a database
password, an AWS secret key or a bearer header is replaced by ``***`` wherever it appears (the
message, its fields, an exception's text), so a careless ``log.error("%s", exc)`` cannot leak one
(``autoscaler.model.secrets`` says what is scrubbed and why it is linear in the text). A string
longer than ``MAX_FIELD_CHARS`` is cut *after* it is scrubbed, so the cut never leaves half a
secret, and the line says how much was cut: an upstream's 60 KB error body is not a log line.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from autoscaler.model.secrets import (
    REDACTED,
    SECRETS,
    Secrets,
    register_environment_secrets,
    register_secret,
)

__all__ = [
    "FIELDS",
    "MAX_FIELD_CHARS",
    "REDACTED",
    "SECRETS",
    "TICK_SUMMARY_FIELDS",
    "JsonFormatter",
    "PlainFormatter",
    "Secrets",
    "bounded",
    "configure",
    "fields",
    "names",
    "register_environment_secrets",
    "register_secret",
]

MAX_FIELD_CHARS = 16_384

CONTEXT_FIELDS = (
    "tick",
    "fencing_token",
    "pool",
    "action",
    "outcome",
    "request_id",
    "instance_ids",
    "job_id",
    "requested",
    "done",
    "provider",
    "source",
)

TICK_SUMMARY_FIELDS = (
    "demand_known",
    "pending_gpus",
    "pending_jobs",
    "instances",
    "launched",
    "drained",
    "terminated",
    "notices",
    "duration_ms",
    "month_spend_dollars",
    "held",
    "clamps",
    "errors",
)
"""The numbers of the controller's per-tick summary line, as top-level keys of its JSON event,
so a log search can filter and plot them without parsing the message. A key is left out where
the tick has no value for it (``pending_gpus`` when demand is unknown, ``held`` when nothing
held scale-up): one key never carries two types, which a log store's index would refuse."""

FIELDS = CONTEXT_FIELDS + TICK_SUMMARY_FIELDS


def bounded(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters cut]"


class JsonFormatter(logging.Formatter):
    def __init__(self, secrets: Secrets = SECRETS) -> None:
        super().__init__()
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                event[name] = value
        if record.exc_info:
            event["error"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(
            {key: self._scrubbed(value) for key, value in event.items()},
            default=str,
            ensure_ascii=False,
        )

    def _scrubbed(self, value: Any) -> Any:
        """Each string is scrubbed before encoding, so the line stays valid JSON."""
        if isinstance(value, str):
            return bounded(self.secrets.scrub(value))
        if isinstance(value, (list, tuple)):
            return [self._scrubbed(item) for item in value]
        return value


class PlainFormatter(logging.Formatter):
    """For a terminal: the same scrubbing, a human line."""

    def __init__(self, secrets: Secrets = SECRETS) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        return bounded(self.secrets.scrub(super().format(record)))


def configure(level: str = "INFO", json_lines: bool = True, stream: TextIO | None = None) -> None:
    """Route every logger to one handler on stderr (or ``stream``), scrubbing the environment's
    secrets."""
    register_environment_secrets()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else PlainFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("botocore", "urllib3", "azure", "google", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call, leaving out what is unset."""
    return {k: v for k, v in values.items() if v is not None and v != ()}


def names(values: Iterable[str]) -> str:
    return ",".join(values)
