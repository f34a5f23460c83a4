"""``bench/poll_complete.py`` in its default, interleaved form: both servers at once, blocks taken alternately.

What is checked is the measurement's shape, never its speed (tests/README.md): every block ran against the
server it names, each server did at least the cycles asked of it with no empty poll and no refused completion,
and the ratio of each pair of blocks is reported beside the totals. Bad settings are refused before a server
starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "poll_complete.py"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False
    )


@pytest.mark.slow
def test_the_interleaved_benchmark_measures_both_servers_block_by_block() -> None:
    run = _bench("--blocks", "4", "--cycles", "24", "--concurrency", "1,3", "--max-seconds", "30")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert [line.split(",")[0] for line in lines[:2]] == ["1 workers", "3 workers"]
    assert all("interleaved: reference " in line and "block by block median" in line for line in lines[:2])
    rows = json.loads(lines[-1])["interleaved"]
    assert [row["concurrency"] for row in rows] == [1, 3]
    for row in rows:
        assert row["blocks"] == 4
        assert len(row["block_ratios"]) == 4  # one ratio per pair of blocks
        assert all(ratio > 0 for ratio in row["block_ratios"])
        low, high = row["block_ratio_quartiles"]
        assert min(row["block_ratios"]) <= low <= row["block_ratio_median"] <= high <= max(row["block_ratios"])
        for kind in ("reference", "minimal"):
            # Four blocks of six cycles; with three workers a block may end up to two cycles over.
            assert 24 <= row[f"{kind}_cycles"] <= 24 + 4 * (row["concurrency"] - 1)
            assert row[f"{kind}_empty_polls"] == 0
            assert row[f"{kind}_rejected_completes"] == 0
            assert row[kind] > 0
            assert row[f"{kind}_server_cpu_ms_per_cycle"] > 0
        assert row["ratio"] == pytest.approx(row["reference"] / row["minimal"], abs=0.001)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--blocks", "1"), "--blocks must be 0 (rounds) or from 2 to --cycles"),
        (("--blocks", "30", "--cycles", "10"), "--blocks must be 0 (rounds) or from 2 to --cycles"),
        (("--blocks", "4", "--server", "reference"), "--blocks measures both servers"),
        (("--blocks", "4", "--db", "x.sqlite"), "--blocks measures both servers"),
        (("--minimal-burn-ms", "-0.5"), "--minimal-burn-ms must be a finite number >= 0"),
        (("--minimal-burn-ms", "nan"), "--minimal-burn-ms must be a finite number >= 0"),
        (("--minimal-burn-ms", "inf"), "--minimal-burn-ms must be a finite number >= 0"),
        (("--minimal-burn-ms", "1", "--server", "reference"), "--minimal-burn-ms changes the minimal server"),
        (("--minimal-answers", "none"), "argument --minimal-answers: invalid choice: 'none'"),
    ],
)
def test_bad_block_settings_are_refused_before_a_server_starts(args: tuple[str, ...], message: str) -> None:
    run = _bench(*args)
    assert run.returncode == 2
    assert run.stdout == ""
    assert message in run.stderr.splitlines()[-1]


@pytest.mark.slow
def test_a_calibration_burn_costs_the_minimal_server_its_cpu_and_says_so() -> None:
    """``--minimal-burn-ms`` (calibration, bench/RESULTS.md): the minimal server spends that much CPU in each poll
    that leases and each completion, and the run says it was calibrated, in its line and its JSON."""
    args = ("--blocks", "2", "--cycles", "20", "--concurrency", "1", "--max-seconds", "30")
    run = _bench(*args, "--minimal-burn-ms", "20")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    line, data = run.stdout.splitlines()[0], run.stdout.splitlines()[-1]
    assert "/ minimal (protocol answers, +20 ms CPU per request, calibration) " in line
    (row,) = json.loads(data)["interleaved"]
    assert row["minimal_burn_ms"] == 20.0
    # Process time, spent busy until it has passed: a floor by construction, not a timing. The benchmark reads the
    # server's CPU in clock ticks (10 ms) before and after each of its 2 blocks: at most 20 ms, 1 ms a cycle, lost.
    assert row["minimal_server_cpu_ms_per_cycle"] >= 2 * 20 - 1
    assert row["minimal_empty_polls"] == row["minimal_rejected_completes"] == 0


def test_without_a_burn_the_run_is_not_marked_calibrated() -> None:
    run = _bench("--blocks", "2", "--cycles", "4", "--concurrency", "1", "--max-seconds", "30")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "calibration" not in run.stdout.splitlines()[0]
    assert json.loads(run.stdout.splitlines()[-1])["interleaved"][0]["minimal_burn_ms"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(("answers", "label"), [("protocol", "minimal (protocol answers)"), ("bare", "minimal")])
def test_the_run_names_the_minimal_servers_answers(answers: str, label: str) -> None:
    run = _bench(
        "--blocks", "2", "--cycles", "4", "--concurrency", "1", "--max-seconds", "30", "--minimal-answers", answers
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"/ {label} " in run.stdout.splitlines()[0]
    (row,) = json.loads(run.stdout.splitlines()[-1])["interleaved"]
    assert row["minimal_answers"] == answers
    assert row["minimal_empty_polls"] == row["minimal_rejected_completes"] == 0


@pytest.mark.slow
def test_rounds_of_the_minimal_server_alone_answer_as_the_protocol_says() -> None:
    """Protocol answers copy the reference server's capabilities, from one started for that alone when the run
    measures the minimal server only."""
    run = _bench("--server", "minimal", "--blocks", "0", "--rounds", "1", "--cycles", "4", "--concurrency", "1")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    summary = json.loads(run.stdout.splitlines()[-1])["summary"]
    assert [row["minimal_answers"] for row in summary] == ["protocol"]
