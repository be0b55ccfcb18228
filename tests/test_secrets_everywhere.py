"""Secrets planted everywhere never reach any output of the real CLI.

The process knows secrets from the environment (the inbox's token, a Prometheus bearer token
under a name that does not say "token", the journal's PostgreSQL DSN and its password, a cloud
key) and one pasted by mistake where a config field wants a variable's NAME. A real local HTTP
server plays a Prometheus that answers 401 with an error body echoing the bearer header and,
a few words later, the token alone, plus every other planted value, as a careless upstream
would. Every command is run as a subprocess (``plan``, ``plan --json``, ``run``, ``report
--journal-postgres-env``, ``validate``, and the ones that must refuse a pasted secret), and
every stream (stdout, stderr and its JSON log lines, error messages, the report's files) is
searched for every planted value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict
from redis_server import free_port
from waits import bound

CLI = str(Path(sys.executable).parent / "gpu-autoscaler")

PROM_TOKEN = "prom-bearer-7f3a9c2e51b04d68"
INBOX_TOKEN = "inbox-token-0b9e77d1c3a24f5e"
CLOUD_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY-planted-key"
PASTED = "pasted-by-mistake-3c8e1f0a9b7d"
PASTED_DSN = "postgresql://ctl:pasted-dsn-password-55e1@db:5432/journal"


@dataclass
class Planted:
    env: dict[str, str]
    secrets: tuple[str, ...]
    dsn: str
    prometheus: str


class EchoingPrometheus(BaseHTTPRequestHandler):
    """Answers every query 401, its error body echoing what it was sent and what it knows:
    the first time the token alone (no ``Bearer`` before it to give it away), then the whole
    header and the token again a few words later."""

    echoed: tuple[str, ...] = ()
    answered = 0

    def do_GET(self) -> None:
        header = self.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ")
        type(self).answered += 1
        if type(self).answered == 1:
            error = f"credential {token} is unknown"
        else:
            error = (
                f"rejected {header!r}: credential {token} is unknown; "
                f"env dump: {' '.join(self.echoed)}"
            )
        body = json.dumps({"status": "error", "errorType": "unauthorized", "error": error}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the CLI's output, not the server's."""


@pytest.fixture
def planted(postgres_dsn: str) -> Iterator[Planted]:
    password = str(conninfo_to_dict(postgres_dsn)["password"])
    secrets = (PROM_TOKEN, INBOX_TOKEN, CLOUD_KEY, postgres_dsn, password)
    handler = type("Handler", (EchoingPrometheus,), {"echoed": secrets, "answered": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {
        **os.environ,
        "PROM_BEARER": PROM_TOKEN,  # a name that does not say it is secret
        "INBOX_SHARED": INBOX_TOKEN,
        "JOURNAL_CONNECTION": postgres_dsn,
        "AWS_SECRET_ACCESS_KEY": CLOUD_KEY,
    }
    try:
        yield Planted(env, (*secrets, PASTED, PASTED_DSN), postgres_dsn, server.server_address[1])  # type: ignore[arg-type]
    finally:
        server.shutdown()
        server.server_close()


def config(tmp_path: Path, planted: Planted, name: str = "c.yaml", **fields: str) -> Path:
    values = {
        "bearer_token_env": "PROM_BEARER",
        "token_env": "INBOX_SHARED",
        "postgres_dsn_env": "JOURNAL_CONNECTION",
        **fields,
    }
    path = tmp_path / name
    path.write_text(
        f"""fleet_id: secrets
tick_seconds: 0.2
sources:
  - kind: prometheus
    name: prom
    settings:
      url: http://127.0.0.1:{planted.prometheus}
      query: sum(queue_depth)
      timeout_s: 5
      bearer_token_env: {json.dumps(values["bearer_token_env"])}
inbox:
  listen: {{host: 127.0.0.1, port: {free_port()}}}
  token_env: {json.dumps(values["token_env"])}
journal: {{postgres_dsn_env: {json.dumps(values["postgres_dsn_env"])}}}
leader: {{kind: none}}
"""
    )
    return path


def cli(planted: Planted, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        capture_output=True,
        text=True,
        env=planted.env,
        timeout=bound(180),
        check=False,
    )


def assert_clean(planted: Planted, *texts: str) -> None:
    for text in texts:
        for secret in planted.secrets:
            assert secret not in text, f"{secret!r} leaked in: {text[:2000]}"


def test_plan_and_plan_json_print_the_echoed_failure_without_any_secret(
    planted: Planted, tmp_path: Path
) -> None:
    path = config(tmp_path, planted)
    text = cli(planted, "plan", "--config", str(path))
    as_json = cli(planted, "plan", "--json", "--config", str(path))
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    assert_clean(planted, text.stdout, text.stderr, as_json.stdout, as_json.stderr)
    assert "DEGRADED" in text.stdout and "401" in text.stdout and "***" in text.stdout
    plan = json.loads(as_json.stdout)
    assert plan["complete"] is False and plan["demand"]["known"] is False
    (problem,) = [p for p in plan["problems"] if "401" in p]
    assert "***" in problem


def test_run_logs_the_echoed_failure_without_any_secret(planted: Planted, tmp_path: Path) -> None:
    done = cli(planted, "run", "--config", str(config(tmp_path, planted)), "--ticks", "3")
    assert done.returncode == 0, done.stderr
    assert_clean(planted, done.stdout, done.stderr)
    events = [json.loads(line) for line in done.stderr.splitlines()]
    failed = [e for e in events if "401" in json.dumps(e)]
    assert failed and all("***" in json.dumps(e) for e in failed)


def test_report_from_the_postgres_journal_writes_and_prints_no_secret(
    planted: Planted, tmp_path: Path
) -> None:
    assert (
        cli(planted, "run", "--config", str(config(tmp_path, planted)), "--ticks", "2").returncode
        == 0
    )
    out = tmp_path / "report"
    done = cli(planted, "report", "--journal-postgres-env", "JOURNAL_CONNECTION", "--out", str(out))
    assert done.returncode == 0, done.stderr
    written = [p.read_text() for p in sorted(out.iterdir())]
    assert len(written) == 3
    assert_clean(planted, done.stdout, done.stderr, *written)
    refused = cli(planted, "report", "--journal-postgres-env", PASTED_DSN, "--out", str(out))
    assert refused.returncode == 2
    assert_clean(planted, refused.stdout, refused.stderr)
    assert "NAME of an environment variable" in refused.stderr


@pytest.mark.parametrize(
    ("command", "field", "pasted"),
    [
        ("run", "token_env", PASTED),
        ("run", "postgres_dsn_env", PASTED_DSN),
        ("run", "bearer_token_env", PASTED),
        ("plan", "bearer_token_env", PASTED),
        ("plan", "token_env", PASTED_DSN),
    ],
)
def test_a_secret_pasted_where_a_name_belongs_is_refused_unechoed(
    planted: Planted, tmp_path: Path, command: str, field: str, pasted: str
) -> None:
    path = config(tmp_path, planted, **{field: pasted})
    done = cli(
        planted, command, "--config", str(path), *(["--ticks", "1"] if command == "run" else [])
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert_clean(planted, done.stdout, done.stderr)
    line = done.stderr.strip().splitlines()[-1]
    assert field in line and "NAME of an environment variable" in line, line


def test_validate_says_nothing_secret(planted: Planted, tmp_path: Path) -> None:
    done = cli(planted, "validate", str(config(tmp_path, planted)))
    assert done.returncode == 0, done.stderr
    assert_clean(planted, done.stdout, done.stderr)
