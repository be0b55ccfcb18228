"""Running a sweep: every replay and every lower bound is a task of its own, run in this process,
in a pool of local processes or on a Ray cluster, and the results make one suite report.

The driver reads each scenario once (``prepare``: the trace window, the markets) and ships the
prepared scenario to whichever process runs a task, so a worker needs no file of the sweep, only
the installed package. A task is a pure function of the prepared scenario and the policy's spec
(``execute``), and the comparison is built by the suite's own code (``scenario_result``,
``policy_medians``, ``SuiteReport``) from the results in the sweep's order, not in the order they
finished: where a task ran changes its wall time and nothing else. ``suite.json`` and ``suite.md``
are written by the suite's writer, so a sweep's report reads as the evaluation suite's does.

Errors cross process and machine boundaries as values (``Failure``): an exception pickled by a
pool or by Ray loses the fields an ``InputError`` names its file and line with, or cannot be
rebuilt at all.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Protocol

from autoscaler.model.errors import InputError, describe
from autoscaler.model.progress import Progress, duration
from autoscaler.report.build import policy_result
from autoscaler.report.model import PolicyResult
from autoscaler.report.suite import (
    ScenarioResult,
    SuiteReport,
    _bound_at_target,
    median_or_none,
    policy_medians,
    scenario_result,
)
from autoscaler.report.sweep_grid import LoadedSweep
from autoscaler.sim.engine import Prepared, Timeline, prepare, simulate
from autoscaler.sim.lowerbound_result import LowerBoundResult
from autoscaler.sim.scenario import PolicySpec

BOUND = -1
"""A task's ``index`` when it computes its scenario's lower bound instead of replaying."""


@dataclass(frozen=True)
class Task:
    """One unit of a sweep: a replay of one policy in one scenario, or a scenario's bound."""

    number: int  # 1-based, in the order the sweep hands tasks out
    scenario: int  # the scenario's position in the sweep
    index: int  # the run's position in its scenario's list; BOUND for the lower bound
    spec: PolicySpec | None  # None for the lower bound


@dataclass(frozen=True)
class Failure:
    """An error a task ended in, as plain fields (see the module's docstring)."""

    input_error: bool
    where: str
    message: str
    field: str | None
    traceback: str


@dataclass(frozen=True)
class Outcome:
    task: Task
    policy: PolicyResult | None = None
    bound: LowerBoundResult | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    failure: Failure | None = None


def execute(task: Task, prepared: Prepared) -> Outcome:
    """Run one task where it was sent. CPU time is this process's own: on a busy machine, wall
    time says little of what a run costs.

    A replay comes back as the report's ``PolicyResult`` without its timeline: the comparison
    shows none, and the per-tick series are nearly all of a replay's result (1 MB of a ten-day
    replay against 2 kB), which the driver would hold for every run of the sweep. The lower
    bound's ratios in it are left empty for the same reason: the suite's rows take the ratio
    from the scenario's bound, not from there."""
    cpu, began = time.process_time(), time.perf_counter()
    policy: PolicyResult | None = None
    bound: LowerBoundResult | None = None
    try:
        if task.spec is None:
            from autoscaler.sim.lowerbound import compute_lower_bounds

            bound = _bound_at_target(
                compute_lower_bounds(prepared), prepared.loaded.scenario.wait_target_s
            )
        else:
            replay = simulate(prepared, task.spec, task.index)
            policy = policy_result(replace(replay, timeline=Timeline()), prepared, [])
    except InputError as exc:
        failure = Failure(True, exc.where, exc.message, exc.field, traceback.format_exc())
        return Outcome(task, failure=failure)
    except Exception as exc:
        failure = Failure(False, "", describe(exc), None, traceback.format_exc())
        return Outcome(task, failure=failure)
    return Outcome(
        task, policy, bound, time.process_time() - cpu, time.perf_counter() - began, None
    )


# ---------------------------------------------------------------- where tasks run

Done = Callable[[Outcome], None]


