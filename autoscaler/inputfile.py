"""Reading user files (YAML) so that every mistake is reported as ``file:line: field: what``.

pydantic knows which field is wrong, YAML knows on which line it was written; this module keeps
both so one message carries the two. It never prints a traceback: callers get an ``InputError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autoscaler.errors import InputError

Loc = tuple[int | str, ...]
ModelT = TypeVar("ModelT", bound=BaseModel)
_SCALARS = yaml.constructor.SafeConstructor()


class LocatedDocument:
    """A parsed YAML document plus the line on which each value starts."""

    def __init__(self, source: str, data: Any, lines: dict[Loc, int]) -> None:
        self.source = source
        self.data = data
        self.lines = lines

    def line_of(self, loc: Loc) -> int | None:
        """The line of the deepest part of ``loc`` that the document holds."""
        for cut in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:cut]))
            if line is not None:
                return line
        return None

    def where(self, loc: Loc) -> str:
        line = self.line_of(loc)
        return f"{self.source}:{line}" if line is not None else self.source


def _construct(node: yaml.Node, loc: Loc, lines: dict[Loc, int], source: str) -> Any:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError(
                    f"{source}:{key_node.start_mark.line + 1}",
                    "a mapping key must be a plain value",
                )
            key = _SCALARS.construct_object(key_node)
            if key in result:
                raise InputError(
                    f"{source}:{key_node.start_mark.line + 1}",
                    f"the key {key!r} is given twice",
                    _dotted(loc),
                )
            result[key] = _construct(value_node, (*loc, key), lines, source)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _construct(item, (*loc, index), lines, source) for index, item in enumerate(node.value)
        ]
    return _SCALARS.construct_object(node)


def parse_yaml(text: str, source: str) -> LocatedDocument:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise InputError(where, f"not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(source, f"not valid YAML: {exc}") from None
    lines: dict[Loc, int] = {}
    data = {} if node is None else _construct(node, (), lines, source)
    return LocatedDocument(source, data, lines)


def read_yaml(path: Path | str) -> LocatedDocument:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot be read: {exc}") from None
    return parse_yaml(text, str(path))


def _dotted(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _describe(error: Any, model: type[BaseModel]) -> str:
    kind = error.get("type", "")
    message = str(error.get("msg", "invalid value"))
    loc: Loc = tuple(error.get("loc", ()))
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        if allowed:
            return "unknown field; expected one of: " + ", ".join(sorted(allowed))
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    given = error.get("input")
    if isinstance(given, (str, int, float, bool)) and kind not in {"model_type", "dict_type"}:
        return f"{message[0].lower()}{message[1:]} (got {given!r})"
    return f"{message[0].lower()}{message[1:]}"


def _fields_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the sub-model that ``loc`` points into, for 'expected one of' hints."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _inner_model(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def validate_document(
    model: type[ModelT], document: LocatedDocument, *, at: Loc = (), context: Any = None
) -> ModelT:
    """Validate (part of) a document, or raise one ``InputError`` naming line, field and fix."""
    data: Any = document.data
    for part in at:
        data = data[part]
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise located_error(exc, model, document, at) from None


def located_error(
    exc: ValidationError, model: type[BaseModel], document: LocatedDocument, at: Loc = ()
) -> InputError:
    errors = exc.errors()
    first = errors[0]
    loc: Loc = (*at, *tuple(first["loc"]))
    more = (
        f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        if len(errors) > 1
        else ""
    )
    return InputError(document.where(loc), _describe(first, model) + more, _dotted(loc))


def validate_settings(
    model: type[ModelT], data: Any, *, field: str, where: str = "config"
) -> ModelT:
    """Validate a block inside an already-read file (provider settings, pool options, policy
    params, a changed scenario): one ``InputError`` naming the dotted field of the first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = _dotted(tuple(first["loc"])) if first["loc"] else ""
        if loc.startswith("["):
            name = f"{field}{loc}"
        else:
            name = f"{field}.{loc}" if loc and field else (loc or field)
        raise InputError(where, _describe(first, model), field=name) from None
