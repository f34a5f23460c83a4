"""``bench/cycle_cost.py``: its counting leaves the database as the server keeps it, and ``--split`` divides the
handler's time into SQL statements and the rest. The shape of the measurement is checked, never its speed."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.integration.bench_scripts import load

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "cycle_cost.py"


def test_counting_sees_the_statements_and_pages_then_restores_the_checkpoints(tmp_path: Path) -> None:
    """The counted cycles run with no checkpoint (the WAL only grows, so its growth is the pages written); the
    timed ones after them must run as the server runs, with its own checkpoint threshold and an empty WAL."""
    path = tmp_path / "count.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=123")
    db.execute("CREATE TABLE t (x TEXT)")
    with load("cycle_cost").counting(db, path) as counted:
        assert int(db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
        for i in range(40):
            db.execute("INSERT INTO t VALUES (?)", ("x" * 1000 + str(i),))
    assert counted.statements["INSERT"] == 40
    assert counted.wal_frames >= 10  # 40 KB of rows in 4 KB pages, each commit appending its own frames
    assert int(db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 123
    assert Path(f"{path}-wal").stat().st_size == 0
    db.close()


def _cycle_cost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), "--cycles", "20", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def test_split_times_the_statements_inside_the_handler(tmp_path: Path) -> None:
    run = _cycle_cost("--split", "--dir", str(tmp_path))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    lines = run.stdout.splitlines()
    results = json.loads(lines[-1])["results"]
    assert [r["server"] for r in results] == ["reference", "minimal"]
    for line, result in zip(lines[:2], results, strict=True):
        assert "SQL statements" in line
        # Every statement runs inside the handler, so its time is a part of the handler's, and there is some.
        assert 0 < result["sql_ms_per_cycle"] <= result["handler_ms_per_cycle"]


def test_without_split_no_statement_is_timed(tmp_path: Path) -> None:
    run = _cycle_cost("--server", "minimal", "--dir", str(tmp_path))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (result,) = json.loads(run.stdout.splitlines()[-1])["results"]
    assert result["sql_ms_per_cycle"] is None
    assert result["handler_ms_per_cycle"] > 0
    assert "SQL statements" not in run.stdout.splitlines()[0]
