"""Where node agents deliver interruption notices they read on the node (AWS IMDS, GCP metadata,
Azure Scheduled Events): a small authenticated HTTP endpoint feeding the controller's next tick,
which a new notice for an instance the controller owns wakes at once (``autoscaler.spi.wakeups``
limits every other wake-up).

``POST /v1/notices`` with ``Authorization: Bearer <token>``, ``Content-Type: application/json``
(or none) and a body ``{"instance_id": "...", "kind": "terminate" | "rebalance", "deadline":
<epoch s or null>, "source": "aws-imds"}``: 202 when accepted, 401 for a wrong token, 400 for a
body that is not a notice, and the statuses of ``autoscaler.ops.http_in`` for a request that is not
well-formed HTTP. The token is compared in constant time and never logged.

``POST /v1/checkpoints`` with the same token and ``{"job_id": "...", "duration_s": 12.5, "at":
<epoch s or omitted>, "node": "..."}`` is how a job reports a checkpoint it finished.

Bodies are read strictly: numbers are JSON numbers (``true`` or ``"12"`` is not one), finite,
and a deadline or a time is one a clock can reach (``autoscaler.model.notices``); names are
bounded (``instance_id`` and ``node`` 256 characters, ``source`` 64, ``job_id`` 256).
Notices wait, one per instance and kind, until a tick takes them; past ``MAX_PENDING`` waiting
notices the inbox answers 503 and the agent retries. A standby replica (another holds the leader
lock) answers 503 to both paths too: behind a Service that sends to every replica, the agent's
retry opens a new connection and reaches the leader, and nothing waits where no tick reads it.
"""

from __future__ import annotations

import hmac
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from autoscaler.fleet.checkpoints import CheckpointLedger, CheckpointReport
from autoscaler.model import InterruptionNotice, NoticeKind
from autoscaler.model.clock import Clock
from autoscaler.model.notices import (
    ID_CHARS,
    ID_MAX_CHARS,
    InstanceName,
    SourceName,
    deadline_problem,
    stamp_problem,
)
from autoscaler.ops.http_in import (
    Answer,
    Head,
    HttpError,
    HttpLimits,
    RequestReader,
    StrictHttpServer,
)
from autoscaler.spi.wakeups import Tally, Wakeups

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024
REQUEST_TIMEOUT_S = 10.0
MAX_PENDING = 10_000
MAX_CHECKPOINT_S = 7 * 86_400.0
BOUNDARY = "inbox"
PATHS = ("/v1/notices", "/v1/checkpoints")

JobId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=ID_MAX_CHARS, pattern=rf"^[+{ID_CHARS}]+$"),
]


def _now(info: ValidationInfo) -> float | None:
    context = info.context
    return context.get("now") if isinstance(context, Mapping) else None


class NoticeBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    instance_id: InstanceName
    kind: NoticeKind = NoticeKind.TERMINATE
    deadline: float | None = Field(None, allow_inf_nan=False)
    source: SourceName = "agent"

    @field_validator("deadline")
    @classmethod
    def _reachable(cls, value: float | None, info: ValidationInfo) -> float | None:
        now = _now(info)
        problem = None if value is None or now is None else deadline_problem(value, now)
        if problem is not None:
            raise ValueError(f"the deadline {problem}")
        return value


