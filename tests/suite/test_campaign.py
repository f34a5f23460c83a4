"""Campaigns and the shared example database, against a real ``redis-server`` each test starts on a Unix socket of
its own (no port to collide on) and a reference server (with a named fault where a failure is wanted)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from suite.campaign import (
    HYPOTHESIS_PREFIX,
    KeyedDatabase,
    ReplayStore,
    check_program,
    open_store,
    parse_duration,
    parse_worker,
    target_identity,
    worker_seed,
)
from suite.processes import start_redis
from suite.target import EMBEDDED_ARGS
from tests.conftest import ServerProcess, run_suite
from tests.suite.runs import UNREACHABLE, pytest_cli

redis = pytest.importorskip("redis", reason="the campaign tests need hypothesis[redis]")

MACHINE = "dw::machine::workflow_leases"
SMALL = ("--machine-examples", "8", "--machine-steps", "20")


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own, on a Unix socket in its temporary directory."""
    folder = tmp_path / "redis"
    folder.mkdir()
    try:
        proc, url = start_redis(folder)
    except RuntimeError as exc:
        pytest.fail(f"{exc} (.ci/run installs it)")
    yield url
    proc.terminate()
    proc.wait(10)


def test_durations_workers_and_seeds() -> None:
    assert parse_duration("20s") == 20
    assert parse_duration("10m") == 600
    assert parse_duration("2h") == 7200
    assert parse_duration("90") == 90
    assert parse_duration("0s") is None
    assert parse_duration("ten") is None
    assert parse_duration("8d") is None
    assert parse_worker("1/2", {}) == (1, 2)
    assert parse_worker(None, {"JOB_COMPLETION_INDEX": "3"}) == (3, None)
    assert parse_worker(None, {}) == (0, None)
    assert parse_worker("2/2", {}) is None
    assert parse_worker("a/b", {}) is None
    seeds = {worker_seed(7, w, r) for w in range(4) for r in range(4)}
    assert len(seeds) == 16  # every worker's every round draws its own sequences


def test_target_identity_separates_servers() -> None:
    info = {"server_name": "acme", "version": "1"}
    assert target_identity(info, "http://a:1", False) != target_identity(info, "http://b:1", False)
    assert target_identity(info, "http://a:1", True) == target_identity(info, "http://b:2", True)
    assert target_identity(info, "http://a:1", False, "acme/staging") == "acme_staging"


def test_a_stored_program_is_only_ever_rule_calls() -> None:
    good = "state = M()\nstate.setup()\nruns_0 = state.start()\nstate.poll(worker=0, task=runs_0)\n"
    check_program(good, "M")
    for bad in (
        "import os\n",
        "state = M()\nos.system('x')\n",
        "state = M()\nstate.poll(worker=__import__('os'))\n",
        "state = M()\nstate.__class__()\n",
        "state = N()\n",
    ):
        with pytest.raises(ValueError, match=r"line|not a step|must start"):
            check_program(bad, "M")


def test_one_targets_pass_never_erases_anothers_failure(redis_url: str) -> None:
    """Hypothesis deletes an example that no longer fails; with the target in the key, that is the target's own."""
    store = open_store(redis_url, readonly=False)
    a = store.for_machine("build", "target-a", "m")
    b = store.for_machine("build", "target-b", "m")
    a.save(b"key", b"failing")
    b.save(b"key", b"failing")
    b.delete(b"key", b"failing")  # target b passes now
    assert list(a.fetch(b"key")) == [b"failing"]
    assert list(b.fetch(b"key")) == []
    reader = open_store(redis_url, readonly=True).for_machine("build", "target-a", "m")
    reader.delete(b"key", b"failing")  # a read-only run never removes anything
    assert list(a.fetch(b"key")) == [b"failing"]
    assert isinstance(a, KeyedDatabase)


def test_replays_live_in_redis_and_in_a_directory(redis_url: str, tmp_path: Path) -> None:
    for store in (ReplayStore(redis=redis.Redis.from_url(redis_url)), ReplayStore(directory=tmp_path)):
        digest = store.save("t", "m", {"steps": "state = M()\n"})
        assert [e["id"] for e in store.entries("t", "m")] == [digest]
        assert store.entries("other", "m") == []
        store.remove("t", "m", digest)
        assert store.entries("t", "m") == []


def test_the_machines_a_database_holds_failures_of_run_first(redis_url: str, tmp_path: Path) -> None:
    """A run given a database runs the machines it holds failures of before everything else, so a CI job
    replaying what campaigns found fails in its first seconds; the other items keep their order."""
    from types import SimpleNamespace

    from suite.context import TargetInfo
    from suite.registry import entries
    from suite.run import stored_failure_machines, stored_failures_first
    from suite.settings import DEFAULT_BUDGET, RunSettings

    settings = RunSettings(
        "http://server", "default", "1.20", str(tmp_path), DEFAULT_BUDGET, True, False, False,
        example_db=redis_url, example_db_target="acme",
    )  # fmt: skip
    target = TargetInfo(url="http://server", cluster_info={})
    assert stored_failure_machines(target, settings) == []
    ReplayStore(redis=redis.Redis.from_url(redis_url)).save("acme", "activities", {"steps": "state = M()\n"})
    ReplayStore(redis=redis.Redis.from_url(redis_url)).save("other", "workflow_leases", {"steps": "state = M()\n"})
    assert stored_failure_machines(target, settings) == ["activities"]
    items: list[Any] = [SimpleNamespace(entry=e) for e in entries()]
    ordered = stored_failures_first(items, ["activities"])
    assert ordered[0].entry.test_id == "dw::machine::activities"
    assert ordered[1:] == [i for i in items if i is not ordered[0]]
    assert stored_failures_first(items, []) == items


