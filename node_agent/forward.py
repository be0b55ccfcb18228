"""Delivers the node's notices to the controller's inbox (``POST /v1/notices``, bearer token).

Retries are short and bounded (tenacity): GCP and Azure give about 30 s, so a notice the
controller cannot take within ``give_up_s`` is reported and dropped rather than retried past the
point where it could still help. A 401, or any other 4xx but a timeout or too-many-requests, is
never retried: the token or the request is wrong, and hammering the controller would not fix it
(5xx, such as the inbox's 503 when too many notices wait, is retried). The token never appears
in a log line or an error message.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import urllib.error
import urllib.request
from enum import StrEnum
from pathlib import Path

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from autoscaler.model.errors import InputError, describe
from autoscaler.model.logs import register_secret
from autoscaler.model.secrets import read_secret_env
from node_agent.metadata import AgentNotice, NoticeMetrics

log = logging.getLogger(__name__)
INBOX_PATH = "/v1/notices"
# The 4xx answers a retry may fix: the request was too slow (408) or too early (425, 429).
RETRIED_4XX = (408, 425, 429)


class Delivery(StrEnum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    FAILED = "failed"


class _TransientError(Exception):
    """The controller could not take the notice now (down, overloaded, 5xx): worth a retry."""


class _RefusedError(Exception):
    """The controller will never take it as sent (401, 400): retrying cannot help."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def load_token(token_file: Path | None, token_env: str) -> str:
    """From ``token_file`` when given, else from the environment variable ``token_env``."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise InputError(
                str(token_file), f"cannot read the token file ({exc.strerror})"
            ) from None
        if not token:
            raise InputError(str(token_file), "the token file is empty")
        register_secret(token)
        return token
    token = read_secret_env(token_env, "--token-env").strip()
    if not token:
        raise InputError(
            "--token-env", f"the environment variable {token_env} holding the token is not set"
        )
    register_secret(token)
    return token


class Forwarder:
    def __init__(
        self,
        controller_url: str,
        token: str,
        metrics: NoticeMetrics,
        ca_file: Path | None = None,
        timeout_s: float = 3.0,
        give_up_s: float = 20.0,
        max_attempts: int = 10,
    ) -> None:
        if not controller_url.startswith(("http://", "https://")):
            raise InputError("--controller-url", f"{controller_url!r} is not an http(s) URL")
        self.url = controller_url.rstrip("/") + INBOX_PATH
        self._token = token
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.give_up_s = give_up_s
        self.max_attempts = max_attempts
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if controller_url.startswith("https://"):
            try:
                context = ssl.create_default_context(
                    cafile=str(ca_file) if ca_file is not None else None
                )
            except (OSError, ssl.SSLError) as exc:
                raise InputError(str(ca_file), f"cannot load the CA file ({exc})") from None
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def send(self, notice: AgentNotice) -> Delivery:
        retrying = Retrying(
            retry=retry_if_exception_type(_TransientError),
            stop=stop_after_delay(self.give_up_s) | stop_after_attempt(self.max_attempts),
            wait=wait_exponential(multiplier=0.2, max=2.0) + wait_random(0, 0.2),
            reraise=False,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._post(notice)
        except _RefusedError as exc:
            self.metrics.forward_failures.labels(reason=exc.reason).inc()
            log.error("%s; notice for %s not delivered", exc, notice.instance_id)
            return Delivery.REFUSED
        except RetryError as exc:
            self.metrics.forward_failures.labels(reason="unreachable").inc()
            log.error(
                "could not deliver the %s notice for %s to the controller after %d tries: %s",
                notice.kind.value,
                notice.instance_id,
                exc.last_attempt.attempt_number,
                exc.last_attempt.exception(),
            )
            return Delivery.FAILED
        log.info(
            "delivered the %s notice for %s to the controller",
            notice.kind.value,
            notice.instance_id,
        )
        return Delivery.DELIVERED

    def _post(self, notice: AgentNotice) -> None:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(notice.inbox_body()).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {self._token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                detail = exc.read(512).decode("utf-8", errors="replace")
            if exc.code == 401:
                raise _RefusedError(
                    "unauthorised",
                    f"the controller refused the token (HTTP 401 from {self.url}); "
                    "check --token-file / --token-env against the controller's inbox token",
                ) from None
            if 400 <= exc.code < 500 and exc.code not in RETRIED_4XX:
                raise _RefusedError(
                    "rejected",
                    f"the controller rejected the notice (HTTP {exc.code}: {_one_line(detail)})",
                ) from None
            raise _TransientError(f"HTTP {exc.code} from {self.url}") from None
        except ssl.SSLError as exc:
            raise _RefusedError("tls", f"TLS to the controller failed ({exc.reason})") from None
        except http.client.HTTPException as exc:
            raise _TransientError(f"{self.url}: not an HTTP answer ({describe(exc)})") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, ssl.SSLError):
                raise _RefusedError(
                    "tls", f"TLS to the controller failed ({reason.reason})"
                ) from None
            raise _TransientError(f"{self.url}: {reason or type(exc).__name__}") from None


def _one_line(text: str) -> str:
    """An answer's body quoted in a log line: its first line, bounded."""
    stripped = text.strip()
    return (stripped.splitlines()[0] if stripped else "")[:200]
