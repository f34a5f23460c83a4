"""How a check's outcome becomes a verdict, and how the run ends when the target cannot be reached."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from suite.context import TargetInfo
from suite.outcomes import CheckFailure, HarnessError, NotCovered, Unimplemented, Verdict
from suite.plugin import EXIT_HARNESS_ERROR, _judge
from suite.registry import Check

TARGET = TargetInfo(url="http://127.0.0.1:9", cluster_info={})


async def _noop(ctx: object) -> None:
    return None


def _check(requirement: str, capability: str | None = None) -> Check:
    return Check("probe", _noop, (requirement,), capability, False, "doc")  # type: ignore[arg-type]


def test_must_failure_fails_and_should_failure_is_non_strict() -> None:
    failure = CheckFailure("broken", expected=1, received=2)
    assert _judge(_check("FENCE-OWNER"), failure, True, TARGET)[0] is Verdict.FAILED
    assert _judge(_check("ENVELOPE-ERROR-AND-MESSAGE"), failure, True, TARGET)[0] is Verdict.NON_STRICT


def test_failure_names_the_requirement_it_broke() -> None:
    check = Check("probe", _noop, ("FENCE-OWNER", "FENCE-NO-STATE-CHANGE"), None, False, "doc")  # type: ignore[arg-type]
    verdict, _, _, req = _judge(check, CheckFailure("x", requirement="FENCE-NO-STATE-CHANGE"), True, TARGET)
    assert (verdict, req) == (Verdict.FAILED, "FENCE-NO-STATE-CHANGE")


def test_optional_capability_not_advertised_is_unimplemented_or_informational() -> None:
    check = _check("FENCE-OWNER", capability="worker_sessions")
    assert _judge(check, CheckFailure("x"), False, TARGET)[0] is Verdict.UNIMPLEMENTED
    assert _judge(check, None, False, TARGET)[0] is Verdict.INFORMATIONAL
    assert _judge(check, CheckFailure("x"), True, TARGET)[0] is Verdict.FAILED  # advertised but broken
    assert _judge(check, None, True, TARGET)[0] is Verdict.PASSED


def test_harness_problems_are_never_the_targets_failure() -> None:
    assert _judge(_check("FENCE-OWNER"), HarnessError("timeout"), True, TARGET)[0] is Verdict.ERROR
    assert _judge(_check("FENCE-OWNER"), NotCovered("long lease"), True, TARGET)[0] is Verdict.NOT_COVERED
    assert _judge(_check("FENCE-OWNER"), Unimplemented("x"), True, TARGET)[0] is Verdict.UNIMPLEMENTED


def test_unreachable_target_is_one_line_and_a_distinct_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--target=http://127.0.0.1:1", "-p", "no:cacheprovider", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == EXIT_HARNESS_ERROR
    output = (proc.stdout + proc.stderr).strip().splitlines()
    assert any(line.startswith("Exit: harness error: cannot connect to http://127.0.0.1:1") for line in output)
    assert "Traceback" not in proc.stdout + proc.stderr
