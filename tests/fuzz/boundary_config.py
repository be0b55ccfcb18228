"""Fuzz boundary: the controller config YAML, through ``gpu-autoscaler validate`` and what
``run`` and ``plan`` build from it.

The rules checked for every input, independently of the code under test:

* ``validate`` ends in exit 0 or exit 2, never a traceback (it runs with ``--debug``, so an
  unexpected exception escapes ``check`` and counts as one); exit 2 prints exactly one error
  line, ``error: <file>:<line>: ...`` (the line is left out only for whole-file problems);
* a config ``validate`` accepts is accepted by what ``run`` and ``plan`` build (the policy, the
  providers and the sources, ``autoscaler.app.assembly``): an ``InputError`` there is a silent wrong
  answer of ``validate``; one that only uses the simulated cloud and static queues is then
  planned (``plan``'s ``make_report``), and its plan must be finite with no negative demand;
* no accepted config holds a number that is not finite or is larger than 1e15 in magnitude,
  read independently with PyYAML;
* a secret pasted where a config wants the *name* of an environment variable is never echoed.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from harness import Outcome, mutate_text

from autoscaler.app.assembly import (
    build_providers,
    build_signals,
    close_all,
    load_configured_policy,
)
from autoscaler.cli import main
from autoscaler.model.config import load_config
from autoscaler.model.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
MAX_NUMBER = 1e15
SECRET = "hunter2-Zq9xSECRETvalue"
# problems of a whole file, which no one line can be blamed for
WHOLE_FILE = (
    "no such file",
    "larger than",
    "cannot be read",
    "no GPU job",
    "the replayed window is",
    "no availability runs for trace",
)

# A config that only uses the simulated cloud and the static queue: ``plan`` can run it here.
LOCAL = """\
fleet_id: fuzz
tick_seconds: 5
policy:
  name: cost-aware
  params: {idle_seconds: 300}
providers:
  sim:
    boot_seconds: 3
    interruption_rate_per_hour: 0.0
    notice_lead_s: 120
pools:
  - name: sim-spot
    provider: sim
    region: us-east-1
    instance_type: g5.xlarge
    gpus_per_instance: 1
    gpu_model: a10g
    market: spot
    max_instances: 4
    options: {price_per_hour: 0.5, on_demand_price_per_hour: 1.2}
  - name: sim-od
    provider: sim
    region: us-east-1
    instance_type: g5.12xlarge
    gpus_per_instance: 4
    market: on-demand
    max_instances: 2
sources:
  - kind: static
    name: demo
    settings:
      jobs:
        - {count: 2, gpus: 1, checkpoint_interval_s: 600}
        - {count: 1, gpus: 4, high_priority: true, age_s: 30}
