"""CSV reading that reports a bad row as ``file:line: column: what was expected``."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from autoscaler.errors import InputError


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

    def number(self, column: str, *, minimum: float | None = None) -> float:
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"expected a number, got {raw!r}") from None
        if not math.isfinite(value):
            raise self.error(column, f"expected a finite number, got {raw!r}")
        if minimum is not None and value < minimum:
            raise self.error(column, f"expected a number >= {minimum:g}, got {raw!r}")
        return value

    def optional_number(self, column: str, *, minimum: float | None = None) -> float | None:
        return self.number(column, minimum=minimum) if self.text(column) else None

    def integer(self, column: str, *, minimum: int | None = None) -> int:
        raw = self.text(column)
        try:
            as_float = float(raw)
        except ValueError:
            as_float = float("nan")
        if not as_float.is_integer():
            raise self.error(column, f"expected a whole number, got {raw!r}")
        value = int(as_float)
        if minimum is not None and value < minimum:
            raise self.error(column, f"expected a whole number >= {minimum}, got {raw!r}")
        return value

    def timestamp(self, column: str) -> float:
        raw = self.text(column)
        return parse_timestamp(raw, self.where, column)


def parse_timestamp(raw: str, where: str, column: str | None = None) -> float:
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            where,
            f"expected an ISO-8601 time such as 2023-05-15T00:00:00Z, got {raw!r}",
            field=column,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def read_rows(path: Path, required: Sequence[str]) -> Iterator[Row]:
    source = str(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise InputError(source, "no such file") from None
    except OSError as exc:
        raise InputError(source, f"cannot be read: {exc}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(
                f"{source}:1",
                "missing column(s) "
                + ", ".join(missing)
                + "; the header has: "
                + ", ".join(header),
            )
        try:
            for values in reader:
                if None in values:
                    raise InputError(
                        f"{source}:{reader.line_num}", f"expected {len(header)} fields, got more"
                    )
                yield Row(source, reader.line_num, values)
        except csv.Error as exc:
            raise InputError(f"{source}:{reader.line_num}", f"not valid CSV: {exc}") from None
        except UnicodeDecodeError:
            raise InputError(f"{source}:{reader.line_num}", "not UTF-8 text") from None
