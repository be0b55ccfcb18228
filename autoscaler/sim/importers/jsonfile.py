"""Reading a JSON file so that a bad value is reported as ``file:line: field: what``.

JSON readers know the path of a bad value but not its line; the line is found only when an
error is raised, by walking the text to that path (``line_of``), so reading a large ``sacct
--json`` costs one fast decode. A file that is not JSON at all names the line of the first bad
byte.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec

from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import Loc, dotted, number_problem

# Larger than any accounting export we expect, small enough that a wrong file (a disk image, a
# device) is refused before it fills the memory.
MAX_BYTES = 4 << 30
_SPACE = re.compile(r"[ \t\n\r]*")
_BYTE = re.compile(r"\(byte (\d+)\)")
_PATH = re.compile(r" - at `\$(.*)`$")
_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_SHOWN = 40


def shown(value: Any) -> str:
    """A value quoted back in an error: bounded, whatever the file held."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 4] + "...'"


class JsonDocument:
    """A decoded JSON file and its text, for errors that name the line of a value."""

    def __init__(self, source: str, text: str, data: Any) -> None:
        self.source = source
        self.text = text
        self.data = data

    def where(self, loc: Loc) -> str:
        """``file:line`` of the value at ``loc``, or of its nearest enclosing value that the
        file holds (a missing field is named on its object's line)."""
        for cut in range(len(loc), -1, -1):
            line = line_of(self.text, loc[:cut])
            if line is not None:
                return f"{self.source}:{line}"
        return self.source

    def error(self, loc: Loc, message: str) -> InputError:
        return InputError(self.where(loc), message, field=dotted(loc) if loc else None)


def read_text(path: Path) -> str:
    """A file's UTF-8 text (a leading byte-order mark dropped), or one ``InputError``."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(source, "no such file") from None
    except OSError as exc:
        raise InputError(source, f"cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(source, f"larger than {MAX_BYTES >> 30} GiB; is this the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{source}:{line}", "not UTF-8 text") from None
    return text.removeprefix("\ufeff")


def decode(path: Path, what: str, shape: Any = Any) -> JsonDocument:
    """Decode ``path`` as ``shape`` (a msgspec type: the fields of a ``msgspec.Struct`` a reader
    does not name are skipped without being built). ``what`` says what the file should be, for
    the error of a file that is not."""
    source = str(path)
    text = read_text(path)
    if not text.strip():
        raise InputError(source, f"empty; expected {what}")
    try:
        data = msgspec.json.decode(text, type=shape)
    except msgspec.ValidationError as exc:
        message = str(exc)
        found = _PATH.search(message)
        loc = _loc(found.group(1)) if found else ()
        document = JsonDocument(source, text, None)
        reason = message[: found.start()] if found else message
        raise document.error(loc, f"{_lower(reason)} (expected {what})") from None
    except msgspec.DecodeError as exc:
        found = _BYTE.search(str(exc))
        if found:
            offset = len(text.encode("utf-8")[: int(found.group(1))].decode("utf-8", "ignore"))
        else:  # "truncated": the text ended inside a value
            offset = len(text.rstrip())
        where = f"{source}:{text.count(chr(10), 0, offset) + 1}"
        raise InputError(where, f"not valid JSON ({_reason(str(exc))}); expected {what}") from None
    except RecursionError:
        raise InputError(source, f"nested too deeply to be {what}") from None
    return JsonDocument(source, text, data)


def _reason(message: str) -> str:
    text = _BYTE.sub("", message).strip().removeprefix("JSON is malformed:").strip()
    return _lower(text) or "malformed"


def _lower(text: str) -> str:
    text = text.strip().replace("`", "")
    return text[:1].lower() + text[1:]


def _loc(path: str) -> Loc:
    loc: list[int | str] = []
    for key, index in _PART.findall(path):
        loc.append(int(index) if index else key)
    return tuple(loc)


def line_of(text: str, loc: Loc) -> int | None:
    """The line on which the value at ``loc`` starts, or None when the text does not hold it.
    Values before it are skipped by the C decoder, so this is fast even deep in a large file."""
    decoder = json.JSONDecoder()
    position = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    try:
        for part in loc:
            opening = text[position]
            if opening == "{" and isinstance(part, str):
                position = _member(text, position, part, decoder)
            elif opening == "[" and isinstance(part, int):
                position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
                for _ in range(part):
                    _, position = decoder.raw_decode(text, position)
                    position = _SPACE.match(text, position).end()  # type: ignore[union-attr]
                    if text[position] != ",":
                        return None
                    position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
            else:
                return None
    except (ValueError, IndexError, RecursionError, _NotFoundError):
        return None
    return text.count("\n", 0, position) + 1


class _NotFoundError(Exception):
    pass


def _member(text: str, position: int, name: str, decoder: json.JSONDecoder) -> int:
    position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
    while text[position] == '"':
        key, position = decoder.raw_decode(text, position)
        position = _SPACE.match(text, position).end()  # type: ignore[union-attr]
        if text[position] != ":":
            raise _NotFoundError
        position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
        if key == name:
            return position
        _, position = decoder.raw_decode(text, position)
        position = _SPACE.match(text, position).end()  # type: ignore[union-attr]
        if text[position] == ",":
            position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
    raise _NotFoundError


class Reader:
    """Typed access to one decoded value at a known place: every getter raises an
    ``InputError`` naming the file, line and field of a value that is not what it should be."""

    def __init__(self, document: JsonDocument, value: Any, loc: Loc) -> None:
        self.document = document
        self.value = value
        self.loc = loc

    def error(self, message: str, *more: int | str) -> InputError:
        return self.document.error((*self.loc, *more), message)

    def has(self, key: str) -> bool:
        return isinstance(self.value, dict) and key in self.value

    def get(self, key: str) -> Reader:
        if not isinstance(self.value, dict):
            raise self.error(f"expected an object, got {_kind(self.value)}")
        if key not in self.value:
            raise self.error("required field is missing", key)
        return Reader(self.document, self.value[key], (*self.loc, key))

    def optional(self, key: str) -> Reader | None:
        if not isinstance(self.value, dict):
            raise self.error(f"expected an object, got {_kind(self.value)}")
        if key not in self.value or self.value[key] is None:
            return None
        return Reader(self.document, self.value[key], (*self.loc, key))

    def items(self) -> list[Reader]:
        if not isinstance(self.value, list):
            raise self.error(f"expected a list, got {_kind(self.value)}")
        return [Reader(self.document, v, (*self.loc, i)) for i, v in enumerate(self.value)]

    def text(self) -> str:
        if not isinstance(self.value, str):
            raise self.error(f"expected text, got {_kind(self.value)}")
        return self.value

    def number(self) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise self.error(f"expected a number, got {_kind(self.value)}")
        problem = number_problem(self.value)
        if problem:
            raise self.error(f"{problem}, got {shown(self.value)}")
        return float(self.value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {shown(value)}"
    return f"the number {shown(value)}"
