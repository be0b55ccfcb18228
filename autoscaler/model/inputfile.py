"""Reading user files (YAML) so that every mistake is reported as ``file:line: field: what``.

pydantic knows which field is wrong, YAML knows on which line it was written; this module keeps
both so one message carries the two. It never prints a traceback: callers get an ``InputError``.

It is the one YAML reader of the project (configs, scenarios, suites), so its limits are the
documented rules for every such file (docs/scenario.md, "Input limits"):

* at most ``MAX_BYTES`` of UTF-8 text, nested at most ``MAX_DEPTH`` deep;
* anchors, aliases and merge keys (``<<: *defaults``) are read, but the document they expand to
  holds at most ``MAX_VALUES`` values (an alias bomb is refused at once, not expanded), and an
  alias that refers to a value containing it is refused;
* only plain YAML values: no tags besides the standard ones (``!custom 5`` is refused);
  an unquoted date stays the text it was written as;
* numbers are finite and at most ``MAX_NUMBER`` in magnitude, whether written as numbers or as
  text a numeric field reads (``"1e999"``, ``"NaN"``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autoscaler.model.errors import InputError

Loc = tuple[int | str, ...]
ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000
MAX_NUMBER = 1e15

_SAFE = yaml.constructor.SafeConstructor()
_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS: dict[str, Callable[[yaml.ScalarNode], Any]] = {
    _TAG + "null": _SAFE.construct_yaml_null,
    _TAG + "bool": _SAFE.construct_yaml_bool,
    _TAG + "int": _SAFE.construct_yaml_int,
    _TAG + "float": _SAFE.construct_yaml_float,
    _TAG + "str": _SAFE.construct_yaml_str,
    # a date is kept as the text written: no field wants a datetime, and "start: 2024-01-01"
    # should read as the quoted form does
    _TAG + "timestamp": _SAFE.construct_yaml_str,
    _TAG + "value": _SAFE.construct_yaml_str,
}
_MERGE = _TAG + "merge"
_SHOWN = 60  # characters of a value or key quoted back in a message


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


class _Loader(yaml.SafeLoader):
    """The safe loader with a bound on nesting, checked as nodes are composed (PyYAML's composer
    recurses once per level, so a deep document would otherwise end in ``RecursionError``)."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
            raise InputError(f"{self.source}:{line}", f"nested more than {MAX_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Builder:
    """Turns composed nodes into plain values, recording each value's line. Aliases are expanded
    here, so the budget of values is counted here, and a node met again inside itself is a
    recursive alias."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[Loc, int] = {}
        self.values = 0
        self.open: set[int] = set()

    def at(self, node: yaml.Node) -> str:
        return f"{self.source}:{node.start_mark.line + 1}"

    def build(self, node: yaml.Node, loc: Loc) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise InputError(
                self.at(node),
                f"the document expands to more than {MAX_VALUES:,} values "
                "(count what its aliases repeat)",
            )
        self.lines[loc] = node.start_mark.line + 1
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, loc)
        if id(node) in self.open:
            raise InputError(self.at(node), "an alias refers to a value that contains it")
        if isinstance(node, yaml.MappingNode) and node.tag == _TAG + "map":
            self.open.add(id(node))
            try:
                return self.mapping(node, loc)
            finally:
                self.open.discard(id(node))
        if isinstance(node, yaml.SequenceNode) and node.tag == _TAG + "seq":
            self.open.add(id(node))
            try:
                return [self.build(item, (*loc, i)) for i, item in enumerate(node.value)]
            finally:
                self.open.discard(id(node))
        raise InputError(
            self.at(node),
            f"the tag {_tag(node.tag)} is not supported",
            dotted(loc) if loc else None,
        )

    def scalar(self, node: yaml.ScalarNode, loc: Loc) -> Any:
        field = dotted(loc) if loc else None
        construct = _SCALAR_TAGS.get(node.tag)
        if construct is None:
            raise InputError(self.at(node), f"the tag {_tag(node.tag)} is not supported", field)
        try:
            value = construct(node)
        except (ValueError, ArithmeticError, yaml.YAMLError):
            raise InputError(
                self.at(node), f"not a valid value: {_shown(node.value)}", field
            ) from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            problem = number_problem(value)
            if problem:
                raise InputError(self.at(node), f"{problem}, got {_shown(node.value)}", field)
        return value

    def mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[Any, Any]:
        explicit: list[tuple[yaml.Node, yaml.Node]] = []
        merges: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == _MERGE:
                if merges:
                    raise InputError(self.at(key_node), "the merge key << is given twice")
                merges = (
                    list(value_node.value)
                    if isinstance(value_node, yaml.SequenceNode)
                    else [value_node]
                )
                continue
            explicit.append((key_node, value_node))
        result: dict[Any, Any] = {}
        mapping_line = self.lines[loc]
        # YAML's merge: explicit keys win over merged ones, earlier merged maps over later ones
        for merged in reversed(merges):
            if not isinstance(merged, yaml.MappingNode):
                raise InputError(
                    self.at(merged), "a merge key (<<) takes a mapping or a list of mappings"
                )
            result.update(self.build(merged, loc))
        self.lines[loc] = mapping_line
        seen: set[Any] = set()
        for key_node, value_node in explicit:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError(self.at(key_node), "a mapping key must be a plain value")
            key = self.scalar(key_node, loc)
            if key in seen:
                raise InputError(
                    self.at(key_node), f"the key {_shown(key)} is given twice", dotted(loc)
                )
            seen.add(key)
            result[key] = self.build(value_node, (*loc, key))
        return result


def parse_yaml(text: str, source: str) -> LocatedDocument:
    if len(text) > MAX_BYTES:
        raise InputError(source, f"larger than {MAX_BYTES // 1024} KiB; is this the right file?")
    loader: _Loader | None = None
    try:
        loader = _Loader(text, source)
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise InputError(where, f"not valid YAML: {_one_line(str(exc.problem))}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise InputError(
            f"{source}:{line}",
            f"not valid YAML: the character #x{exc.character:04x} is not allowed",
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(source, f"not valid YAML: {_one_line(str(exc))}") from None
    finally:
        if loader is not None:
            loader.dispose()
    builder = _Builder(source)
    if node is None:  # empty, or only comments: what is missing is missing from line 1
        return LocatedDocument(source, {}, {(): 1})
    return LocatedDocument(source, builder.build(node, ()), builder.lines)


def read_yaml(path: Path | str) -> LocatedDocument:
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(str(path), f"larger than {MAX_BYTES // 1024} KiB; is this the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}:{line}", "not UTF-8 text") from None
    return parse_yaml(text, str(path))


def number_problem(value: float) -> str | None:
    """Why a number cannot be a value of our files, or None: the one numeric rule of every
    config, scenario and CSV (finite, and at most ``MAX_NUMBER`` in magnitude)."""
    try:
        if isinstance(value, float) and not math.isfinite(value):
            return "expected a finite number"
        if abs(value) > MAX_NUMBER:
            return f"expected a number of at most {MAX_NUMBER:g} in magnitude"
    except OverflowError:
        return f"expected a number of at most {MAX_NUMBER:g} in magnitude"
    return None


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.:@/-]{1,60}$")


def dotted(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
            continue
        text = str(part)
        if not _PLAIN_KEY.match(text):
            text = _shown(part)
        out += ("." if out else "") + text
    return out or "(top level)"


def parse_dotted(text: str) -> Loc:
    """The location a dotted field name (``pools[0].options.subnets``) stands for."""
    loc: list[int | str] = []
    for part in text.split("."):
        head, _, rest = part.partition("[")
        if head:
            loc.append(head)
        for index in re.findall(r"(\d+)\]", "[" + rest if rest else ""):
            loc.append(int(index))
    return tuple(loc)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 4] + "...'"


def _tag(tag: str) -> str:
    return _shown("!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _describe(error: Any, model: type[BaseModel]) -> str:
    kind = error.get("type", "")
    message = _one_line(str(error.get("msg", "invalid value"))).removeprefix("Value error, ")
    loc: Loc = tuple(error.get("loc", ()))
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        if allowed:
            return "unknown field; expected one of: " + ", ".join(sorted(allowed))
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind.startswith("no_echo"):  # the value may be a secret pasted into the wrong field
        return message
    given = error.get("input")
    if isinstance(given, (str, int, float, bool)) and kind not in {"model_type", "dict_type"}:
        return f"{message[0].lower()}{message[1:]} (got {_shown(given)})"
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


def numbers_problem(value: Any, loc: Loc = ()) -> tuple[Loc, str] | None:
    """The first number the user gave in a validated model that breaks the numeric rule, with
    where it is: pydantic reads ``"NaN"``, ``"1e999"`` and huge integers as numbers, and only
    the values the user set are looked at (a model's own defaults may be infinite)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        problem = number_problem(value)
        return (loc, problem) if problem else None
    if isinstance(value, BaseModel):
        for name in value.model_fields_set:
            found = numbers_problem(getattr(value, name, None), (*loc, name))
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = numbers_problem(item, (*loc, key))
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = numbers_problem(item, (*loc, index))
            if found:
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
        validated = model.model_validate(data, context=context)
    except ValidationError as exc:
        raise located_error(exc, model, document, at) from None
    found = numbers_problem(validated)
    if found:
        loc = (*at, *found[0])
        raise InputError(document.where(loc), found[1], dotted(loc))
    return validated


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
    return InputError(document.where(loc), _describe(first, model) + more, dotted(loc))


def _joined(field: str, loc: Loc) -> str:
    name = dotted(loc) if loc else ""
    if name.startswith("["):
        return f"{field}{name}"
    return f"{field}.{name}" if name and field else (name or field)


def validate_settings(
    model: type[ModelT], data: Any, *, field: str, where: str = "config"
) -> ModelT:
    """Validate a block inside an already-read file (provider settings, pool options, policy
    params, a changed scenario): one ``InputError`` naming the dotted field of the first problem.
    ``relocate`` turns its ``where`` into the file and line when the caller has the document."""
    try:
        validated = model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = _joined(field, tuple(first["loc"]))
        raise InputError(where, _describe(first, model), field=name) from None
    found = numbers_problem(validated)
    if found:
        raise InputError(where, found[1], field=_joined(field, found[0]))
    return validated


def relocate(
    error: InputError,
    document: LocatedDocument,
    renames: Sequence[tuple[str, Loc]] = (),
    *,
    default: Loc = (),
    at: Loc = (),
) -> InputError:
    """``error`` (raised by code that knew only a dotted field, e.g. a provider checking its
    settings) pointed at the file and line of that field. ``renames`` map field prefixes the
    raiser used onto where they are (``("sources.q", ("sources", 0, "settings"))``); a field no
    prefix matches is read as a path; an error with no field points at ``default``. Every
    location is relative to ``at``, where the checked block sits in the document."""
    if error.where not in ("config", document.source):
        return error
    loc = default
    if error.field is not None:
        loc = parse_dotted(error.field)
        for prefix, target in renames:
            if error.field == prefix or error.field.startswith((prefix + ".", prefix + "[")):
                loc = (*target, *parse_dotted(error.field[len(prefix) :].lstrip(".")))
                break
    full = (*at, *loc)
    return InputError(document.where(full), error.message, dotted(full) if full else None)
