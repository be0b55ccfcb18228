"""The HTML report as a browser lays it out: headless Chromium (Debian's ``chromium``, installed by
scripts/install-test-services.sh) renders a small report, takes a screenshot and dumps the DOM.

A probe script, added to a copy of the page (the report itself carries no script), measures every
table after layout and writes the numbers into the DOM, so ``--dump-dom`` carries them out: a
table that needs a horizontal scroll bar at 1280 px, or a comparison table that needs one at
800 px, fails the test.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageChops
from test_report_render import sample_report
from waits import bound

from autoscaler.report.render import comparison_tables, render_html

# Generous: a cold Chromium start on a busy 2-core machine takes seconds, not minutes.
CHROMIUM_TIMEOUT_S = 180.0
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
BACKGROUND = (250, 250, 250)  # the page's #fafafa
SCREEN_HEIGHT = 1600
PROBE = """<script>
(function () {
  var out = {inner: window.innerWidth, page: [document.documentElement.scrollWidth,
             document.documentElement.clientWidth], tables: []};
  document.querySelectorAll("table").forEach(function (table) {
    var box = table.parentElement;
    out.tables.push({
      key: table.getAttribute("data-table") || "",
      scroll: box.scrollWidth,
      client: box.clientWidth,
      headers: Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
        return th.textContent;
      })
    });
  });
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


@dataclass(frozen=True)
class Layout:
    inner_width: int
    page_scroll: int
    page_client: int
    tables: list[dict[str, Any]]

    def table(self, key: str) -> dict[str, Any]:
        (found,) = [t for t in self.tables if t["key"] == key]
        return found


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium not found: run scripts/install-test-services.sh (make test does)")
    return found


def _run_chromium(tmp_path: Path, width: int, url: str, *extra: str) -> str:
    """One headless Chromium with a fresh profile and home; its DOM dump, or a clear failure."""
    profile = tmp_path / f"profile-{width}"
    home = tmp_path / f"home-{width}"
    home.mkdir()
    command = [
        _chromium(),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},{SCREEN_HEIGHT}",
        *extra,
        "--dump-dom",
        url,
    ]
    env = {**os.environ, "HOME": str(home)}
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=bound(CHROMIUM_TIMEOUT_S))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"chromium did not finish within {bound(CHROMIUM_TIMEOUT_S):g} s")
    assert process.returncode == 0, err[-2000:]
    return out


def _layout(dom: str) -> Layout:
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert found is not None, "the probe script did not run: " + dom[-500:]
    raw = json.loads(html.unescape(found.group(1)))
    return Layout(raw["inner"], raw["page"][0], raw["page"][1], raw["tables"])


# A table no page can fit, styled as the report's tables: the probe must see it overflow, or it
# measures the wrong thing and the other assertions prove nothing.
CANARY = (
    '<div class="scroll"><table data-table="canary"><tr>'
    + "".join(f'<td class="num">{n:,}</td>' for n in range(10**9, 10**9 + 40))
    + "</tr></table></div>\n"
)


@dataclass(frozen=True)
class Pages:
    plain: Path
    """The report as written."""
    probed: Path
    """A copy with the probe script before ``</body>``."""
    canary: Path
    """The probed copy with the canary table at its end."""


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Pages:
    folder = tmp_path_factory.mktemp("page")
    page = render_html(sample_report())
    written = Pages(folder / "report.html", folder / "probed.html", folder / "canary.html")
    written.plain.write_text(page, encoding="utf-8")
    written.probed.write_text(page.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
    canary = page.replace("</main>", CANARY + "</main>", 1)
    written.canary.write_text(canary.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
    return written


@pytest.fixture(scope="module")
def at_1280(pages: Pages, tmp_path_factory: pytest.TempPathFactory) -> tuple[Layout, Path]:
    """One Chromium run at 1280 px: the probe's numbers and a screenshot of the page's top."""
    folder = tmp_path_factory.mktemp("chromium-1280")
    shot = folder / "shot.png"
    dom = _run_chromium(folder, 1280, pages.probed.as_uri(), f"--screenshot={shot}")
    return _layout(dom), shot


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_screenshot_is_the_window_size_and_mostly_drawn(at_1280: tuple[Layout, Path]) -> None:
    _, shot = at_1280
    with Image.open(shot) as image:
        assert image.size == (1280, SCREEN_HEIGHT)
        rgb = image.convert("RGB")
    background = Image.new("RGB", rgb.size, BACKGROUND)
    blank = ImageChops.difference(rgb, background).convert("L").histogram()[0]
    drawn = 1 - blank / (rgb.width * rgb.height)
    # text and plot lines: a page of empty boxes (no font, no figure) has none
    ink = sum(rgb.convert("L").histogram()[:128]) / (rgb.width * rgb.height)
    print(f"screenshot: {drawn:.1%} of the pixels differ from the background, {ink:.1%} are ink")
    assert drawn > 0.25, f"only {drawn:.0%} of the screenshot differs from the background"
    assert ink > 0.005, f"only {ink:.1%} of the screenshot is text or lines"


def test_the_dom_has_every_column_of_the_comparison(at_1280: tuple[Layout, Path]) -> None:
    layout, _ = at_1280
    cost, usage = comparison_tables(sample_report())
    shown = {
        key: [_words(h) for h in layout.table(key)["headers"]]
        for key in ("comparison-cost", "comparison-usage")
    }
    assert shown == {"comparison-cost": list(cost.headers), "comparison-usage": list(usage.headers)}


def test_no_table_overflows_at_1280_px(at_1280: tuple[Layout, Path]) -> None:
    layout, _ = at_1280
    assert layout.inner_width == 1280
    assert layout.page_scroll <= layout.page_client, "the page scrolls sideways"
    assert len(layout.tables) >= 7
    for table in layout.tables:
        assert table["client"] > 0, table
        assert table["scroll"] <= table["client"], f"needs a horizontal scroll bar: {table}"


def test_the_comparison_fits_a_narrow_800_px_window(pages: Pages, tmp_path: Path) -> None:
    layout = _layout(_run_chromium(tmp_path, 800, pages.canary.as_uri()))
    assert layout.inner_width == 800
    assert layout.page_scroll <= layout.page_client, "the page scrolls sideways"
    canary = layout.table("canary")
    assert canary["scroll"] > canary["client"] > 0, "the probe sees a table that cannot fit"
    for key in ("comparison-cost", "comparison-usage"):
        table = layout.table(key)
        assert table["scroll"] <= table["client"], f"needs a horizontal scroll bar: {table}"


def test_the_report_itself_carries_no_script(pages: Pages) -> None:
    assert "<script" not in pages.plain.read_text(encoding="utf-8")
