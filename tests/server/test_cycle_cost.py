"""What one poll → complete cycle costs the reference server, counted, never timed.

The statements and transactions SQLite is asked for (``set_trace_callback``) and the virtual-machine steps it
runs (``set_progress_handler``), so a change that adds an fsynced transaction or a scheduler pass per request,
or makes a poll's cost grow with the backlog of its queue, shows up here. Speed itself is measured by
``bench/poll_complete.py``; that every committed change is still fsynced is pinned by the store's pragmas and
the ``kill -9`` tests of ``tests/integration``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from reference_server.app import Ctx
from reference_server.engine import open_workflow_task
from reference_server.http import json_bytes
from reference_server.polling import Poll
from reference_server.tx import T
from suite.protocol.codec import encode_blob
from suite.protocol.errors import Rejection
from tests.server.harness import Harness, HarnessFactory, TracedConnection, h, make, run_async

__all__ = ["h", "make"]  # the fixtures, re-exported so pytest finds them here


@contextmanager
def statements(h: Harness) -> Iterator[Counter[str]]:
    """Every statement the server sends SQLite meanwhile, counted by its first word (BEGIN counts the write
    transactions: the store begins every one IMMEDIATE)."""
    seen: Counter[str] = Counter()
    db = h.server.store.db
    h.server.store.db = TracedConnection(db, lambda sql: seen.update([sql.split(None, 1)[0].upper()]))  # type: ignore[assignment]
    try:
        yield seen
    finally:
        h.server.store.db = db
        db.set_trace_callback(None)


@contextmanager
def vm_steps(h: Harness) -> Iterator[list[int]]:
    """SQLite virtual-machine instructions run meanwhile (a deterministic measure of work, unlike time)."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # 0 = go on

    db = h.server.store.db
    db.set_progress_handler(count, 1)
    try:
        yield steps
    finally:
        db.set_progress_handler(None, 1)


def heartbeat_of(h: Harness, worker_id: str) -> int:
    row = h.rows("SELECT last_heartbeat_at FROM workers WHERE worker_id = ?", worker_id)[0]
    return int(row["last_heartbeat_at"])


def test_a_cycle_commits_two_transactions_and_the_poll_carries_the_workers_liveness(h: Harness) -> None:
    h.start("wf-1")
    h.register("w1")
    before = heartbeat_of(h, "w1")
    h.clock.advance(5)
    with statements(h) as seen:
        task = h.lease("w1")
    assert (seen["BEGIN"], seen["COMMIT"]) == (1, 1), seen
    assert heartbeat_of(h, "w1") == before + 5_000_000  # §6.2 liveness rode in the claim's transaction
    with statements(h) as seen:
        h.completed(task, {"type": "complete_workflow"})
    assert (seen["BEGIN"], seen["COMMIT"]) == (1, 1), seen


# The statements of the benchmark's cycle (bench/poll_complete.py: a poll that leases a run's first task, and a
# completion with complete_workflow), by request. Fewer is cheaper: each is a trip through the sqlite3 module and
# SQLite's virtual machine. 44 before the two-transaction cycle; 41 until the close probed its open work in one
# read, the claim and completion stopped re-reading rows they had read, a first lease stopped forgetting replays
# it cannot have, and a leased task was read with its run in one statement; 25 since an appended event moves its
# run's counter and reads the new value in one statement (UPDATE … RETURNING); 24 since a completion reads its run's
# open updates only when its batch closes one; 23 since the leased task's read also says whether its run has an
# open cancellation request (nearly none has, and the request is read only then).
POLL_STATEMENTS = {"SELECT": 5, "BEGIN": 1, "UPDATE": 2, "COMMIT": 1}
COMPLETE_STATEMENTS = {"BEGIN": 1, "SELECT": 7, "UPDATE": 3, "DELETE": 1, "INSERT": 1, "COMMIT": 1}


def test_a_cycle_runs_a_counted_set_of_statements(h: Harness) -> None:
    h.start("wf-1")
    h.register("w1")
    with statements(h) as seen:
        task = h.lease("w1")
    assert dict(seen) == POLL_STATEMENTS, seen
    with statements(h) as seen:
        h.completed(task, {"type": "complete_workflow", "result": encode_blob("done")})
    assert dict(seen) == COMPLETE_STATEMENTS, seen


def test_an_empty_poll_still_records_the_workers_liveness(h: Harness) -> None:
    h.register("w1")
    before = heartbeat_of(h, "w1")
    h.clock.advance(5)
    with statements(h) as seen:
        h.assert_empty("w1")
    assert (seen["BEGIN"], seen["COMMIT"]) == (1, 1), seen
    assert heartbeat_of(h, "w1") == before + 5_000_000


def test_a_claim_that_raises_still_records_the_workers_liveness(h: Harness) -> None:
    """The liveness is recorded alone when the claim's transaction rolls back, and the error is answered."""
    h.register("w1")
    h.start("wf-1")
    before = heartbeat_of(h, "w1")
    h.clock.advance(5)

    def broken_claim(t: T, poll: Poll) -> Any:
        t.db.execute("UPDATE workflow_tasks SET status = 'leased'")  # rolled back with the claim
        raise Rejection(409, "broken_claim", "A claim that fails.")

    request = h.build("POST", "/api/worker/workflow-tasks/poll")
    ctx = Ctx(request=request, params={}, namespace="default", body={"worker_id": "w1", "task_queue": "q"})
    with pytest.raises(Rejection, match="A claim that fails"):
        run_async(h.server.poller.serve(ctx, "workflow", broken_claim, lambda db, poll, now: None))
    assert heartbeat_of(h, "w1") == before + 5_000_000
    assert [r["status"] for r in h.rows("SELECT status FROM workflow_tasks")] == ["ready"]


