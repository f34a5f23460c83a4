"""The HTML report renders in a real headless browser (Debian chromium) with its summary visible."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from suite.context import TargetInfo
from suite.reports import build_results, write_reports

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


def _report(tmp_path: Path) -> Path:
    target = TargetInfo(url="http://127.0.0.1:9", cluster_info={"worker_protocol": {"version": "1.20"}})
    records = [
        {
            "check": "c",
            "requirements": ["VERSION-MISSING"],
            "verdict": "passed",
            "message": "",
            "exchanges": [],
            "requests": 1,
        }
    ]
    run = {"run_id": "browser-run", "started_at": "2026-01-01T00:00:00+00:00", "seed": 1}
    return write_reports(build_results(target, records, run, options={}), tmp_path / "browser-run") / "report.html"


def test_report_loads_and_shows_the_summary(tmp_path: Path) -> None:
    page = _report(tmp_path)
    assert CHROMIUM is not None
    profile = tmp_path / "profile"
    dom = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    # The browser parsed the page and built the summary element with the badge in it.
    assert 'id="summary"' in dom
    assert 'id="badge"' in dom
    assert "requirements passed" in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--window-size=1200,800",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG"), "chromium rendered the page to a PNG"