class CheckpointPost(BaseModel):
    """A job's report of a checkpoint it finished; ``at`` defaults to when it arrived."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    job_id: JobId
    at: float | None = Field(None, allow_inf_nan=False)
    duration_s: float = Field(0.0, ge=0.0, le=MAX_CHECKPOINT_S, allow_inf_nan=False)
    node: InstanceName | None = None

    @field_validator("at")
    @classmethod
    def _plausible(cls, value: float | None, info: ValidationInfo) -> float | None:
        now = _now(info)
        problem = None if value is None or now is None else stamp_problem(value, now)
        if problem is not None:
            raise ValueError(f"the time {problem}")
        return value


class NoticeInbox:
    """Notices posted by agents, kept (one per instance and kind) until a tick takes them."""

    def __init__(self, clock: Clock, max_pending: int = MAX_PENDING) -> None:
        self.clock = clock
        self.max_pending = max_pending
        self.wakeups = Wakeups()
        self._lock = threading.Lock()
        self._notices: dict[tuple[str, NoticeKind], InterruptionNotice] = {}

    @property
    def tally(self) -> Tally:
        return self.wakeups.tally

    @property
    def rejected(self) -> int:
        """Requests answered with an error status."""
        return sum(
            count
            for (boundary, outcome), count in self.tally.snapshot().items()
            if boundary == BOUNDARY and outcome[:1] in ("4", "5")
        )

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        self.wakeups = Wakeups.of(wakeup)

    def post(self, body: NoticeBody) -> InterruptionNotice | None:
        """Keep the notice (a repeat keeps the first); None when too many wait already."""
        notice = InterruptionNotice(
            instance_id=body.instance_id,
            pool="unknown",
            kind=body.kind,
            received_at=self.clock.now(),
            deadline=body.deadline,
        )
        key = (body.instance_id, body.kind)
        with self._lock:
            kept = self._notices.get(key)
            if kept is None:
                if len(self._notices) >= self.max_pending:
                    return None
                self._notices[key] = kept = notice
        self.wakeups.notice(body.instance_id, body.kind)
        return kept

    def wake(self) -> None:
        """A checkpoint report arrived: a waiting evacuation may need it."""
        self.wakeups.checkpoint()

    def take(self) -> list[InterruptionNotice]:
        with self._lock:
            taken, self._notices = list(self._notices.values()), {}
        return taken


class InboxServer:
    """Serves the inbox over HTTP, or HTTPS with ``tls``, through ``autoscaler.ops.http_in``."""

    def __init__(
        self,
        inbox: NoticeInbox,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        checkpoints: CheckpointLedger | None = None,
        limits: HttpLimits | None = None,
    ) -> None:
        if not token:
            raise ValueError("the notice inbox needs a non-empty token")
        self.inbox = inbox
        self.checkpoints = checkpoints if checkpoints is not None else CheckpointLedger()
        self._token = token.encode()
        self.limits = limits or HttpLimits(body_bytes=MAX_BODY, request_s=REQUEST_TIMEOUT_S)
        self._server = StrictHttpServer(host, port, self.handle, self.limits, tls, self._counted)
        self.port: int = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        """Serve from a daemon thread; notices and checkpoint reports wake the run loop through
        ``wakeup`` (the loop's ``Wakeups``, or a plain callable)."""
        self.inbox.start(wakeup)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="notice-inbox",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread = None
        self._server.server_close()

    def _counted(self, status: int) -> None:
        self.inbox.tally.add(BOUNDARY, str(status) if status else "tls-failed")

    def authorised(self, header: str | None) -> bool:
        """Constant-time: how much of a wrong token matches never shows in the answer's time."""
        scheme, _, presented = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(presented.strip().encode("latin-1"), self._token)

    def handle(self, head: Head, reader: RequestReader) -> Answer:
        """Route, authorise, then read the body: nothing of a request without the token is read
        past its headers."""
        if head.path not in PATHS:
            raise HttpError(404, f"not found: serving {' and '.join(PATHS)}")
        if head.method != "POST":
            raise HttpError(405, "only POST is served", {"Allow": "POST"})
        if not self.authorised(head.header("authorization")):
            raise HttpError(401, "a valid bearer token is required")
        if not self.inbox.wakeups.leading():
            raise HttpError(
                503, "this replica is a standby; retry and the Service sends it to the leader"
            )
        kind = head.header("content-type")
        if kind is not None and not _is_json(kind):
            raise HttpError(415, "the body must be application/json")
        body = reader.body()
        now = self.inbox.clock.now()
        try:
            if head.path == "/v1/notices":
                return self._notice(NoticeBody.model_validate_json(body, context={"now": now}))
            return self._checkpoint(
                CheckpointPost.model_validate_json(body, context={"now": now}), now
            )
        except ValidationError as exc:
            raise HttpError(400, _first_error(exc)) from None

    def _notice(self, body: NoticeBody) -> Answer:
        notice = self.inbox.post(body)
        if notice is None:
            raise HttpError(503, "too many notices wait for the next tick; retry shortly")
        log.info("notice from %s: %s %s", body.source, notice.kind, notice.instance_id)
        return 202, {"accepted": notice.instance_id}

    def _checkpoint(self, body: CheckpointPost, now: float) -> Answer:
        at = body.at if body.at is not None else now
        self.checkpoints.record(CheckpointReport(body.job_id, at, body.duration_s, body.node))
        self.inbox.wake()
        log.debug("checkpoint of job %s (%.1f s)", body.job_id, body.duration_s)
        return 202, {"accepted": body.job_id}


def _is_json(content_type: str) -> bool:
    kind, *parameters = (part.strip().lower() for part in content_type.split(";"))
    if kind != "application/json":
        return False
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip() == "charset" and value.strip().strip('"') not in ("utf-8", "utf8"):
            return False
    return True


def _first_error(exc: ValidationError) -> str:
    """The first problem, naming its field, without echoing the input."""
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    message: Any = first["msg"]
    return f"{where}: {message}" if where else str(message)