class Executor(Protocol):
    """Runs every task and calls ``done`` in the calling thread as each one finishes; stops
    the rest when ``done`` raises."""

    def describe(self) -> str: ...

    def run(self, tasks: Sequence[Task], prepared: Sequence[Prepared], done: Done) -> None: ...


class InProcess:
    """One task after another in this process (``--jobs 1``): nothing to start, easiest to
    debug."""

    def describe(self) -> str:
        return "in this process"

    def run(self, tasks: Sequence[Task], prepared: Sequence[Prepared], done: Done) -> None:
        for task in tasks:
            done(execute(task, prepared[task.scenario]))


def _worker_ignores_interrupts() -> None:
    """Ctrl-C reaches every process of the terminal's group: the driver alone handles it (it
    stops the workers), so the workers do not each print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LocalProcesses:
    """A pool of ``jobs`` fresh Python processes on this machine. They are spawned, not forked:
    a fork copies the driver's threads (the progress timer) mid-flight, and a fresh process,
    like a Ray worker, shares nothing with the driver but what a task carries."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def describe(self) -> str:
        return f"in {self.jobs} local processes"

    def run(self, tasks: Sequence[Task], prepared: Sequence[Prepared], done: Done) -> None:
        pool = ProcessPoolExecutor(
            max_workers=max(1, min(self.jobs, len(tasks))),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_ignores_interrupts,
        )
        finished = False
        futures: dict[Future[Outcome], Task] = {}
        try:
            for task in tasks:
                futures[pool.submit(execute, task, prepared[task.scenario])] = task
            for future in as_completed(futures):
                done(future.result())
            finished = True
        except BrokenProcessPool:
            raise InputError(
                "--jobs",
                "a worker process died (killed, or out of memory?); try fewer --jobs",
            ) from None
        finally:
            _stop(pool, futures, finished)


def _stop(pool: ProcessPoolExecutor, futures: dict[Future[Outcome], Task], clean: bool) -> None:
    """Let the pool end: at once when the sweep failed or was interrupted (a replay still
    running can take a minute, and nobody wants its result now)."""
    if clean:
        pool.shutdown(wait=True)
        return
    for future in futures:
        future.cancel()
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


