"""Fuzz boundary: the log scrubber, which every upstream error text and notice field reaches.

Each input is a text (an upstream error body, a notice field, a mutated real log message, or a
long run in the shapes that made the old URL pattern quadratic, up to a million characters)
with secrets planted in it: registered values anywhere (inside words too), and unregistered
credentials in their usual shapes (a bearer header, a password in a URL, ``password=...``),
some repeated later without the shape. It goes through the real log formatter
(``autoscaler.model.logs.JsonFormatter``). The rules, checked independently of the scrubber: the
line is one valid JSON object, no planted value appears in it, it is bounded in length, and it
comes back within the harness's hang limit whatever the length (the old pattern needed ~30 s
for 64,000 characters, hours for a million).
"""

from __future__ import annotations

import json
import logging
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass

from harness import Outcome, mutate_text

from autoscaler.model.logs import MAX_FIELD_CHARS, JsonFormatter
from autoscaler.model.secrets import Secrets

SEEDS = (
    "connect failed: postgresql://ctl:hunter2pass@db:5432/journal refused",
    "prometheus source 'prom': HTTP 401 Unauthorized: Prometheus says unauthorized: bad token",
    "header was Authorization: Bearer abc.def-ghi",
    "aws said: aws_secret_access_key=wJalrXUtnFEMI/K7MDENG",
    'notice {"instance_id": "i-0abc", "deadline": 1700000000, "kind": "spot"}',
    "redis source 'work' (key 'jobs' at 127.0.0.1:6379): WRONGPASS invalid username-password",
    "observe: queue source prom: SourceError: timed out after 5s",
)
LONG_SHAPES = (
    lambda n: "a" * n,
    lambda n: ("a://b:c" * (n // 7 + 1))[:n],
    lambda n: ("a." * (n // 2 + 1))[:n],
    lambda n: ("token=" + "x" * 9 + " ") * (n // 16 + 1),
    lambda n: "x://u:" + "@" * n,
    lambda n: "http://u:" + "p@" * (n // 2),
    lambda n: ("Bearer " * (n // 7 + 1))[:n],
    lambda n: ("password" + " " * 50) * (n // 58 + 1),
)
TOKEN_CHARS = string.ascii_letters + string.digits + "._-"


@dataclass(frozen=True)
class Planted:
    text: str
    secrets: tuple[str, ...]  # every value that must not appear in the line
    registered: tuple[str, ...]


def _token(rng: random.Random, length: int = 0) -> str:
    return "".join(rng.choice(TOKEN_CHARS) for _ in range(length or rng.randrange(8, 40)))


class ScrubBoundary:
    name = "log scrubber (any upstream text, through the log formatter)"

    def seeds(self) -> Sequence[object]:
        return [Planted(seed, (), ()) for seed in SEEDS]

    def generate(self, rng: random.Random) -> object:
        if rng.random() < 0.25:
            length = rng.choice([1_000, 16_000, 64_000, 250_000, 1_000_000])
            base = rng.choice(LONG_SHAPES)(length)
        else:
            base = mutate_text(rng.choice(SEEDS), rng)
        registered = tuple(_token(rng) for _ in range(rng.randrange(0, 3)))
        shaped = []
        pieces = [base]
        for value in registered:
            at = rng.randrange(len(pieces[-1]) + 1)
            pieces[-1] = pieces[-1][:at] + value + pieces[-1][at:]  # inside words too
        for _ in range(rng.randrange(0, 4)):
            value = _token(rng, rng.randrange(8, 30))
            shaped.append(value)
            form = rng.choice(
                [
                    f" Bearer {value} ",
                    f" postgresql://user:{value}@db:5432/j ",
                    f" https://u:{value}@host/x ",
                    f" password={value} ",
                    f' "token": "{value}" ',
                    f" api_key: {value} ",
                ]
            )
            pieces.append(form)
            if rng.random() < 0.5:
                pieces.append(f" and again {value} later ")
        rng.shuffle(pieces)
        return Planted("".join(pieces), (*registered, *shaped), registered)

    def check(self, data: object) -> Outcome:
        assert isinstance(data, Planted)
        secrets = Secrets()
        secrets.add(*data.registered)
        record = logging.LogRecord("fuzz", logging.ERROR, __file__, 1, "%s", (data.text,), None)
        line = JsonFormatter(secrets).format(record)
        if "\n" in line:
            return Outcome.wrong("the log line spans several lines")
        message = json.loads(line)["msg"]
        for secret in data.secrets:
            if secret in line:
                return Outcome.wrong(f"{secret!r} reached the log line")
        if len(message) > MAX_FIELD_CHARS + 100:
            return Outcome.wrong(f"a {len(message)}-character message was not cut")
        return Outcome.accepted()

    def close(self) -> None:
        """Nothing was started."""


BOUNDARIES = [ScrubBoundary()]
