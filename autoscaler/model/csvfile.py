"""CSV reading that reports a bad row as ``file:line: column: what was expected``.

The rules every CSV the project reads follows (docs/scenario.md, "Input limits"): UTF-8 text
(a byte-order mark is allowed), a header naming each column once, and every row with as many
fields as the header; numbers written in plain ASCII notation (``12``, ``-0.5``, ``1e3``),
finite and at most ``MAX_NUMBER`` in magnitude; times in ISO 8601 between 1970 and 2100.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import MAX_NUMBER, number_problem

_NUMBER = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?$")
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC).timestamp()
LATEST = datetime(2100, 1, 1, tzinfo=UTC).timestamp()
_SHOWN = 40


class Row:
    __slots__ = ("_source", "line", "values")

    def __init__(self, source: str, line: int, values: dict[str, str]) -> None:
        self._source = source
        self.line = line
        self.values = values

    @property
    def where(self) -> str:
        return f"{self._source}:{self.line}"

    def error(self, column: str, message: str) -> InputError:
        return InputError(self.where, message, field=column)

    def text(self, column: str) -> str:
        return (self.values.get(column) or "").strip()

    def number(
        self, column: str, *, minimum: float | None = None, maximum: float = MAX_NUMBER
    ) -> float:
        raw = self.text(column)
        if not _NUMBER.match(raw):
            raise self.error(column, f"expected a number, got {_shown(raw)}")
        value = float(raw)
        problem = number_problem(value)
        if problem:
            raise self.error(column, f"{problem}, got {_shown(raw)}")
        if minimum is not None and value < minimum:
            raise self.error(column, f"expected a number >= {minimum:g}, got {_shown(raw)}")
        if value > maximum:
            raise self.error(column, f"expected a number <= {maximum:g}, got {_shown(raw)}")
        return value

    def optional_number(
        self, column: str, *, minimum: float | None = None, maximum: float = MAX_NUMBER
    ) -> float | None:
        return self.number(column, minimum=minimum, maximum=maximum) if self.text(column) else None

    def integer(
        self, column: str, *, minimum: int | None = None, maximum: float = MAX_NUMBER
    ) -> int:
        raw = self.text(column)
        as_float = float(raw) if _NUMBER.match(raw) else float("nan")
        if not as_float.is_integer():
            raise self.error(column, f"expected a whole number, got {_shown(raw)}")
        problem = number_problem(as_float)
        if problem:
            raise self.error(column, f"{problem}, got {_shown(raw)}")
        value = int(as_float)
        if minimum is not None and value < minimum:
            raise self.error(column, f"expected a whole number >= {minimum}, got {_shown(raw)}")
        if value > maximum:
            raise self.error(column, f"expected a whole number <= {maximum:g}, got {_shown(raw)}")
        return value

    def timestamp(self, column: str) -> float:
        raw = self.text(column)
        return parse_timestamp(raw, self.where, column)


def parse_timestamp(raw: str, where: str, column: str | None = None) -> float:
    expected = f"expected an ISO-8601 time such as 2023-05-15T00:00:00Z, got {_shown(raw)}"
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = moment.timestamp()
    except (ValueError, OverflowError):
        raise InputError(where, expected, field=column) from None
    if not EARLIEST <= seconds < LATEST:
        raise InputError(where, f"expected a time between 1970 and 2100, got {_shown(raw)}", column)
    return seconds


def _shown(raw: str) -> str:
    text = repr(raw)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 4] + "...'"


def read_rows(path: Path, required: Sequence[str]) -> Iterator[Row]:
    source = str(path)
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(source, "no such file") from None
    except (OSError, ValueError) as exc:
        raise InputError(source, f"cannot be read: {exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, [])
            _check_header(source, header, required)
            for fields in reader:
                if not fields:
                    continue  # a blank line
                if len(fields) != len(header):
                    raise InputError(
                        f"{source}:{reader.line_num}",
                        f"expected {len(header)} fields as the header has, got {len(fields)}",
                    )
                yield Row(source, reader.line_num, dict(zip(header, fields, strict=True)))
        except csv.Error as exc:
            raise InputError(f"{source}:{reader.line_num}", f"not valid CSV: {exc}") from None
        except UnicodeDecodeError:
            raise InputError(f"{source}:{_undecodable_line(path)}", "not UTF-8 text") from None


def _undecodable_line(path: Path) -> int:
    """The line of the first byte that is not UTF-8 (text is decoded ahead of the rows)."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return raw.count(b"\n", 0, exc.start) + 1
    return 1


def _check_header(source: str, header: list[str], required: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise InputError(f"{source}:1", f"the column {_shown(name)} appears twice")
        seen.add(name)
    missing = [c for c in required if c not in seen]
    if missing:
        shown = ", ".join(_shown(h) if len(h) > _SHOWN else h for h in header[:30])
        raise InputError(
            f"{source}:1",
            "missing column(s) " + ", ".join(missing) + "; the header has: " + (shown or "nothing"),
        )
