"""The hand-written stateful sequence: start → register → poll → complete, each body drawn from its schema.

The document has no OpenAPI ``links`` for Schemathesis to follow, so the chaining is written here; an accepted
complete, repeated, must be fenced with 409 (FENCE-AFTER-COMPLETE) and change nothing."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Final

from hypothesis import strategies as st
from schemathesis import GenerationMode

from suite.context import TargetInfo
from suite.outcomes import HarnessError
from suite.worlds import READY_WITHIN

from .cases import SHORT_HOLD, CaseRunner, integral_floats_to_ints, pin_headers
from .document import load_schema, operations
from .judges import AFTER_COMPLETE
from .live import Lab, LiveWorld
from .operation import hypothesis_run
from .results import FuzzBudget, FuzzResult

__all__ = ["STATEFUL", "fuzz_stateful"]

STATEFUL: Final = "stateful_start_register_poll_complete"


def fuzz_stateful(target: TargetInfo, budget: FuzzBudget) -> FuzzResult:
    """start → register → poll → complete, each body drawn from its schema (the command batch too).

    The document has no OpenAPI links for Schemathesis to follow, so the chaining is written here: each
    example uses a fresh queue and workflow id; the drawn start, register and poll bodies keep their
    generated optional fields but get the ids that chain them; the complete carries a drawn command batch
    with the real fencing values. Every answer is judged by the fuzz checks; a rejected complete must leave
    the run unchanged, and an accepted one must be fenced (409) when repeated, again changing nothing.
    """
    result = FuzzResult(STATEFUL, fuzz_stateful.__doc__.splitlines()[0] if fuzz_stateful.__doc__ else STATEFUL)
    started = time.monotonic()
    lab = Lab(target, "fuzz-stateful")
    sequence = _StatefulSequence(lab, result, CaseRunner(target, result, lab))
    try:
        why = hypothesis_run(st.data(), max(1, budget.examples // 4), budget.seed_for(STATEFUL), sequence.run)
        if why:
            result.notes.append(why)
    except HarnessError as exc:
        result.error = f"harness error (not a conformance failure): {exc}"
    finally:
        result.stats["requests"] += lab.requests
        lab.close()
        result.duration = time.monotonic() - started
    return result


class _StatefulSequence:
    """One drawn start → register → poll → complete (and the repeated complete) per Hypothesis example."""

    STEPS = ("start_workflow", "register_worker", "poll_workflow_task", "complete_workflow_task")

    def __init__(self, lab: Lab, result: FuzzResult, runner: CaseRunner) -> None:
        self.lab, self.result, self.runner = lab, result, runner
        self.ops = operations()
        schema = load_schema()
        self.strategies = {
            name: schema.find_operation_by_id(name).as_strategy(
                GenerationMode.POSITIVE, headers=lab.headers(self.ops[name].plane)
            )
            for name in self.STEPS
        }

    def draw(self, data: st.DataObject, name: str) -> Any:
        case = data.draw(self.strategies[name], label=name)
        pin_headers(case, self.lab.headers(self.ops[name].plane))
        if isinstance(case.body, dict | list):
            case.body = integral_floats_to_ints(case.body)
        return case

    def run(self, data: st.DataObject) -> None:
        if self.runner.aborted:
            return
        self.result.stats["sequences"] += 1
        queue, worker, workflow_id = (self.lab.uid(prefix) for prefix in ("q", "w", "wf"))
        run_id = self.start(data, queue, workflow_id)
        if run_id is None or not self.register(data, queue, worker):
            return
        task = self.lease(data, queue, worker)
        if task is None:
            return
        self.complete_twice(data, LiveWorld("workflow", queue, worker, workflow_id, run_id, task=task), task)

    def start(self, data: st.DataObject, queue: str, workflow_id: str) -> str | None:
        start = self.draw(data, "start_workflow")
        if not isinstance(start.body, dict):
            return None
        start.body.update(workflow_id=workflow_id, task_queue=queue)
        # A drawn run or execution timeout could close the run before the poll: the sequence needs it open.
        for key in ("run_timeout_seconds", "execution_timeout_seconds", "workflow_execution_timeout_seconds"):
            start.body.pop(key, None)
        started_reply = self.runner.send(self.ops["start_workflow"], start)
        if started_reply is None or started_reply.status not in (200, 201):
            return None
        self.result.stats["started"] += 1
        return str((started_reply.body or {}).get("run_id", ""))

    def register(self, data: st.DataObject, queue: str, worker: str) -> bool:
        register = self.draw(data, "register_worker")
        if not isinstance(register.body, dict):
            return False
        register.body.update(worker_id=worker, task_queue=queue)
        for key in ("build_id", "supported_workflow_types"):
            register.body.pop(key, None)  # a drawn build id or type list could keep the run's task away
        reply = self.runner.send(self.ops["register_worker"], register)
        return reply is not None and reply.status in (200, 201)

    def lease(self, data: st.DataObject, queue: str, worker: str) -> dict[str, Any] | None:
        """Drawn polls as the sequence's worker until one leases the run's task (each poll a case, judged), for
        as long as a ready task may take to show up (:data:`suite.worlds.READY_WITHIN`, on the target's clock)."""
        deadline = self.lab.now() + timedelta(seconds=READY_WITHIN)
        while self.lab.now() < deadline:
            poll = self.draw(data, "poll_workflow_task")
            if not isinstance(poll.body, dict):
                return None
            poll.body.update(worker_id=worker, task_queue=queue, timeout_seconds=SHORT_HOLD)
            poll.body.pop("build_id", None)
            reply = self.runner.send(self.ops["poll_workflow_task"], poll)
            if reply is None or reply.status != 200:
                return None
            got = (reply.body or {}).get("task")
            if isinstance(got, dict):
                self.result.stats["leased"] += 1
                return got
        self.result.stats["never_leased"] += 1
        return None

    def complete_twice(self, data: st.DataObject, world: LiveWorld, task: dict[str, Any]) -> None:
        complete = self.draw(data, "complete_workflow_task")
        if not isinstance(complete.body, dict):
            return
        complete.path_parameters = {"task_id": str(task.get("task_id"))}
        complete.body.update(
            lease_owner=task.get("lease_owner", world.worker), workflow_task_attempt=task.get("workflow_task_attempt")
        )
        reply = self.runner.send(self.ops["complete_workflow_task"], complete, world)
        if reply is None or reply.status != 200:
            return
        self.result.stats["completed"] += 1
        # The same complete again is fenced: a task completes once (§8.9), and the refusal changes nothing.
        world.dirty = False
        again = self.runner.send(self.ops["complete_workflow_task"], complete, world)
        if again is not None:
            self.result.judged.add(AFTER_COMPLETE)
        if again is not None and again.status != 409:
            message = f"answered {again.status} to a second complete of workflow task {task.get('task_id')}"
            failure = again.failure("repeated_complete_is_fenced", message, AFTER_COMPLETE, "409 (no longer leased)")
            self.runner.result.fail(failure)