def test_unreachable_redis_is_a_usage_error_before_the_first_request(tmp_path: Path) -> None:
    cli = pytest_cli(tmp_path, f"--target={UNREACHABLE}", "--example-db", f"unix://{tmp_path}/no-such.sock")
    assert cli.returncode == 4, cli.output
    errors = [line for line in cli.output.splitlines() if "--example-db" in line]
    assert len(errors) == 1, cli.output
    assert "Redis is not reachable" in errors[0]
    cli = pytest_cli(tmp_path, f"--target={UNREACHABLE}", "--campaign", "ten")
    assert cli.returncode == 4
    assert "--campaign=ten" in cli.output
    cli = pytest_cli(tmp_path, f"--target={UNREACHABLE}", "--campaign-worker", "2/2")
    assert cli.returncode == 4
    assert "--campaign-worker=2/2" in cli.output
    cli = pytest_cli(tmp_path, f"--target={UNREACHABLE}", "--example-db-readonly")
    assert cli.returncode == 4
    assert "--example-db-readonly" in cli.output


def _campaign(url: str, tmp_path: Path, name: str, *args: str) -> Any:
    report = tmp_path / name
    report.mkdir()
    return run_suite(url, report, MACHINE, *SMALL, *args, timeout=300)


@pytest.mark.slow
def test_a_campaign_runs_rounds_until_its_budget_and_says_how_it_went(
    server_factory: Callable[..., ServerProcess], redis_url: str, tmp_path: Path
) -> None:
    server = server_factory(*EMBEDDED_ARGS)
    run = _campaign(
        server.url, tmp_path, "c", "--campaign", "4s", "--campaign-progress", "1", "--example-db", redis_url
    )
    assert run.results is not None, run.stdout[-3000:]
    assert run.results["summary"]["failed"] == 0, run.stdout[-3000:]
    campaign = run.results["campaign"]
    machine = campaign["machines"]["workflow_leases"]
    assert machine["rounds"] >= 1, campaign
    assert machine["seconds"] >= 4  # rounds until the whole budget was spent  # more than one round, the whole budget
    assert campaign["requests"] > 0
    assert campaign["examples"] >= 2 * machine["rounds"]
    assert "[dw] campaign " in run.stdout
    assert "hard states of workflow_leases reached" in run.stdout
    assert "coverage cells and" in run.stdout
    assert "campaign (worker 0, seed " in run.stdout


@pytest.mark.slow
def test_a_failure_one_worker_found_is_replayed_by_a_read_only_run(
    server_factory: Callable[..., ServerProcess], redis_url: str, tmp_path: Path
) -> None:
    """Worker 0 of two finds the fault and stores its program; a later read-only run fails on the replay at once,
    and the same program against a correct server is reported fixed (and, written, removed)."""
    faulty = server_factory(*EMBEDDED_ARGS, "--fault", "accept-stale-attempt")
    found = _campaign(
        faulty.url,
        tmp_path,
        "found",
        "--campaign",
        "30s",
        "--campaign-worker",
        "0/2",
        "--example-db",
        redis_url,
        "--example-db-target",
        "acme",
    )
    assert found.returncode == 1, found.stdout[-3000:]
    assert found.verdict("FENCE-ATTEMPT") == "failed"
    stored = ReplayStore(redis=redis.Redis.from_url(redis_url)).entries("acme", "workflow_leases")
    assert len(stored) == 1
    assert stored[0]["worker"] == 0
    assert stored[0]["requirement"] == "FENCE-ATTEMPT"
    # Hypothesis' own example database holds the failing example too (keyed by build, target and machine).
    keys = [k for k in redis.Redis.from_url(redis_url).keys("*") if k.startswith(HYPOTHESIS_PREFIX)]
    assert any(b":acme:workflow_leases:" in k for k in keys), keys

    started = time.monotonic()
    ci = _campaign(
        faulty.url, tmp_path, "ci", "--example-db", redis_url, "--example-db-readonly", "--example-db-target", "acme"
    )
    assert ci.returncode == 1, ci.stdout[-3000:]
    assert ci.verdict("FENCE-ATTEMPT") == "failed"
    assert time.monotonic() - started < 60
    assert "replaying a stored failure" in ci.stdout
    assert "still fails on replay" in ci.stdout
    assert ci.results is not None
    assert ci.results["campaign"]["still_failing"] == 1
    failed = [c for c in ci.results["checks"] if c["verdict"] == "failed"]
    assert failed
    assert Path(failed[0]["replay"], "replay.py").read_text(encoding="utf-8").count("state.") >= 3

    correct = server_factory(*EMBEDDED_ARGS)
    fixed = _campaign(correct.url, tmp_path, "fixed", "--example-db", redis_url, "--example-db-target", "acme")
    assert fixed.results is not None
    assert fixed.results["campaign"]["fixed"] == 1, fixed.stdout[-3000:]
    assert "no longer fails: fixed" in fixed.stdout
    assert ReplayStore(redis=redis.Redis.from_url(redis_url)).entries("acme", "workflow_leases") == []
    assert json.dumps(fixed.results["campaign"])  # the statistics are part of results.json


