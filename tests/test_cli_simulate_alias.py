"""``simulate`` is ``report`` under its older name: one argparse parser with an alias, whose help
says so, so a script that calls ``simulate`` keeps working and a reader knows there is one
command, not two that might drift apart."""

from __future__ import annotations

import pytest

from autoscaler.cli import build_parser, main


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_simulate_help_says_it_is_report_kept_as_an_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_of(["simulate", "--help"], capsys)
    assert "simulate is the same command under its older name, kept as an alias" in text
    assert "new scripts use report" in text
    assert help_of(["report", "--help"], capsys) == text, "one parser, one help"
    assert "report (simulate)" in help_of(["--help"], capsys)


def test_simulate_and_report_parse_to_the_same_command() -> None:
    parser = build_parser()
    simulate = parser.parse_args(["simulate", "--scenario", "s.yaml", "--no-lower-bound"])
    report = parser.parse_args(["report", "--scenario", "s.yaml", "--no-lower-bound"])
    assert simulate.run is report.run
    assert {**vars(simulate), "command": "report"} == vars(report)
