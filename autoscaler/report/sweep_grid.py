"""The sweep file: scenarios x policies x parameter values, every run checked before any starts.

A sweep file is a suite file (``autoscaler.report.suite``) that may say more, so every suite file
is a sweep file and ``gpu-autoscaler sweep --grid suite.yaml`` runs the evaluation suite. On top
of the suite's fields, a policy may carry a ``grid`` of parameter values (one run per
combination), a scenario entry may name a whole suite instead of one file, and ``options``
switch the lower bound. Paths are relative to the sweep file::

    name: idle-time
    scenarios:
      - suite: ../autoscaler/data/scenarios/suite.yaml   # every scenario of that suite
      - file: my-site.yaml
    policies:                             # replace the suite's and the scenarios' lists
      - name: cost-aware
        params: {restart_overhead_s: 60}  # the same in every run of this policy
        grid: {idle_seconds: [0, 120, 600]}   # one run per value; several keys: per combination
      - name: cheapest-spot
    default_policy: cost-aware idle_seconds=120   # a run's title; every other run is a peer
    options: {lower_bound: false}

A grid's runs are titled by the policy's label (else its name) and each value it was given
(``cost-aware idle_seconds=120``), so the comparison table tells them apart. Every combination
is built by the policy's own Params model before the first run, so a value the policy refuses
is one error naming the grid value's line, not a failure hours in.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, NonNegativeFloat, model_validator

from autoscaler.model import Frozen, Name
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import (
    Loc,
    LocatedDocument,
    dotted,
    read_yaml,
    validate_document,
    validate_settings,
)
from autoscaler.report.build import DEFAULT_POLICY
from autoscaler.report.suite import load_suite
from autoscaler.sim.scenario import LoadedScenario, PolicySpec, Text, load_scenario
from autoscaler.spi.policy import PolicyClass, build_policy, policy_class

MAX_RUNS = 10_000
"""Replays in one sweep (a grid's product grows fast: a typo of one value list should not queue
a year of CPU)."""

GridValues = Annotated[list[Any], Field(min_length=1, max_length=MAX_RUNS)]


class SweepPolicy(Frozen):
    """A policy of the sweep: fixed ``params`` plus a ``grid`` of values to run each of."""

    name: Name
    label: Annotated[Text, Field(min_length=1, max_length=128)] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, GridValues] = Field(default_factory=dict)


class SweepScenario(Frozen):
    """One scenario file, or a suite file standing for all of its scenarios."""

    file: str | None = Field(None, min_length=1)
    suite: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_of(self) -> SweepScenario:
        if (self.file is None) == (self.suite is None):
            raise ValueError("give either file (a scenario) or suite (a suite file's scenarios)")
        return self


class SweepOptions(Frozen):
    lower_bound: bool = True


class SweepFile(Frozen):
    name: str | None = Field(None, min_length=1)
    description: str = ""
    default_policy: str | None = Field(None, min_length=1)
    policies: tuple[SweepPolicy, ...] | None = Field(None, min_length=1)
    peer_wait_slack_s: NonNegativeFloat = 5.0
    scenarios: tuple[SweepScenario, ...] = Field(min_length=1)
    options: SweepOptions = SweepOptions()


@dataclass(frozen=True)
class LoadedSweep:
    """A checked sweep: its scenarios, and for each the runs (policy index, spec) it gets."""

    name: str
    description: str
    source: str
    default_policy: str
    peer_wait_slack_s: float
    lower_bound: bool
    scenarios: tuple[LoadedScenario, ...]
    policies: tuple[tuple[tuple[int, PolicySpec], ...], ...]

    @property
    def replays(self) -> int:
        return sum(len(specs) for specs in self.policies)

    def titles(self) -> list[str]:
        """Every run's title, in the order first met."""
        titles: list[str] = []
        for specs in self.policies:
            titles.extend(s.title for _, s in specs if s.title not in titles)
        return titles


# ---------------------------------------------------------------- a policy's grid