limits: {max_instances: 6, max_cost_per_hour: 10, max_gpus: 12}
telemetry: {idle_util_pct: 5, window_s: 600, max_age_s: 180}
journal: {enabled: false}
"""

# What the issue found, written out (the alias bomb is the 269-byte file of the report).
BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "fleet_id: *g\n"
)
HOSTILE_NUMBERS: tuple[Any, ...] = (
    ".nan",
    ".inf",
    "-.inf",
    "1e999",
    "'NaN'",
    "'Infinity'",
    "'-1e999'",
    "1" * 400,
    "9" * 30,
    "1e16",
    "-1",
    "0",
    "1.0e+999",
    "0x7fffffffffffffff",
    "2e15",
    "'1e400'",
    "-0.0",
    "true",
)
QUEUE_URLS = (
    "https://example.com",
    "https://sqs.us-east-1.amazonaws.com/q",
    "sqs",
    "http://[::1",
    "https://sqs.us-east-1.amazonaws.com/1/2/3",
    "ftp://sqs.us-east-1.amazonaws.com/1/q",
    "https://sqs..amazonaws.com/1/q",
    "https://sqs.us-east-1.amazonaws.com:99999/1/q",
    "https://sqs.us-east-1.amazonaws.com/123456789012/notices",
    "http://localhost:5000/123456789012/notices",
    "https://sqs.us east.amazonaws.com/1/q",
    "",
    "https://sqs.us-east-1.amazonaws.com/123/" + "q" * 90,
)


def config_seeds() -> list[str]:
    """The configs the tests, the example and the docs hold (every YAML block of docs/*.md and
    README.md with a ``fleet_id``), plus the local one above."""
    from test_config import GOOD  # the test's own good config

    seeds = [GOOD, LOCAL, (ROOT / "examples" / "container" / "config.yaml").read_text()]
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for block in re.findall(r"```ya?ml\n(.*?)```", doc.read_text(), re.S):
            if "fleet_id:" in block and "controller:" not in block:
                seeds.append(block)
    return seeds


@dataclass(frozen=True)
class CliRun:
    rc: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if ": warning: " not in line]


def run_cli(args: Sequence[str]) -> CliRun:
    """``gpu-autoscaler --debug ARGS`` in this process: an unexpected exception propagates."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--debug", *args])
    return CliRun(rc, out.getvalue(), err.getvalue())


def error_problem(run: CliRun, files: Sequence[str]) -> str | None:
    """Why an exit-2 answer breaks the error rule: one line, naming one of the input files and
    the line in it (or naming a file, any, for a problem of the whole file)."""
    lines = run.error_lines
    if len(lines) != 1:
        return f"expected one error line, got {len(lines)}: {run.err[:200]!r}"
    line = lines[0]
    if line.startswith("error: ") and any(f": {w}" in line for w in WHOLE_FILE):
        return None
    for name in files:
        if line.startswith(f"{name}: trace: "):  # jobs no node can host, listed
            return None
        if line.startswith(f"error: {name}:"):
            if re.match(r"^:\d+: ", line[len(f"error: {name}") :]):
                return None
            return f"the error names no line: {line[:200]!r}"
    return f"the error names none of the input files: {line[:200]!r}"


def numbers_in(value: Any) -> list[float]:
    """Every number of a loaded YAML value (bools are not numbers)."""
    found: list[float] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, (int, float)):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


def bad_number(value: float) -> bool:
    try:
        return not math.isfinite(value) or abs(value) > MAX_NUMBER
    except OverflowError:
        return True


def _independent_load(text: str) -> Any:
    """The document as PyYAML alone reads it, or None where it cannot (then nothing is said)."""
    if len(text) > 100_000 or "&" in text or "*" in text or "<<" in text:
        return None  # aliases: PyYAML would expand a bomb; the reader's own rule covers them
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return None


def _structured(seed: str, rng: random.Random) -> str:
    """A careless edit of one field of a seed: a hostile number, a typo in a key, a deleted
    field, an unknown source kind, a bad queue URL, a secret where a variable name goes."""
    data = yaml.safe_load(seed)
    paths: list[tuple[Any, Any]] = []
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            paths.append((node, key))
            if isinstance(value, (dict, list)):
                stack.append(value)
    container, key = rng.choice(paths)
    choice = rng.randrange(8)
    if choice == 0:
        container[key] = yaml.safe_load(f"x: {rng.choice(HOSTILE_NUMBERS)}")["x"]
    elif choice == 1 and isinstance(container, dict):
        typo = str(key)[:-1] if len(str(key)) > 1 else str(key) + "x"
        container[typo] = container.pop(key)
    elif choice == 2 and isinstance(container, dict):
        del container[key]
    elif choice == 3:
        container[key] = rng.choice(
            ["", "x" * 5000, "a\nb", "\u202e", None, [], {}, {"launch_templat": {"name": "t"}}]
        )
    elif choice == 4:
        data.setdefault("sources", []).append(
            rng.choice(
                [
                    {"kind": "kafka"},
                    {"kind": "prometheus", "settings": {"url": "http://p:9090"}},
                    {"kind": "static", "settings": {"jobs": [{"count": 1, "gpu": 1}]}},
                    {"kind": "static", "settings": {"jobs": [{"count": "1e999", "gpus": 1}]}},
                    {"kind": "slurm", "settings": {"partitons": ["gpu"]}},
                    {"kind": "scrape", "roles": ["queue"], "settings": {"targets": ["h:9400"]}},
                    {"kind": "static", "name": "a b", "settings": {"jobs": [{"gpus": 1}]}},
                ]
            )
        )
    elif choice == 5:
        data.setdefault("providers", {}).setdefault("aws", {})["interruption_queue_url"] = (
            rng.choice(QUEUE_URLS)
        )
        if rng.random() < 0.5:
            data["pools"] = []
    elif choice == 6:
        which = rng.choice(["inbox", "journal"])
        if which == "inbox":
            data["inbox"] = {
                "listen": {"port": 8081},
                "token_env": SECRET + rng.choice([" ", "/", "="]),
            }
        else:
            data["journal"] = {"postgres_dsn_env": f"postgresql://u:{SECRET}@db/j"}
    else:
        pools = data.get("pools") or []
        if pools and isinstance(pools[0], dict):
            pools[0].setdefault("options", {})[
                rng.choice(["launch_templat", "subnet", "image", "max_spot_price", "zones"])
            ] = rng.choice(["x", 1e999, -1, ["a"], {"a": 1}])
    return (
        yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        if rng.random() < 0.7
        else (json.dumps(data, allow_nan=True))
    )


def _deep(rng: random.Random) -> str:
    depth = rng.choice([65, 200, 5000, 100_000])
    if rng.random() < 0.5:
        return '{"fleet_id": "x", "policy": ' + '{"params": ' * depth + "{}" + "}" * (depth + 1)
    return "fleet_id: x\npolicy:\n  params:\n    a: " + "[" * depth + "]" * depth + "\n"


def hostile_yaml(seeds: Sequence[str], rng: random.Random) -> str | bytes:
    """One input: a text mutation of a seed, a structured edit, or one of the named attacks."""
    seed = rng.choice(seeds)
    choice = rng.randrange(12)
    if choice < 4:
        text = seed
        for _ in range(rng.choice([1, 1, 2, 3])):
            text = mutate_text(text, rng)
        return text
    if choice < 8:
        return _structured(seed, rng)
    if choice == 8:
        return rng.choice(
            [
                BOMB,
                "fleet_id: &a [x, *a]\n",
                "base: &b {fleet_id: x, tick_seconds: 5}\n<<: *b\n",
                "fleet_id: x\ntick_seconds: !custom 5\n",
                "fleet_id: !!python/object/apply:os.system [echo]\n",
                "fleet_id: x\npools: !!set {a}\n",
                seed + "\nx: &a {<<: *a}\n",
                seed.replace("fleet_id:", "fleet_id: &f", 1) + "policy2: *f\n",
                seed + "\n<<: {tick_seconds: 7}\n",
            ]
        )
    if choice == 9:
        return _deep(rng)
    if choice == 10:
        encoding = rng.choice(["latin-1", "utf-16", "cp1252", "utf-8-sig"])
        return seed.replace("fleet_id:", "fleet_id: é#", 1).encode(encoding, errors="replace")
    return seed.replace("tick_seconds: ", f"tick_seconds: {rng.choice(HOSTILE_NUMBERS)}#", 1)


class ConfigBoundary:
    name = "controller config YAML (validate, and what run/plan build)"

    def __init__(self) -> None:
        self._seeds: list[str] | None = None
        self._dir: Path | None = None  # made on first use: listing the boundaries makes none

    def seeds(self) -> Sequence[str]:
        if self._seeds is None:
            self._seeds = config_seeds()
        return self._seeds

    def generate(self, rng: random.Random) -> object:
        return hostile_yaml(self.seeds(), rng)

    def check(self, data: object) -> Outcome:
        assert isinstance(data, (str, bytes))
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="fuzz-config-"))
        path = self._dir / "config.yaml"
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8", errors="surrogatepass")
        else:
            path.write_bytes(data)
        run = run_cli(["validate", str(path)])
        text = data if isinstance(data, str) else ""
        if SECRET in run.err + run.out:
            return Outcome.wrong(f"a secret pasted as a variable name was echoed: {run.err!r}")
        if run.rc == 2:
            problem = error_problem(run, [str(path)])
            return Outcome.wrong(problem) if problem else Outcome.rejected(run.error_lines[0])
        if run.rc != 0:
            return Outcome.wrong(f"validate exit {run.rc}: {run.err[:200]!r}")
        loaded = _independent_load(text)
        if loaded is not None and any(bad_number(n) for n in numbers_in(loaded)):
            return Outcome.wrong("validate accepted a number that is not finite or too large")
        return self._as_run_builds(path)

    def _as_run_builds(self, path: Path) -> Outcome:
        """What ``run`` and ``plan`` build from the config ``validate`` accepted."""
        where = str(path)
        try:
            config = load_config(path)
            load_configured_policy(config, where)
            providers = build_providers(config, where)
            try:
                wiring = build_signals(config, where)
            finally:
                close_all(providers.values())
            close_all([*wiring.signals.queues, *wiring.signals.telemetry])
        except InputError as exc:
            return Outcome.wrong(f"validate accepted what run refuses: {exc}")
        dumped = config.model_dump()
        if any(bad_number(n) for n in numbers_in(dumped)):
            return Outcome.wrong("the built config holds a number that is not finite")
        local = set(providers) <= {"sim"} and all(s.kind == "static" for s in config.sources)
        if not local:
            return Outcome.accepted("validated and built")
        return _planned(path)

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _planned(path: Path) -> Outcome:
    """``plan --json`` on a config that reaches nothing outside this process."""
    run = run_cli(["plan", "--config", str(path), "--json"])
    if run.rc != 0:
        return Outcome.wrong(f"validate accepted what plan refuses: {run.err[:300]!r}")
    try:
        report = json.loads(run.out, parse_constant=float)
    except ValueError as exc:
        return Outcome.wrong(f"plan --json printed no JSON: {exc}")
    if any(bad_number(n) for n in numbers_in(report)):
        return Outcome.wrong("plan --json holds a number that is not finite")
    demand = report.get("demand", {})
    if demand.get("jobs", 0) < 0 or demand.get("gpus", 0) < 0:
        return Outcome.wrong(f"negative demand in the plan: {demand}")
    return Outcome.accepted("validated, built and planned")


BOUNDARIES = [ConfigBoundary()]
