"""Legal choices never fail: the suite against the reference server behind each of its legal variations
(``python -m reference_server --variation NAME``, reference_server/variations/), which change only what the
protocol leaves to each server.

The whole suite runs once through the variations that fit together (an advertised default page size of its own,
never compressing), with the test clock, and must be CONFORMANT; every variation runs again, with and without
the test clock, with the checks of the requirements it bears on, which must all be judged and none failed. The
late answers of ``late-empty-polls`` cost every empty poll of a whole run 1.5 s, so its whole run is measured
in docs/variations.md rather than here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_server.variations import VARIATIONS
from suite.target import EMBEDDED_ARGS, REAL_TIME_ARGS
from tests.conftest import SuiteRun, run_suite
from tests.integration.scripted_server import scripted

ROLES = {"DW_WORKER_TOKEN": "vary-worker-1", "DW_OPERATOR_TOKEN": "vary-operator-1"}
TOKENS = ("--worker-token", ROLES["DW_WORKER_TOKEN"], "--operator-token", ROLES["DW_OPERATOR_TOKEN"])
# What a server may not have: a restart the suite cannot do (the whole run below gives it one), a full-access token.
OPTIONAL = {"unimplemented"}


def _judged_and_none_failed(run: SuiteRun, requirements: tuple[str, ...]) -> dict[str, str]:
    """Each requirement's verdict, where it is not a pass or a server's option it did not use."""
    return {r: v for r in requirements if (v := run.verdict(r)) != "passed" and v not in OPTIONAL}


@pytest.mark.whole_suite
def test_the_whole_suite_through_an_advertised_page_size_and_no_compression_is_conformant(tmp_path: Path) -> None:
    variations = ("small-default-page-size", "never-compress")
    args = [a for v in variations for a in ("--variation", v)]
    with scripted(tmp_path / "srv", *EMBEDDED_ARGS, *args, env=ROLES) as server:
        run = run_suite(server.url, tmp_path / "reports", *TOKENS, f"--restart-command={server.script}", timeout=900)
    assert run.returncode == 0, run.stdout[-4000:]
    assert any(line.startswith("CONFORMANT:") for line in run.stdout.splitlines()), run.stdout[-2000:]
    assert run.results is not None
    profile = run.results["target"]["test_profile"]
    assert profile.get("variations") == sorted(variations)  # the run judged the varied server, not another
    assert run.verdict("COMPRESSION-ROUNDTRIP") == "unimplemented"  # never compressing: the option, unused


@pytest.mark.slow
@pytest.mark.parametrize("clock", ["test-clock", "real-time"])
@pytest.mark.parametrize("variation", sorted(VARIATIONS))
def test_each_variation_passes_the_requirements_it_bears_on(tmp_path: Path, variation: str, clock: str) -> None:
    bears_on = VARIATIONS[variation].bears_on
    base = EMBEDDED_ARGS if clock == "test-clock" else REAL_TIME_ARGS
    selection = [a for r in bears_on for a in ("--requirement", r)]
    with scripted(tmp_path / "srv", *base, "--variation", variation, env=ROLES) as server:
        run = run_suite(server.url, tmp_path / "reports", *TOKENS, *selection, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    assert _judged_and_none_failed(run, bears_on) == {}, run.stdout[-3000:]