def test_a_replay_is_fixed_only_when_it_went_the_failures_way() -> None:
    from suite.machines.runner import replay_outcome
    from suite.outcomes import CheckFailure

    stored = ["a", "b"]
    violation = CheckFailure("x", requirement="FENCE-ATTEMPT")
    assert replay_outcome(violation, violation, stored, ["z"]) == ("failing", "")  # a violation, whatever the path
    assert replay_outcome(None, None, stored, ["a", "b", "c"]) == ("fixed", "")
    outcome, reason = replay_outcome(None, None, stored, ["a", "c", "b"])
    assert outcome == "unreplayable"
    assert reason == "the replay took another path at its 2nd cell (c, stored: b)"
    outcome, reason = replay_outcome(None, None, stored, ["a"])
    assert (outcome, reason) == ("unreplayable", "the replay ended after 1 of the 2 cells the failure went through")
    outcome, reason = replay_outcome(ValueError("not enough values to unpack"), None, stored, ["a"])
    assert outcome == "unreplayable"
    assert "ValueError: not enough values to unpack" in reason


@pytest.mark.slow
def test_a_replay_that_went_another_way_is_kept_and_never_reported_fixed(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Two stored failures whose replays do not go the way they went when found: one's poll leases nothing (its
    program cannot go on), the other runs through along another path than the one stored. Neither is fixed."""
    db = tmp_path / "db"
    store = ReplayStore(directory=db)
    prefix = "state = WorkflowLeaseMachine()\nstate.setup()\n"
    nothing = store.save("acme", "workflow_leases", {"steps": prefix + "(tasks_0,) = state.poll(worker=0)\n"})
    steps = prefix + "runs_0 = state.start()\n(tasks_0,) = state.poll(worker=0)\n"
    elsewhere = store.save("acme", "workflow_leases", {"steps": steps, "path": ["a cell this server never reaches"]})
    server = server_factory(*EMBEDDED_ARGS)
    report = tmp_path / "r"
    report.mkdir()
    run = run_suite(
        server.url, report, MACHINE, "--machine-examples", "1", "--machine-steps", "5",
        "--example-db", str(db), "--example-db-target", "acme", timeout=300,
    )  # fmt: skip
    assert run.results is not None, run.stdout[-3000:]
    campaign = run.results["campaign"]
    assert (campaign["fixed"], campaign["still_failing"], campaign["unreplayable"]) == (0, 0, 2), campaign
    assert "could not be replayed: the replay stopped at ValueError" in run.stdout
    assert "could not be replayed: the replay took another path at its 1st cell" in run.stdout
    assert "no longer fails" not in run.stdout
    assert sorted(e["id"] for e in store.entries("acme", "workflow_leases")) == sorted([nothing, elsewhere])


@pytest.mark.slow
def test_a_failure_whose_replay_met_other_faults_is_stored_as_it_ran(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Through network faults Hypothesis' replay of a failing example meets other faults and reports no minimal
    program; the program that raised the failure, recorded while it ran, is stored in its place. (This is also
    the accept-wrong-lease-owner case of tests/suite/test_machine_mutants.py's network-fault test.)"""
    server = server_factory(*EMBEDDED_ARGS, "--fault", "accept-wrong-lease-owner")
    db = tmp_path / "db"
    report = tmp_path / "r"
    report.mkdir()
    run = run_suite(
        server.url, report, MACHINE, "--machine-examples", "64", "--faults", "standard", "--fault-seed", "1",
        "--example-db", str(db), "--example-db-target", "acme", timeout=300,
        env={"DW_CONFORMANCE_SEED": "20261129"},
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:]
    assert run.verdict("FENCE-OWNER") == "failed"  # the machine still finds the bug through the faults
    [entry] = ReplayStore(directory=db).entries("acme", "workflow_leases")
    assert entry["shrunk"] is False, entry
    assert "Failing step program, as it ran (not shrunk):" in run.stdout  # never called minimal
    check_program(entry["steps"], "WorkflowLeaseMachine")
    assert entry["steps"].count("\nstate.") + entry["steps"].count(" = state.") >= 3
    assert "teardown" not in entry["steps"]  # a replay tears its machine down itself
    assert entry["path"], entry
