"""Structured logs: one JSON object per line, with the tick, pool, action and request id a line
is about as fields, and every secret the process knows scrubbed before a line is written.

Secrets are scrubbed at the handler, not at each call site: a token read from a file, a database
password, an AWS secret key or a bearer header is replaced by ``***`` wherever it appears (the
message, its fields, an exception's text), so a careless ``log.error("%s", exc)`` cannot leak one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

REDACTED = "***"
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
# Shapes of secrets that may reach a message without being registered: credentials in a URL,
# bearer headers, key=value pairs whose key says secret, AWS secret access keys.
_PATTERNS = (
    (re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/\s@]+:)[^@\s]+(@)"), r"\1" + REDACTED + r"\2"),
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1" + REDACTED),
    (
        re.compile(
            r"(?i)((?:password|passwd|secret|token|api[_-]?key|access[_-]?key|client[_-]?secret)"
            r"[\"']?\s*[=:]\s*[\"']?)[^\s\"',;&]+"
        ),
        r"\1" + REDACTED,
    ),
)


class Secrets:
    """The secret values this process holds, registered where each is read."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *values: str | None) -> None:
        with self._lock:
            self._values.update(v for v in values if v and len(v) >= 4)

    def scrub(self, text: str) -> str:
        with self._lock:
            values = sorted(self._values, key=len, reverse=True)
        for value in values:
            if value in text:
                text = text.replace(value, REDACTED)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


SECRETS = Secrets()


def register_secret(*values: str | None) -> None:
    """Call where a credential is read, before anything can log it."""
    SECRETS.add(*values)


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
        for name in CONTEXT_FIELDS:
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
            return self.secrets.scrub(value)
        if isinstance(value, (list, tuple)):
            return [self._scrubbed(item) for item in value]
        return value


class PlainFormatter(logging.Formatter):
    """For a terminal: the same scrubbing, a human line."""

    def __init__(self, secrets: Secrets = SECRETS) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        return self.secrets.scrub(super().format(record))


_SECRET_NAMES = re.compile(r"(?i)secret|token|passw|credential|private|_dsn$|_key$")


def register_environment_secrets(environ: dict[str, str] | None = None) -> None:
    """Values of environment variables whose names say they are secret (``AWS_SECRET_ACCESS_KEY``,
    ``AZURE_CLIENT_SECRET``, ``GPU_AUTOSCALER_TOKEN``…): long enough to be one, never logged."""
    environ = dict(os.environ) if environ is None else environ
    SECRETS.add(*(v for k, v in environ.items() if _SECRET_NAMES.search(k) and len(v) >= 8))


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
