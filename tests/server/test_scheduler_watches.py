"""The scheduler's watches (``reference_server.tx.Watch``): a commit wakes the scheduler only when it wrote work due
before the scheduler's next pass, and every write that can do so is watched.

Every harness of this directory checks the second half on every transaction (:class:`harness.SchedulerDues`:
work never comes due sooner than the scheduler was told). Here that check is shown to find a server without each
watch — the watch's triggers dropped, one watch at a time, under a scenario of this directory that needs it — and
every watch of the server has such a scenario. Then: a poll → complete cycle of a run without deadlines wakes no
pass, and a noted deadline moves the running scheduler's next pass only when it is earlier.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from reference_server.activities import TIMEOUT_WATCHES
from reference_server.closing import CLEANUP_DEADLINE_WATCHES
from reference_server.config import Settings
from reference_server.queries import DEADLINE_WATCHES
from reference_server.scheduler import NEVER, OWN_WATCHES, Scheduler
from reference_server.server import Server
from reference_server.sessions import DUE_WATCHES
from reference_server.tx import Watch
from tests.server import test_activities as activities
from tests.server import test_cooperative_cancellation as cancellation
from tests.server import test_lifecycle_rows as lifecycle_rows
from tests.server import test_test_clock as test_clock
from tests.server import test_workflow_semantics as semantics
from tests.server.harness import Harness, h, harnesses, make, run_async, until

__all__ = ["h", "make"]  # the fixtures, re-exported so pytest finds them here

UNSEEN = "no watch saw the write"


def drop(server: Server, watch: Watch) -> None:
    """Drop the TEMP triggers of ``watch`` from ``server``'s connection: the server without that watch."""
    db = server.store.db
    names = [
        name
        for name, sql in db.execute("SELECT name, sql FROM sqlite_temp_master WHERE type = 'trigger'")
        if f" ON main.{watch.table} " in sql and f"WHEN ({watch.when}) AND" in sql
    ]
    assert len(names) == 2, names  # after an insert, after an update
    for name in names:
        db.execute(f"DROP TRIGGER temp.{name}")


def timer_started(h: Harness) -> None:
    h.start("wf-1")
    h.register("w1")
    h.completed(h.lease("w1"), {"type": "start_timer", "delay_seconds": 5})


# Each watch, and a scenario that needs it: the seconds until due work shrink in one of its transactions.
Scenario = Callable[[Path, Watch], None]


def _with(
    build: Callable[[Path], Generator[Callable[..., Any], None, None]], run: Callable[[Callable[..., Any]], None]
) -> Scenario:
    def scenario(tmp_path: Path, watch: Watch) -> None:
        factories = build(tmp_path)
        factory = next(factories)

        def without_watch(**settings: Any) -> Any:
            harness = factory(**settings)
            drop(harness.server, watch)
            return harness

        try:
            run(without_watch)
        finally:
            factories.close()

    return scenario


def _plain(tmp_path: Path) -> Generator[Callable[..., Harness], None, None]:
    return harnesses(tmp_path, Harness)


def _activity(tmp_path: Path) -> Generator[Callable[..., activities.Harness], None, None]:
    return harnesses(tmp_path, activities.Harness)


SCENARIOS: dict[Watch, Scenario] = {
    OWN_WATCHES[0]: _with(_plain, lambda make: timer_started(make(lease_seconds=60))),
    OWN_WATCHES[1]: _with(_plain, semantics.test_a_failed_child_is_retried_after_its_backoff_up_to_max_attempts),
    OWN_WATCHES[2]: _with(
        _plain, lambda make: lifecycle_rows.test_a_run_times_out_in_every_live_state(make, "pending")
    ),
    TIMEOUT_WATCHES[0]: _with(
        _activity,
        lambda make: activities.test_schedule_to_close_is_terminal_even_with_attempts_left(
            make(activity_lease_seconds=60)
        ),
    ),
    TIMEOUT_WATCHES[1]: _with(
        _activity,
        lambda make: activities.test_schedule_to_start_timeout_is_terminal(make(activity_lease_seconds=60)),
    ),
    TIMEOUT_WATCHES[2]: _with(
        _activity,
        lambda make: activities.test_heartbeat_timeout_measures_the_gap_between_heartbeats(
            make(activity_lease_seconds=60)
        ),
    ),
    TIMEOUT_WATCHES[3]: _with(
        _activity,
        lambda make: activities.test_terminated_run_ignores_the_outcome_and_closes_the_activity(
            make(activity_lease_seconds=60)
        ),
    ),
    DEADLINE_WATCHES[0]: _with(_plain, test_clock.test_an_advance_times_out_a_waiting_query),
    DUE_WATCHES[0]: _with(
        _plain, lambda make: lifecycle_rows.test_a_session_without_its_holder_closes_at_its_ttl(make, "expired")
    ),
    CLEANUP_DEADLINE_WATCHES[0]: _with(_plain, cancellation.test_past_the_deadline_the_server_closes_the_child),
}


def test_every_watch_of_the_server_has_a_scenario(h: Harness) -> None:
    assert set(h.server.scheduler.watches) == set(SCENARIOS)
    assert len(h.server.scheduler.watches) == len(SCENARIOS)


@pytest.mark.parametrize("watch", SCENARIOS, ids=lambda w: f"{w.table}.{w.columns[-1]}")
def test_a_server_without_the_watch_fails_the_check(tmp_path: Path, watch: Watch) -> None:
    with pytest.raises(AssertionError, match=UNSEEN):
        SCENARIOS[watch](tmp_path, watch)


# -- what wakes the running scheduler -------------------------------------------------------------------------


def test_a_cycle_of_a_run_without_deadlines_notes_nothing_for_the_scheduler(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    noted: list[int] = []
    monkeypatch.setattr(h.server.scheduler, "note_due", noted.append)
    h.start("wf-1")
    h.register("w1")
    task = h.lease("w1")
    h.completed(task, {"type": "complete_workflow"})
    assert noted == []
    timer_started(h)  # the same calls with a deadline: noted
    assert len(noted) == 1


@pytest.mark.parametrize("sleep", [30.0, math.inf], ids=["30s", "endless"])
def test_a_noted_deadline_moves_the_next_pass_only_when_it_is_earlier(tmp_path: Path, sleep: float) -> None:
    now = [1_000_000_000]
    passes: list[int] = []

    def run_tx(step: Callable[[Any], float | None]) -> float:
        passes.append(now[0])
        return sleep  # nothing due for this long

    async def scenario() -> None:
        settings = Settings(db_path=str(tmp_path / "unused.sqlite"), scheduler_max_sleep_seconds=sleep)
        scheduler = Scheduler(settings, run_tx, lambda: now[0])
        planned = NEVER if sleep == math.inf else now[0] + 30_000_000
        scheduler.start()
        try:
            await until(lambda: len(passes) == 1)
            assert scheduler.next_pass_us == planned
            scheduler.note_due(planned + 10_000_000 if sleep != math.inf else NEVER)  # not earlier: no change
            assert scheduler.next_pass_us == planned
            scheduler.note_due(now[0] + 5_000_000)  # earlier: the next pass comes after the settle
            assert scheduler.next_pass_us == now[0] + 5_000_000
            await until(lambda: len(passes) == 2)
        finally:
            await scheduler.stop()

    run_async(scenario())