def test_a_polls_cost_does_not_grow_with_the_backlog_of_its_queue(make: HarnessFactory) -> None:
    """A claim reads one page of the queue in index order: with 400 ready tasks it runs about the steps it runs
    with 20 (a claim that sorted every ready task of the queue first ran several times more)."""
    counted: list[int] = []
    for backlog in (20, 400):
        h = make(lease_seconds=60)
        h.register("w1")
        for i in range(backlog):
            h.start(f"wf-{i}")
            h.clock.advance(0.001)
        with vm_steps(h) as steps:
            h.lease("w1")
        counted.append(steps[0])
    small, large = counted
    assert large <= 1.1 * small, counted


WAIT = {"type": "start_timer", "delay_seconds": 3600}  # a batch that leaves the run waiting


def test_finding_a_runs_open_task_does_not_grow_with_the_tasks_it_had(make: HarnessFactory) -> None:
    """Every wake asks for its run's open task. The run's tasks are indexed by run alone (a status in the key is
    rewritten by every claim and completion), and the open one is the newest: a run that had 120 tasks is asked
    in about the steps of one that had 3, whether its newest task is open or not (scanning the run's tasks for an
    open one ran about ten times more)."""
    counted: list[tuple[int, int]] = []
    for tasks in (3, 120):
        h = make()
        h.register("w1")
        h.start("wf-1")
        for _ in range(tasks):
            h.completed(h.lease("w1"), WAIT)  # the run waits, its task completed
            h.signal("wf-1")  # a wake: the run's next task
        run_id = h.rows("SELECT run_id FROM runs")[0]["run_id"]
        assert len(h.rows("SELECT 1 FROM workflow_tasks WHERE run_id = ?", run_id)) == tasks + 1
        open_task = functools.partial(open_workflow_task, run_id=run_id)
        with vm_steps(h) as open_steps:
            assert h.server.run_tx(open_task) is not None
        h.completed(h.lease("w1"), WAIT)
        with vm_steps(h) as none_steps:
            assert h.server.run_tx(open_task) is None
        counted.append((open_steps[0], none_steps[0]))
    (small_open, small_none), (large_open, large_none) = counted
    assert large_open <= 1.1 * small_open, counted
    assert large_none <= 1.1 * small_none, counted


def test_a_claim_takes_the_oldest_ready_task_then_an_expired_lease_by_age(h: Harness) -> None:
    """The two candidate queries merge into the one order of §7.5: oldest first, ready or expired."""
    h.register("w1")
    first = h.start("wf-first")
    h.clock.advance(1)
    second = h.start("wf-second")
    stale = h.lease("w1")  # wf-first's task, leased for 60 s
    assert stale["run_id"] == first
    h.clock.advance(61)  # its lease expired: it is older than wf-second's ready task
    redelivered = h.lease("w1")
    assert (redelivered["run_id"], redelivered["workflow_task_attempt"]) == (first, 2)
    assert h.lease("w1")["run_id"] == second


def test_a_scheduler_pass_is_one_transaction(h: Harness) -> None:
    with statements(h) as seen:
        h.server.scheduler.run_steps()
    assert (seen["BEGIN"], seen["COMMIT"], seen["SAVEPOINT"]) == (1, 1, len(h.server.scheduler.steps)), seen


def test_a_failing_scheduler_step_is_rolled_back_alone(h: Harness) -> None:
    """All steps run in one transaction, each behind a savepoint: a step that raises leaves neither writes nor
    wake-ups behind, and the steps after it still commit theirs."""
    scheduler = h.server.scheduler

    def broken(t: T) -> float | None:
        t.db.execute("INSERT INTO namespaces (name, created_at) VALUES ('broken-step', 0)")
        t.fx.run_changed.add("broken-run")
        raise RuntimeError("a bad row")

    def fine(t: T) -> float | None:
        t.db.execute("INSERT INTO namespaces (name, created_at) VALUES ('fine-step', 0)")
        t.fx.run_changed.add("fine-run")
        return 7.0

    scheduler.steps[:0] = [broken, fine]
    published: list[set[str]] = []
    publish = h.server.publish

    def recording(t: T) -> None:
        published.append(set(t.fx.run_changed))
        publish(t)

    h.server.publish = recording  # type: ignore[method-assign]
    assert scheduler.run_steps() == pytest.approx(min(7.0, h.server.settings.scheduler_max_sleep_seconds))
    names = {r["name"] for r in h.rows("SELECT name FROM namespaces")}
    assert "fine-step" in names
    assert "broken-step" not in names
    assert published == [{"fine-run"}]


@pytest.mark.parametrize(
    "body",
    [
        {"task": None, "poll_status": "empty"},
        {"reason": "x", "protocol_version": "0.1"},  # a member of the envelope named by the body keeps its place
        {"server_capabilities": {}, "a": "✓"},
        {},
    ],
)
def test_the_worker_envelope_encoded_once_is_the_plain_encoding(h: Harness, body: dict[str, Any]) -> None:
    """The capabilities that close every worker-plane response are encoded once: the bytes are those of
    encoding the whole envelope each time."""
    app = h.server.app
    assert app.worker_json(body) == json_bytes(app.worker_envelope(body))
