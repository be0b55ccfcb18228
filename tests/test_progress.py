"""Progress wherever a person waits: a tqdm bar on a terminal, otherwise a line every interval
and one as each step ends (a CI log is never silent for minutes), nothing with --no-progress.
Every replay of ``report`` (the checkpoint comparison too), the lower bound and each step of
``report --suite`` show it."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from test_sim_engine import job_row, small_scenario
from waits import bound

from autoscaler.model.errors import InputError
from autoscaler.model.progress import INTERVAL_ENV, Progress, duration, interval_s
from autoscaler.report.suite import load_suite, run_suite

ROOT = Path(__file__).resolve().parent.parent
JOBS = [job_row(f"j{i}", i * 900, 3000 + 100 * i, preemptible=int(i % 3 != 0)) for i in range(30)]
STEPS_DONE = (
    r"reading scenario small: done in [\d.]+ s",
    r"\[1/5\] replay cost-aware: done, 24 h in [\d.]+ s",
    r"\[2/5\] replay cheapest-spot: done, 24 h in [\d.]+ s",
    r"\[3/5\] replay on-demand: done, 24 h in [\d.]+ s",
    r"\[4/5\] replay cost-aware without checkpoint awareness: done, 24 h in [\d.]+ s",
    r"\[5/5\] lower bound: done, 2 bounds in [\d.]+ s",
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def wait_for(condition: object, within_s: float = 60.0) -> None:
    """Poll ``condition``; ``within_s`` is a ceiling scaled by the wait knob."""
    assert callable(condition)
    give_up = time.monotonic() + bound(within_s)
    while not condition():
        assert time.monotonic() < give_up, "the condition did not come true in time"
        time.sleep(0.01)


def test_a_log_gets_a_line_every_interval_while_the_work_runs_and_one_when_done() -> None:
    stream = io.StringIO()
    with Progress("replay x", 600, "h", stream=stream, interval=0.01) as shown:
        shown.update_to(150)
        shown.note("half way to somewhere")
        wait_for(lambda: "(25 %)" in stream.getvalue())
        shown.update_to(600)
    lines = stream.getvalue().splitlines()
    beat = next(line for line in lines if "(25 %)" in line)
    assert re.fullmatch(
        r"replay x: 150/600 h \(25 %\), [\d.]+ s elapsed, about [\d.]+ s left "
        r"\(half way to somewhere\)",
        beat,
    ), beat
    assert re.fullmatch(r"replay x: done, 600 h in [\d.]+ s", lines[-1]), lines
    assert sum("done" in line for line in lines) == 1


def test_one_long_step_with_no_updates_still_gets_lines() -> None:
    """A linear program solving for minutes calls nothing back: the timer still says it runs."""
    stream = io.StringIO()
    with Progress("lower bound", 2, "bounds", stream=stream, interval=0.01):
        wait_for(lambda: stream.getvalue().count("\n") >= 3)
    assert stream.getvalue().splitlines()[0].startswith("lower bound: 0/2 bounds (0 %), ")


def test_work_that_fails_gets_no_done_line_and_the_timer_stops() -> None:
    stream = io.StringIO()
    with pytest.raises(ValueError, match="boom"), Progress("x", 10, stream=stream, interval=5):
        raise ValueError("boom")
    assert "done" not in stream.getvalue()
    assert not [t for t in threading.enumerate() if t.name == "progress: x"]


def test_disabled_progress_writes_nothing_and_starts_no_thread() -> None:
    stream = io.StringIO()
    before = threading.active_count()
    with Progress("quiet", 10, "h", enabled=False, stream=stream, interval=0.01) as shown:
        assert threading.active_count() == before
        shown.update_to(5)
    assert stream.getvalue() == ""


def test_a_terminal_gets_a_tqdm_bar_and_no_log_lines() -> None:
    stream = Terminal()
    with Progress("replay x", 24, "h", stream=stream, interval=0.01) as shown:
        shown.update_to(12)
        # tqdm draws at most every 0.1 s itself; the timer redraws it between updates
        wait_for(lambda: "replay x:  50%|" in stream.getvalue())
    shown_text = stream.getvalue()
    assert "\r" in shown_text and "replay x:  50%|" in shown_text and "12/24" in shown_text
    assert "done" not in shown_text and "elapsed" not in shown_text


def test_the_interval_knob_is_checked() -> None:
    assert interval_s() > 0
    for bad in ("0", "-1", "soon", "nan"):
        os.environ[INTERVAL_ENV] = bad
        try:
            with pytest.raises(InputError, match=INTERVAL_ENV):
                interval_s()
        finally:
            del os.environ[INTERVAL_ENV]
    assert [duration(s) for s in (0.04, 42, 185, 7620)] == [
        "0.0 s",
        "42 s",
        "3 min 05 s",
        "2 h 07 min",
    ]


def report(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir()
    scenario = small_scenario(tmp_path, jobs=JOBS)
    command = [sys.executable, "-m", "autoscaler.cli", "report", "--scenario", str(scenario)]
    return subprocess.run(
        [*command, "--out", str(tmp_path / "out"), *extra],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, INTERVAL_ENV: "0.05"},
        timeout=bound(600),
    )


def test_a_report_logs_every_replay_and_the_bound_and_no_progress_silences_it(
    tmp_path: Path,
) -> None:
    done = report(tmp_path / "shown")
    assert done.returncode == 0, done.stderr
    for step in STEPS_DONE:
        assert re.search(rf"^{step}$", done.stderr, re.MULTILINE), (step, done.stderr)
    assert "cost-aware (default)" in done.stdout

    quiet = report(tmp_path / "quiet", "--no-progress")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    assert "cost-aware (default)" in quiet.stdout


def test_a_report_on_a_terminal_draws_bars(tmp_path: Path) -> None:
    scenario = small_scenario(tmp_path, jobs=JOBS)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    command = [sys.executable, "-m", "autoscaler.cli", "report", "--scenario", str(scenario)]
    process = subprocess.Popen(
        [*command, "--out", str(tmp_path / "out")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes with the process
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    assert process.wait(timeout=bound(600)) == 0
    text = drawn.decode(errors="replace")
    for title in ("cost-aware", "cheapest-spot", "on-demand"):
        assert re.search(rf"replay {title}: +\d+%\|", text), text[-2000:]
    assert re.search(r"replay cost-aware without checkpoint awareness: +\d+%\|", text)
    assert "[5/5] lower bound:" in text
    assert "done," not in text and "elapsed" not in text


def test_each_step_of_a_suite_logs_its_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.05")
    (tmp_path / "s").mkdir()
    scenario = small_scenario(tmp_path / "s", jobs=JOBS[:10])
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"name: tiny\npolicies: [{{name: cost-aware}}, {{name: on-demand}}]\n"
        f"scenarios:\n  - file: {scenario}\n"
    )
    said: list[str] = []
    run_suite(load_suite(suite), progress=said.append, show_progress=True)
    err = capsys.readouterr().err
    for step in (
        r"\[1/1\] reading scenario small: done in [\d.]+ s",
        r"\[1/1\] small: replay cost-aware: done, 24 h in [\d.]+ s",
        r"\[1/1\] small: replay on-demand: done, 24 h in [\d.]+ s",
        r"\[1/1\] small: lower bound: done, 2 bounds in [\d.]+ s",
    ):
        assert re.search(rf"^{step}$", err, re.MULTILINE), (step, err)
    assert said[0].startswith("[1/1] small: 10 jobs")

    run_suite(load_suite(suite), progress=None, show_progress=False)
    assert capsys.readouterr().err == ""
