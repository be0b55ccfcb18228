from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from exporter_server import Answer, ExporterServer

from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import InputError, SourceError
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource


def gpu_text(host: str | None, utils: list[float], stamp_ms: int | None = None) -> str:
    lines = []
    for index, util in enumerate(utils):
        hostname = f',Hostname="{host}"' if host is not None else ""
        stamp = f" {stamp_ms}" if stamp_ms is not None else ""
        labels = f'gpu="{index}",UUID="GPU-{host}-{index}"{hostname}'
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}{stamp}")
    body = "\n".join(lines)
    return f"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n{body}\ngpu_autoscaler_agent_nvml_up 1\n"


def source(clock: ManualClock | None = None, **settings: object) -> ScrapeTelemetrySource:
    return ScrapeTelemetrySource(
        ScrapeSettings.model_validate(settings), "agents", clock or ManualClock(1_000.0)
    )


def test_every_target_is_scraped_and_folded(exporters: ExporterServer) -> None:
    exporters.answers["/a/metrics"] = Answer(gpu_text("gpu-a", [90, 80]))
    exporters.answers["/b/metrics"] = Answer(gpu_text("gpu-b", [0, 1, 2, 3]))
    scraper = source(targets=[exporters.url("/a/metrics"), exporters.url("/b/metrics")])
    samples = scraper.read_gpus(1_000.0)
    by_host: dict[str, list[float]] = {}
    for sample in samples:
        by_host.setdefault(sample.host, []).append(sample.util_pct)
        assert sample.at == 1_000.0
    assert {h: sorted(u) for h, u in by_host.items()} == {
        "gpu-a": [80.0, 90.0],
        "gpu-b": [0.0, 1.0, 2.0, 3.0],
    }
    assert set(scraper.target_status().values()) == {None}
    scraper.close()


def test_host_and_port_targets_get_scheme_and_path(exporters: ExporterServer) -> None:
    exporters.answers["/metrics"] = Answer(gpu_text("gpu-c", [50]))
    scraper = source(targets=[f"127.0.0.1:{exporters.port}"])
    assert [s.host for s in scraper.read_gpus(0.0)] == ["gpu-c"]
    assert exporters.hits["/metrics"] == 1


def test_one_bad_target_is_reported_alone_and_the_rest_still_count(
    exporters: ExporterServer, caplog: pytest.LogCaptureFixture
) -> None:
    exporters.answers["/good"] = Answer(gpu_text("gpu-ok", [10]))
    exporters.answers["/nolabel"] = Answer(gpu_text(None, [10]))
    exporters.answers["/nan"] = Answer('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="x"} NaN\n')
    exporters.answers["/down"] = Answer("oops", status=500)
    exporters.answers["/nogpu"] = Answer("# agent: no GPU\ngpu_autoscaler_agent_nvml_up 0\n")
    urls = {name: exporters.url(f"/{name}") for name in ("good", "nolabel", "nan", "down", "nogpu")}
    scraper = source(targets=list(urls.values()))
    # at WARNING whatever level an earlier in-process command left the root logger at
    with caplog.at_level(logging.WARNING):
        samples = scraper.read_gpus(0.0)
    assert [s.host for s in samples] == ["gpu-ok"]
    status = scraper.target_status()
    assert status[urls["good"]] is None
    assert "no 'Hostname' label" in str(status[urls["nolabel"]])
    assert "not a finite number" in str(status[urls["nan"]])
    assert status[urls["down"]] == "HTTP 500"
    assert "no DCGM_FI_DEV_GPU_UTIL series" in str(status[urls["nogpu"]])
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warning) == 1 and "4 of 5 targets failed" in warning[0]


def test_when_every_target_fails_the_source_fails(exporters: ExporterServer) -> None:
    exporters.answers["/slow"] = Answer(gpu_text("gpu-s", [1]), delay_s=1.0)
    scraper = source(targets=[exporters.url("/slow"), exporters.url("/missing")], timeout_s=0.2)
    with pytest.raises(SourceError, match="2 of 2 targets failed") as caught:
        scraper.read_gpus(0.0)
    message = str(caught.value)
    assert "HTTP 404" in message and "timed out" in message
    assert set(scraper.target_status()) == {exporters.url("/slow"), exporters.url("/missing")}


def test_an_unreachable_port_is_a_failed_target_not_a_crash() -> None:
    scraper = source(targets=["127.0.0.1:1"], timeout_s=0.5)
    with pytest.raises(SourceError, match="unreachable"):
        scraper.read_gpus(0.0)


def test_file_sd_targets_are_read_and_reread_when_the_file_changes(
    exporters: ExporterServer, tmp_path: Path
) -> None:
    exporters.answers["/metrics"] = Answer(gpu_text("pod-dcgm-xyz", [70, 71]))
    exporters.answers["/other"] = Answer(gpu_text("gpu-b", [5]))
    targets = tmp_path / "targets.json"
    targets.write_text(
        json.dumps([{"targets": [f"127.0.0.1:{exporters.port}"], "labels": {"node": "gpu-07"}}])
    )
    scraper = source(targets_file=str(targets))
    assert {s.host for s in scraper.read_gpus(0.0)} == {"gpu-07"}

    targets.write_text(
        json.dumps(
            [
                {"targets": [f"127.0.0.1:{exporters.port}"], "labels": {"node": "gpu-07"}},
                {"targets": [exporters.url("/other")]},
            ]
        )
    )
    stat = targets.stat()
    os.utime(targets, (stat.st_atime, stat.st_mtime + 5))
    assert {s.host for s in scraper.read_gpus(0.0)} == {"gpu-07", "gpu-b"}


def test_a_yaml_targets_file_works_too(exporters: ExporterServer, tmp_path: Path) -> None:
    exporters.answers["/metrics"] = Answer(gpu_text("gpu-y", [1]))
    targets = tmp_path / "targets.yaml"
    targets.write_text(f"- targets: ['127.0.0.1:{exporters.port}']\n")
    assert [s.host for s in source(targets_file=str(targets)).read_gpus(0.0)] == ["gpu-y"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON or YAML"),
        ('{"targets": []}', "expected a list of target groups"),
        ('[{"labels": {}}]', r"group \[0\] targets: Field required"),
    ],
)
def test_a_bad_targets_file_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text(content)
    with pytest.raises(SourceError, match=message) as caught:
        source(targets_file=str(targets)).read_gpus(0.0)
    assert str(targets) in str(caught.value)


def test_a_missing_targets_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"targets\.json: No such file"):
        source(targets_file=str(tmp_path / "targets.json")).read_gpus(0.0)


def test_settings_errors_name_the_field() -> None:
    with pytest.raises(InputError, match=r"sources\.agents: .*set targets, targets_file or both"):
        ScrapeTelemetrySource.from_config({}, "agents")
    with pytest.raises(InputError, match=r"sources\.agents\.concurrency"):
        ScrapeTelemetrySource.from_config({"targets": ["h:1"], "concurrency": 0}, "agents")
