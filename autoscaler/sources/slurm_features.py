"""What a Slurm job's ``--constraint`` (``features`` in ``squeue --json``) says of its GPUs.

Sites name their GPU nodes by features (``a100``, ``h100``, ``gpu80g``), and jobs pick them with
``--constraint=a100|h100`` or ``[a100|h100]&gpu80g``. Only the features a site maps (to a pool's
GPU model, or to a minimum of GPU memory) matter here; every other feature (``nvlink``, ``ib``)
is ignored for the job's shape, since nothing we launch can be checked against it.

The expression is read as slurmctld reads it: ``&`` (AND), ``|`` (OR), ``[...]`` (matching OR:
every node the same, which for one node's shape is an OR), ``(...)`` grouping, ``name*N`` (N of
the job's nodes have it: the count is dropped, the feature kept), operators applied left to
right, without precedence. ``!name`` (NOT, in Slurm releases that have it) cannot be said of a
pool, so a negated feature narrows nothing.

The result is strict, because capacity bought for a job must be able to run it: an OR of models
accepts each model named; a branch that names no model does not widen the job to any model; the
highest memory bound of any branch applies; and models ANDed in one branch (with each other or
with the gres type) must all be in the pool's model name, as ``A100+SXM4`` is in
``A100-SXM4-80GB``. A job whose nodes need different models (``a100*1&h100*1``) asks for a model
no single pool has, and is reported as demand no pool can host rather than put on either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_EXPRESSION = 1024
MAX_BRANCHES = 256
_TOKEN = re.compile(
    r"\s*(?:(?P<op>[&|()\[\]!])|\*(?P<count>\d+)|(?P<name>[^\s&|()\[\]!*,\x00-\x1f\x7f]+))"
)
_WORDS = re.compile(r"[^a-z0-9]+")


class FeatureSyntaxError(ValueError):
    """A constraint we cannot read; the caller names the job and the field."""


@dataclass(frozen=True)
class GpuNeeds:
    """What a constraint asks of each node's GPUs: one of ``gpu_models`` (any when empty) and at
    least ``min_gpu_memory_gib`` per GPU (any when None)."""

    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None


_Branch = tuple[frozenset[str], float | None]
_ANY: frozenset[_Branch] = frozenset({(frozenset(), None)})


def gpu_needs(
    expression: str,
    models: Mapping[str, str],
    memory_gib: Mapping[str, float],
    gres_model: str | None = None,
) -> GpuNeeds:
    """The GPU models and memory ``expression`` requires, ANDed with the gres type (``gpu:a100``,
    already renamed) when the job has one. Raises ``FeatureSyntaxError``."""
    branches = _parse(expression, models, memory_gib) if expression.strip() else _ANY
    if gres_model:
        branches = _and(branches, frozenset({(frozenset({gres_model}), None)}))
    named = _absorbed({_all_of(names) for names, _ in branches if names})
    bounds = [bound for _, bound in branches if bound is not None]
    return GpuNeeds(named, max(bounds) if bounds else None)


def node_gpu_facts(
    features: Iterable[str], models: Mapping[str, str], memory_gib: Mapping[str, float]
) -> tuple[str | None, float | None]:
    """A node's GPU model and memory per GPU from its features: the model only when exactly one
    mapped model feature is present, the smallest mapped memory (never claim more than it has)."""
    present = set(features)
    named = {models[f] for f in present if f in models}
    sizes = [memory_gib[f] for f in present if f in memory_gib]
    return (named.pop() if len(named) == 1 else None), (min(sizes) if sizes else None)


def _all_of(names: frozenset[str]) -> str:
    """One model name that holds every name's words: ``A100`` and ``SXM4`` make ``A100+SXM4``; a
    name whose words another already has adds nothing (``A100`` with ``A100-80GB``)."""
    words = {name: _words(name) for name in names}
    kept = sorted(name for name in names if not any(words[name] < words[other] for other in names))
    unique: dict[frozenset[str], str] = {}
    for name in kept:
        unique.setdefault(words[name], name)
    return "+".join(unique.values())


def _absorbed(names: set[str]) -> tuple[str, ...]:
    """The alternatives less those another one already accepts: with ``A100`` accepted,
    ``A100+H100`` adds no pool."""
    words = {name: _words(name) for name in names}
    return tuple(sorted(name for name in names if not any(words[o] < words[name] for o in names)))


def _words(name: str) -> frozenset[str]:
    return frozenset(w for w in _WORDS.split(name.lower()) if w)


QUOTED_CHARS = 120


def _quoted(expression: str) -> str:
    """The constraint as an error shows it: a whole one would make the message as long as the
    constraint, which a job may make up to ``MAX_EXPRESSION`` characters."""
    if len(expression) <= QUOTED_CHARS:
        return repr(expression)
    return f"{expression[:QUOTED_CHARS]!r}... ({len(expression):,} characters)"


def _tokens(expression: str) -> list[tuple[str, str]]:
    if len(expression) > MAX_EXPRESSION:
        raise FeatureSyntaxError(f"is longer than {MAX_EXPRESSION} characters")
    tokens: list[tuple[str, str]] = []
    position = 0
    text = expression.rstrip()
    while position < len(text):
        found = _TOKEN.match(text, position)
        if found is None or found.end() == position:
            raise FeatureSyntaxError(
                f"{_quoted(expression)} is not a constraint (unexpected {text[position:][:1]!r})"
            )
        kind = found.lastgroup or ""
        tokens.append((kind, found.group(0).strip()))
        position = found.end()
    return tokens


class _Parser:
    def __init__(
        self, expression: str, models: Mapping[str, str], memory_gib: Mapping[str, float]
    ) -> None:
        self.expression = expression
        self.tokens = _tokens(expression)
        self.at = 0
        self.models = models
        self.memory_gib = memory_gib

    def fail(self, what: str) -> FeatureSyntaxError:
        return FeatureSyntaxError(f"{_quoted(self.expression)} is not a constraint ({what})")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise self.fail("it ends too soon")
        self.at += 1
        return token

    def expression_(self, closing: str | None) -> frozenset[_Branch]:
        value = self.term()
        while True:
            token = self.peek()
            if token is None:
                if closing is not None:
                    raise self.fail(f"no closing {closing!r}")
                return value
            kind, text = token
            if kind == "op" and text == closing:
                self.at += 1
                return value
            if kind != "op" or text not in "&|":
                raise self.fail(f"{text!r} where '&' or '|' was expected")
            self.at += 1
            right = self.term()
            value = _and(value, right) if text == "&" else _or(value, right)

    def term(self) -> frozenset[_Branch]:
        kind, text = self.take()
        negated = kind == "op" and text == "!"
        if negated:
            kind, text = self.take()
        if kind == "name":
            value = self.feature(text)
        elif kind == "op" and text in "([":
            value = self.expression_(")" if text == "(" else "]")
        else:
            raise self.fail(f"{text!r} where a feature was expected")
        following = self.peek()
        if following is not None and following[0] == "count":
            self.at += 1
        return _ANY if negated else value

    def feature(self, name: str) -> frozenset[_Branch]:
        model = self.models.get(name)
        return frozenset(
            {(frozenset({model}) if model else frozenset(), self.memory_gib.get(name))}
        )


def _parse(
    expression: str, models: Mapping[str, str], memory_gib: Mapping[str, float]
) -> frozenset[_Branch]:
    parser = _Parser(expression, models, memory_gib)
    return parser.expression_(None)


def _and(left: frozenset[_Branch], right: frozenset[_Branch]) -> frozenset[_Branch]:
    return _bounded(frozenset((a | b, _higher(x, y)) for a, x in left for b, y in right))


def _or(left: frozenset[_Branch], right: frozenset[_Branch]) -> frozenset[_Branch]:
    return _bounded(left | right)


def _bounded(branches: frozenset[_Branch]) -> frozenset[_Branch]:
    if len(branches) > MAX_BRANCHES:
        raise FeatureSyntaxError(f"has more than {MAX_BRANCHES} alternatives of GPU features")
    return branches


def _higher(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