def default_jobs() -> int:
    """The CPUs this process may use (a container's or a CPU set's share, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------- the sweep


def plan_tasks(sweep: LoadedSweep, lower_bound: bool) -> list[Task]:
    """Every task of the sweep; the lower bounds first, since one linear program can outlast
    several replays and should not be the last thing a pool waits on."""
    wanted: list[tuple[int, int, PolicySpec | None]] = []
    if lower_bound:
        wanted += [
            (s, BOUND, None)
            for s, loaded in enumerate(sweep.scenarios)
            if loaded.scenario.lower_bound.enabled
        ]
    for s, specs in enumerate(sweep.policies):
        wanted += [(s, index, spec) for index, spec in specs]
    return [Task(n, s, index, spec) for n, (s, index, spec) in enumerate(wanted, start=1)]


def _prepare_all(
    sweep: LoadedSweep, show: bool, say: Callable[[str], None]
) -> tuple[list[Prepared], list[float]]:
    """Read every scenario here, once: a trace too long to replay is found before any task
    runs, and the workers get the prepared scenario rather than the files."""
    prepared: list[Prepared] = []
    prepare_s: list[float] = []
    total = len(sweep.scenarios)
    for number, loaded in enumerate(sweep.scenarios, start=1):
        name = loaded.scenario.name
        began = time.perf_counter()
        with (
            loaded.locating(),
            Progress(f"[{number}/{total}] reading scenario {name}", enabled=show),
        ):
            ready = prepare(loaded)
        loaded.check_replay_length(ready.horizon_s)
        prepare_s.append(time.perf_counter() - began)
        prepared.append(ready)
        say(
            f"[{number}/{total}] {name}: {len(ready.selection.jobs):,} jobs over "
            f"{ready.horizon_s / 86_400:.1f} days"
        )
    return prepared, prepare_s


def _title(sweep: LoadedSweep, task: Task) -> str:
    name = sweep.scenarios[task.scenario].scenario.name
    return f"{name}: {'lower bound' if task.spec is None else task.spec.title}"


def _finished_line(sweep: LoadedSweep, outcome: Outcome, count: int, total: int) -> str:
    task = outcome.task
    if outcome.policy is not None:
        what = f"${outcome.policy.cost:,.2f}"
    elif outcome.bound is not None and outcome.bound.cost is not None:
        what = f"${outcome.bound.cost:,.2f} at a {outcome.bound.max_wait_s:g} s wait"
    else:
        what = outcome.bound.status if outcome.bound is not None else "none"
    return (
        f"[{count}/{total}] {_title(sweep, task)}: {what} in {duration(outcome.wall_s)} "
        f"({duration(outcome.cpu_s)} CPU)"
    )


class RemoteTraceback(Exception):  # noqa: N818 (it is a traceback, shown with --debug)
    """The traceback of a task that failed in another process: the cause of the error raised
    here, so ``--debug`` shows where the worker failed."""


def _raise(sweep: LoadedSweep, task: Task, failure: Failure) -> None:
    if failure.input_error:
        raise InputError(failure.where, failure.message, failure.field)
    raise RuntimeError(f"{_title(sweep, task)} failed: {failure.message}") from RemoteTraceback(
        failure.traceback
    )


def run_sweep(
    sweep: LoadedSweep,
    executor: Executor,
    *,
    lower_bound: bool = True,
    progress: Callable[[str], None] | None = None,
    show_progress: bool = False,
) -> SuiteReport:
    """Every run of the sweep through ``executor``; the suite's comparison of the results.

    ``progress`` gets a line as each scenario is read and as each task finishes;
    ``show_progress`` shows the sweep while it runs (a bar on a terminal, else a line every
    ~10 s: ``autoscaler.model.progress``)."""
    say = progress or (lambda _line: None)
    started = time.perf_counter()
    prepared, prepare_s = _prepare_all(sweep, show_progress, say)
    tasks = plan_tasks(sweep, lower_bound and sweep.lower_bound)
    outcomes: dict[tuple[int, int], Outcome] = {}
    say(f"sweep {sweep.name}: {len(tasks):,} runs {executor.describe()}")
    with Progress(f"sweep {sweep.name}", len(tasks), "runs", enabled=show_progress) as bar:

        def done(outcome: Outcome) -> None:
            if outcome.failure is not None:
                _raise(sweep, outcome.task, outcome.failure)
            outcomes[(outcome.task.scenario, outcome.task.index)] = outcome
            bar.advance()
            say(_finished_line(sweep, outcome, len(outcomes), len(tasks)))

        executor.run(tasks, prepared, done)
    results = [
        _scenario(sweep, s, prepared[s], prepare_s[s], outcomes)
        for s in range(len(sweep.scenarios))
    ]
    return SuiteReport(
        suite=sweep.name,
        description=sweep.description,
        source=sweep.source,
        default_policy=sweep.default_policy,
        policies=sweep.titles(),
        peer_wait_slack_s=sweep.peer_wait_slack_s,
        lower_bound=lower_bound and sweep.lower_bound,
        scenarios=results,
        medians=policy_medians(results),
        median_peer_over_default=median_or_none([r.peer_over_default for r in results]),
        wall_s=round(time.perf_counter() - started, 2),
    )


def _scenario(
    sweep: LoadedSweep,
    s: int,
    prepared: Prepared,
    prepare_s: float,
    outcomes: dict[tuple[int, int], Outcome],
) -> ScenarioResult:
    """One scenario's comparison, exactly as the suite makes it, from its tasks' results in the
    sweep's order."""
    found = outcomes.get((s, BOUND))
    bound = found.bound if found is not None else None
    replays = [outcomes[(s, index)] for index, _spec in sweep.policies[s]]
    policies = [o.policy for o in replays if o.policy is not None]
    return scenario_result(
        sweep.scenarios[s],
        prepared,
        policies,
        bound,
        sweep.default_policy,
        sweep.peer_wait_slack_s,
        prepare_s,
        [o.cpu_s for o in replays],
    )
