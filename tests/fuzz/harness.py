"""The fuzz harness every boundary shares: one interface, one way of classifying what happened.

A *boundary* is a place where outside input enters the project (a config file, ``squeue
--json``, an exposition text, a notice over HTTP, an SQS message, the journal...). Each
boundary module ``tests/fuzz/boundary_<name>.py`` exposes ``BOUNDARIES: list[Boundary]``; the
CI tests (``tests/fuzz/test_fuzz_<name>.py``) drive them with hypothesis under the ``ci``
profile, and ``bench/fuzz_table.py`` (``make fuzz``) drives every one of them for many inputs
in worker processes and prints the issue-15 table: inputs, tracebacks, hangs, silent wrong
answers, per boundary.

A boundary's ``check`` feeds one input through the project's real code and says what the code
did with it:

* ``Outcome.accepted()``: the input was taken, and what came out obeys the documented rule
  (the boundary checked it, against an independent model where one fits);
* ``Outcome.rejected(message)``: the boundary's own error (``InputError`` or the documented
  error of that boundary), one line naming the file, line or field;
* ``Outcome.wrong(why)``: a silent wrong answer: accepted, but the result breaks the rule
  (negative demand, a NaN deadline, a message lost from a batch...).

Anything else ``check`` lets escape is a *traceback*; an input that takes longer than the time
limit is a *hang*. ``classify`` turns one call into one of the five kinds.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol

from hypothesis import HealthCheck, settings

Kind = Literal["accepted", "rejected", "wrong", "traceback", "hang"]

# A parse of one input that takes longer than this is a hang (the table counts > 10 s);
# CI runs on a busy 2-core machine, so nothing tighter is asserted.
HANG_S = 10.0


@dataclass(frozen=True)
class Outcome:
    kind: Literal["accepted", "rejected", "wrong"]
    detail: str = ""

    @classmethod
    def accepted(cls, detail: str = "") -> Outcome:
        return cls("accepted", detail)

    @classmethod
    def rejected(cls, message: str) -> Outcome:
        return cls("rejected", message)

    @classmethod
    def wrong(cls, why: str) -> Outcome:
        return cls("wrong", why)


class Boundary(Protocol):
    """One input boundary. ``generate`` must be deterministic for a given ``rng`` state."""

    name: str  # the row of the table, e.g. "Slurm squeue --json / sinfo --json"

    def seeds(self) -> Sequence[object]:
        """Real, valid examples (from the tests' fixtures): what mutation starts from."""
        ...

    def generate(self, rng: random.Random) -> object:
        """One hostile or careless input: a mutation of a seed, or made from scratch."""
        ...

    def check(self, data: object) -> Outcome:
        """Feed ``data`` through the real code; raise only if the code under test raised
        something that is not the boundary's own error."""
        ...

    def close(self) -> None:
        """Release servers or files the boundary started (called once, at the end)."""
        ...


@dataclass(frozen=True)
class Classified:
    kind: Kind
    detail: str
    seconds: float


def classify(boundary: Boundary, data: object, hang_s: float = HANG_S) -> Classified:
    """Run one input; a traceback is any exception escaping ``check``. Hangs are measured here
    as a slow return; ``bench/fuzz_table.py`` also kills a worker stuck past the limit."""
    started = time.perf_counter()
    try:
        outcome = boundary.check(data)
    except Exception as exc:  # classifying the escape is the point
        return Classified(
            "traceback", f"{type(exc).__name__}: {exc}"[:300], time.perf_counter() - started
        )
    seconds = time.perf_counter() - started
    if seconds > hang_s:
        return Classified("hang", outcome.detail[:300], seconds)
    return Classified(outcome.kind, outcome.detail[:300], seconds)


def assert_held(boundary: Boundary, data: object) -> Outcome:
    """For the CI tests: the input ended in ``accepted`` or ``rejected``, nothing else."""
    result = classify(boundary, data)
    assert result.kind in ("accepted", "rejected"), (
        f"{boundary.name}: {result.kind} after {result.seconds:.1f} s on {data!r:.300}: "
        f"{result.detail}"
    )
    return Outcome(result.kind, result.detail)  # type: ignore[arg-type]


def mutate_text(text: str, rng: random.Random) -> str:
    """A careless or hostile edit of a valid text: the mutations that found the issue-15 bugs
    (truncation, deletion, duplication, nesting, huge and non-finite numbers, odd characters)."""
    choice = rng.randrange(9)
    if not text:
        return rng.choice(["", "\x00", "{", "[" * 5000, "\ufeff"])
    at = rng.randrange(len(text) + 1)
    if choice == 0:
        return text[:at]
    if choice == 1:
        end = min(len(text), at + rng.randrange(1, 50))
        return text[:at] + text[end:]
    if choice == 2:
        piece = text[at : at + rng.randrange(1, 200)]
        return text[:at] + piece * rng.randrange(2, 50) + text[at:]
    if choice == 3:
        depth = rng.choice([10, 100, 1000, 100_000])
        return text[:at] + "[" * depth + "]" * depth + text[at:]
    if choice == 4:
        number = rng.choice(
            [
                "1e999",
                "-1e999",
                "NaN",
                "nan",
                "Infinity",
                "-0",
                "1" * 400,
                "1e-400",
                "9" * 30,
                "-1",
                "0x10",
                "1_000",
                "²",
                "٣",
                "true",
                "null",
                "253402300800",
            ]
        )
        return text[:at] + number + text[at:]
    if choice == 5:
        odd = rng.choice(
            [
                "\x00",
                "\ufeff",
                "\u202e",
                "é",
                "\r",
                "\t",
                "\n" * 3,
                "'",
                '"',
                "\\",
                "{{",
                "}}",
                "*",
                "&a",
                "!!python/name:os",
            ]
        )
        return text[:at] + odd + text[at:]
    if choice == 6:
        return text[:at] + "x" * rng.choice([1_000, 20_000, 70_000]) + text[at:]
    if choice == 7:
        lines = text.splitlines(keepends=True)
        if lines:
            line = rng.randrange(len(lines))
            lines.insert(line, lines[line])
        return "".join(lines)
    return "".join(chr(rng.randrange(0x20, 0x7F)) if rng.random() < 0.02 else c for c in text)


# Hypothesis profiles. ``ci`` keeps the whole fuzz set within the three minutes on two
# cores; ``fuzz`` is for ``make fuzz``'s longer runs. A deadline of HANG_S catches hangs without
# failing on a busy machine's slowness.
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=timedelta(seconds=HANG_S),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    print_blob=True,
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "5000")),
    deadline=timedelta(seconds=HANG_S),
    suppress_health_check=list(HealthCheck),
)

FUZZ = settings.get_profile(os.environ.get("FUZZ_PROFILE", "ci"))


def fuzz_settings() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``@fuzz_settings()`` on a hypothesis test: the profile the run chose (``ci`` default)."""
    return settings(FUZZ)
