"""report.html renders in a real headless browser (Debian chromium) for a passing, a failing, an incomplete and
a harness-error run: the badge says the run verdict in its colour, the headline is there, and no
requirement ID wraps even in a narrow window; and what the page shows per area is what the terminal said."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from suite.reports import terminal_lines, write_reports
from tests.suite.test_reports import report_kinds, stopped_after_one_area

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# CI installs chromium and sets DW_REQUIRE_BROWSER=1, so there the test can never be skipped silently.
pytestmark = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("DW_REQUIRE_BROWSER") != "1",
    reason="chromium is not installed (.ci/run installs it)",
)

# Measures the rendered page and writes what it found into the DOM, which --dump-dom then prints: the badge's
# text and colour, and every requirement ID laid out on more than one line.
MEASURE = """<script>
const badge = document.getElementById("badge");
const wrapped = [...document.querySelectorAll("code.id")].filter(el => el.getClientRects().length > 1);
const out = document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify({badge: badge.textContent, color: getComputedStyle(badge).backgroundColor,
  ids: document.querySelectorAll("code.id").length, wrapped: wrapped.map(el => el.textContent)});
document.body.appendChild(out);
</script>"""

BADGES = {
    "passing": ("CONFORMANT", "rgb(26, 127, 55)"),
    "failing": ("NOT CONFORMANT", "rgb(207, 34, 46)"),
    "incomplete": ("INCOMPLETE", "rgb(154, 103, 0)"),
    "harness-error": ("HARNESS ERROR", "rgb(149, 56, 0)"),
}


def _dump(page: Path, profile: Path) -> str:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=720,900", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


@pytest.mark.parametrize("kind", list(BADGES))
def test_report_renders_with_its_verdict(tmp_path: Path, kind: str) -> None:
    import json

    page = write_reports(report_kinds()[kind], tmp_path / kind) / "report.html"
    measured = page.with_name("measured.html")
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = _dump(measured, tmp_path / "profile")
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom)
    assert found is not None, dom[-2000:]
    facts = json.loads(found.group(1).replace("&quot;", '"'))
    badge, color = BADGES[kind]
    assert facts["badge"] == badge
    assert facts["color"] == color
    assert facts["ids"] > 0
    assert facts["wrapped"] == []  # IDs never break mid-ID, even in a 720 px window
    assert 'id="headline"' in dom
    assert f"{badge}: " in dom


def test_report_renders_to_an_image(tmp_path: Path) -> None:
    page = write_reports(report_kinds()["passing"], tmp_path / "run") / "report.html"
    assert CHROMIUM is not None
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'p'}",
            "--window-size=1200,800",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes().startswith(b"\x89PNG"), "chromium rendered the page to a PNG"


# The verdict each area's table shows, as rendered (innerText), counted per area.
VERDICTS_BY_AREA = """<script>
const areas = {};
for (const h of document.querySelectorAll("h3[id^='area-']")) {
  const counts = {};
  for (const cell of h.nextElementSibling.querySelectorAll("td.verdict")) {
    counts[cell.innerText] = (counts[cell.innerText] || 0) + 1;
  }
  areas[h.id.slice(5)] = counts;
}
const out = document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify(areas);
document.body.appendChild(out);
</script>"""


def test_the_page_and_the_terminal_agree_on_what_did_not_run(tmp_path: Path) -> None:
    """A run stopped early (-x): each area's requirements read "not run" in the rendered page exactly as many
    times as the terminal's per-area table says, and neither calls them not covered."""
    import json

    results = stopped_after_one_area()
    page = write_reports(results, tmp_path / "run") / "report.html"
    measured = page.with_name("measured.html")
    measured.write_text(
        page.read_text(encoding="utf-8").replace("</body>", VERDICTS_BY_AREA + "</body>"), encoding="utf-8"
    )
    dom = _dump(measured, tmp_path / "profile")
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom)
    assert found is not None, dom[-2000:]
    rendered: dict[str, dict[str, int]] = json.loads(found.group(1).replace("&quot;", '"'))
    table: dict[str, dict[str, int]] = {}
    for line in terminal_lines(results, None, width=200):
        area, _, counts = line.strip().partition(" ")
        if area in rendered:
            table[area] = {
                verdict: int(n) for n, verdict in (c.strip().split(" ", 1) for c in counts.strip().split(","))
            }
    assert table == {a: {v: n for v, n in c.items() if v != "not-applicable"} for a, c in rendered.items()}
    assert sum(c.get("not run", 0) for c in rendered.values()) == sum(not r["ran"] for r in results["requirements"])
    assert not any("not-covered" in c for c in rendered.values())
