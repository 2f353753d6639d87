"""report.html in headless Chromium at 1400 and 390 CSS px: the page never scrolls sideways, no
Markdown backticks show as text, figures keep a readable size; report.md's tables stay whole.

Chromium comes from Debian (scripts/install-tracers installs it); without it these tests skip."""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from test_report_markdown import assert_tables_whole

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (scripts/install-tracers installs it)")

# The report inside an iframe of the exact width (a headless window is never narrower than 500 px);
# once it has loaded, what the page measures is written into the DOM that --dump-dom prints.
WRAPPER = """<!doctype html><html><body style="margin:0">
<iframe id="page" style="border:0;width:{width}px;height:900px" srcdoc="{srcdoc}"></iframe>
<script>
document.getElementById("page").addEventListener("load", () => {{
  const doc = document.getElementById("page").contentDocument;
  const text = doc.body.cloneNode(true);
  text.querySelectorAll("pre").forEach((e) => e.remove());  // code blocks may hold backticks
  const images = [...doc.querySelectorAll("figure img, figure svg")];
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({{
    scrollWidth: doc.documentElement.scrollWidth,
    clientWidth: doc.documentElement.clientWidth,
    text: text.textContent,
    figures: images.map((e) => [e.getBoundingClientRect().width, e.naturalWidth || e.width.baseVal.value]),
  }});
  document.body.appendChild(probe);
}});
</script></body></html>"""


def chromium(page: Path, window: int, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    flags += ["--disable-component-update", "--no-first-run", f"--user-data-dir={page.parent / 'profile'}"]
    flags += [f"--window-size={window},900", "--virtual-time-budget=10000"]
    return subprocess.run([CHROMIUM, *flags, *args, page.as_uri()], capture_output=True, text=True, timeout=180)


def view(report: Path, width: int, workdir: Path) -> dict:
    """What the report measures at `width` CSS px; a screenshot of it lands next to the page."""
    workdir.mkdir()
    page = workdir / "page.html"
    page.write_text(WRAPPER.format(width=width, srcdoc=html.escape(report.read_text(), quote=True)))
    window = max(width, 500)
    chromium(page, window, f"--screenshot={workdir / 'screenshot.png'}")
    done = chromium(page, window, "--dump-dom")
    dom = done.stdout
    assert '<pre id="probe">' in dom, f"chromium measured nothing: {done.stderr[-2000:]}"
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    return json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))


@pytest.mark.slow
@pytest.mark.parametrize("width", [1400, 390])
def test_report_fits_the_screen_without_raw_backticks(lab_run, tmp_path, width):
    run = lab_run[0]  # tests/conftest.py: the lab with every step (training with TensorBoard, profile, ckpt anatomy)
    seen = view(run / "report.html", width, tmp_path / f"w{width}")
    assert (tmp_path / f"w{width}" / "screenshot.png").read_bytes().startswith(b"\x89PNG")
    assert seen["clientWidth"] <= width
    assert seen["scrollWidth"] <= seen["clientWidth"], "the page scrolls sideways"
    assert "`" not in seen["text"], [line for line in seen["text"].splitlines() if "`" in line]
    assert "dlscope tensorboard" in seen["text"]  # the inline code is still there, as <code>
    # a narrow screen scrolls a wide figure inside its box rather than shrinking its text away
    assert seen["figures"] and all(shown >= 0.75 * drawn for shown, drawn in seen["figures"] if drawn)


@pytest.mark.slow
def test_report_md_tables_stay_whole_with_counts_as_integers_and_the_settings_as_run(lab_run):
    tables = assert_tables_whole((lab_run[0] / "report.md").read_text())
    assert len(tables) >= 5
    by_header = {tuple(t[0]): t[1:] for t in tables}
    operators = next(rows for header, rows in by_header.items() if header[:2] == ("operator", "calls"))
    assert all(row[1].isdigit() for row in operators), "calls per step are whole numbers"
    assert not any("device" in column for header in by_header for column in header if header[0] == "operator")
    settings = dict(next(rows for header, rows in by_header.items() if header == ("setting", "value")))
    assert settings["device"] != "auto" and float(settings["lr"]) > 0  # as it ran: the device torch chose, the lr