def shown_value(value: Any) -> str:
    """A parameter value as a run's title shows it: as YAML would write it (``null``, ``true``,
    ``120``, ``0.5``), text as it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _grid_error(
    exc: InputError, document: LocatedDocument, at: Loc, policy: SweepPolicy, picks: dict[str, int]
) -> InputError:
    """``exc`` came from the policy's Params model checking ``params``: point it at the grid
    value (or the fixed parameter) it is about."""
    key = ""
    if exc.field is not None and exc.field.startswith("params."):
        key = exc.field.removeprefix("params.").split(".")[0].split("[")[0]
    if key in policy.grid:
        loc: Loc = (*at, "grid", key, picks[key])
        message = f"{exc.message} (value {shown_value(policy.grid[key][picks[key]])})"
    elif key in policy.params:
        loc, message = (*at, "params", key), exc.message
    else:
        loc, message = at, exc.message
    return InputError(document.where(loc), message, dotted(loc))


def _policy_class(name: str, document: LocatedDocument, at: Loc) -> PolicyClass:
    try:
        return policy_class(name)
    except InputError as exc:
        loc = (*at, "name")
        raise InputError(document.where(loc), exc.message, dotted(loc)) from None


def expand_policy(policy: SweepPolicy, document: LocatedDocument, at: Loc) -> list[PolicySpec]:
    """The runs of one sweep policy: one per combination of its grid, each built by the policy
    (``at`` is where the policy sits in the sweep file)."""
    cls = _policy_class(policy.name, document, at)
    both = sorted(set(policy.params) & set(policy.grid))
    if both:
        loc = (*at, "grid", both[0])
        raise InputError(
            document.where(loc),
            f"{both[0]} is in params too; give each parameter in one place",
            dotted(loc),
        )
    keys = list(policy.grid)
    count = math.prod(len(policy.grid[k]) for k in keys)
    if count > MAX_RUNS:
        loc = (*at, "grid")
        raise InputError(
            document.where(loc),
            f"the grid has {count:,} combinations; at most {MAX_RUNS:,} runs make one sweep",
            dotted(loc),
        )
    base = policy.label or policy.name
    specs = []
    for indices in itertools.product(*(range(len(policy.grid[k])) for k in keys)):
        picks = dict(zip(keys, indices, strict=True))
        chosen = {k: policy.grid[k][j] for k, j in picks.items()}
        try:
            build_policy(cls, {**policy.params, **chosen}, where="sweep", field_prefix="params")
        except InputError as exc:
            raise _grid_error(exc, document, at, policy, picks) from None
        title = " ".join([base, *(f"{k}={shown_value(v)}" for k, v in chosen.items())])
        label = title if title != policy.name else None
        spec = validate_settings(
            PolicySpec,
            {"name": policy.name, "label": label, "params": {**policy.params, **chosen}},
            field=dotted(at),
            where=document.where((*at, "grid") if keys else at),
        )
        specs.append(spec)
    return specs


def _expand_all(
    policies: Sequence[SweepPolicy], document: LocatedDocument
) -> tuple[tuple[int, PolicySpec], ...]:
    runs: list[PolicySpec] = []
    first_at: dict[str, int] = {}
    for i, policy in enumerate(policies):
        for spec in expand_policy(policy, document, ("policies", i)):
            if spec.title in first_at:
                loc: Loc = ("policies", i)
                raise InputError(
                    document.where(loc),
                    f"a second run titled {spec.title!r} (policies[{first_at[spec.title]}] "
                    "has one); give one of the policies a label to tell them apart",
                    dotted(loc),
                )
            first_at[spec.title] = i
            runs.append(spec)
    if len(runs) > MAX_RUNS:
        raise InputError(
            document.where(("policies",)),
            f"{len(runs):,} policy runs; at most {MAX_RUNS:,} make one sweep",
            "policies",
        )
    return tuple(enumerate(runs))


# ---------------------------------------------------------------- the scenarios


@dataclass(frozen=True)
class _Entry:
    """The scenarios one entry of the sweep file brought, with the runs their suite gave them."""

    at: Loc
    scenarios: tuple[LoadedScenario, ...]
    suite_runs: tuple[tuple[tuple[int, PolicySpec], ...], ...] | None
    suite_default: str | None


def _read_entry(entry: SweepScenario, index: int, document: LocatedDocument, base: Path) -> _Entry:
    key = "file" if entry.file is not None else "suite"
    at: Loc = ("scenarios", index, key)
    named = Path(entry.file if entry.file is not None else str(entry.suite))
    path = named if named.is_absolute() else base / named
    if not path.is_file():
        what = "scenario" if key == "file" else "suite"
        raise InputError(document.where(at), f"no such {what} file: {path}", dotted(at))
    if entry.file is not None:
        return _Entry(at, (load_scenario(path),), None, None)
    suite = load_suite(path)
    return _Entry(at, suite.scenarios, suite.policies, suite.suite.default_policy)


def _scenario_runs(
    entries: Sequence[_Entry], sweep_runs: tuple[tuple[int, PolicySpec], ...] | None
) -> tuple[list[LoadedScenario], list[tuple[tuple[int, PolicySpec], ...]], list[Loc]]:
    scenarios: list[LoadedScenario] = []
    runs: list[tuple[tuple[int, PolicySpec], ...]] = []
    where: list[Loc] = []
    for entry in entries:
        for k, loaded in enumerate(entry.scenarios):
            scenarios.append(loaded)
            where.append(entry.at)
            if sweep_runs is not None:
                runs.append(sweep_runs)
            elif entry.suite_runs is not None:
                runs.append(entry.suite_runs[k])
            else:
                runs.append(tuple(enumerate(loaded.scenario.policies)))
    return scenarios, runs, where


def _check_unique(
    scenarios: Sequence[LoadedScenario], where: Sequence[Loc], document: LocatedDocument
) -> None:
    seen: dict[str, Loc] = {}
    for loaded, at in zip(scenarios, where, strict=True):
        name = loaded.scenario.name
        if name in seen:
            raise InputError(
                document.where(at),
                f"scenario {name!r} is already in the sweep (from {dotted(seen[name])}); "
                "list each scenario once",
                dotted(at),
            )
        seen[name] = at


def _default_policy(
    sweep: SweepFile,
    entries: Sequence[_Entry],
    sweep_runs: tuple[tuple[int, PolicySpec], ...] | None,
) -> str:
    """The sweep's ``default_policy``; else its suite's when the suite's runs are used; else
    cost-aware when it runs; else the first run listed."""
    if sweep.default_policy is not None:
        return sweep.default_policy
    if sweep_runs is None:
        for entry in entries:
            if entry.suite_default is not None:
                return entry.suite_default
    titles = [s.title for _, s in sweep_runs] if sweep_runs is not None else []
    if not titles:
        first = entries[0].scenarios[0].scenario.policies
        titles = [s.title for s in first]
    return DEFAULT_POLICY if DEFAULT_POLICY in titles else titles[0]


def _check_default(
    default: str,
    runs: Sequence[tuple[tuple[int, PolicySpec], ...]],
    scenarios: Sequence[LoadedScenario],
    where: Sequence[Loc],
    sweep: SweepFile,
    document: LocatedDocument,
) -> None:
    for specs, loaded, at in zip(runs, scenarios, where, strict=True):
        titles = [s.title for _, s in specs]
        if default in titles:
            continue
        if sweep.default_policy is not None:
            loc: Loc = ("default_policy",)
            message = f"the default policy {default!r} is not among the runs: " + ", ".join(titles)
        else:
            loc = at
            message = (
                f"scenario {loaded.scenario.name!r} does not run the default policy "
                f"{default!r}; give the sweep a policies list or a default_policy"
            )
        raise InputError(document.where(loc), message, dotted(loc))


def load_sweep(path: Path | str) -> LoadedSweep:
    """Read and check the whole sweep (every scenario file, every run's parameters) before
    anything is replayed; a mistake is one ``InputError`` naming the file, line and field."""
    path = Path(path)
    document = read_yaml(path)
    sweep = validate_document(SweepFile, document)
    base = path.resolve().parent
    sweep_runs = _expand_all(sweep.policies, document) if sweep.policies is not None else None
    entries = [_read_entry(e, i, document, base) for i, e in enumerate(sweep.scenarios)]
    scenarios, runs, where = _scenario_runs(entries, sweep_runs)
    _check_unique(scenarios, where, document)
    default = _default_policy(sweep, entries, sweep_runs)
    _check_default(default, runs, scenarios, where, sweep, document)
    total = sum(len(specs) for specs in runs)
    if total > MAX_RUNS:
        raise InputError(
            document.where(("scenarios",)),
            f"{total:,} replays ({len(scenarios)} scenarios); at most {MAX_RUNS:,} make one sweep",
            "scenarios",
        )
    return LoadedSweep(
        name=sweep.name or path.stem,
        description=sweep.description,
        source=str(path),
        default_policy=default,
        peer_wait_slack_s=sweep.peer_wait_slack_s,
        lower_bound=sweep.options.lower_bound,
        scenarios=tuple(scenarios),
        policies=tuple(runs),
    )
