"""The query, signal and update machine's sweep: a deterministic phase after its examples over the update cells
(:mod:`suite.protocol.coverage`) the examples left cold.

The sweep brings one update into each state with cold cells — accepted and open, completed or failed by a
workflow task, left open when its run was cancelled (rejected) — on a run of its own, and makes each cold call
there: a workflow-task complete closing it (``complete_update`` or ``fail_update``) by the holder of the run's
task and by a worker that does not hold it, the operator's read of the run's history, and the operator closing
the run. For a closed update the holder is the holder of a task a signal woke after the update closed. Calls
that leave the update as it is come first; one that changes it (the holder closing it while open, the run's
close) ends its instance. Every call goes through the machine's own steps, so the workflow-task model judges
every answer and the history oracle every history read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from suite.protocol.coverage import Actor

from .cells import Plan, plan_cold_cells

# The machine is suite.machines.queries_signals', which imports this module: typed loosely so they do not
# import each other.
QuerySignalMachine = Any
RunM = Any

__all__ = ["cold_plan", "sweep_cold_cells"]

ORDER = ("describe", "complete_update", "fail_update", "close_run")
SWEPT_STATES = ("accepted", "completed", "failed", "rejected")


def _changes(state: str, operation: str, actor: Actor) -> bool:
    if operation == "close_run":
        return state != "rejected"
    return state == "accepted" and actor is Actor.HOLDER


def cold_plan(hits: Mapping[str, int]) -> Plan:
    """Per state, the instances to make: each a list of (operation, actor), the one call that changes the
    update (if any) last."""
    return plan_cold_cells("update", SWEPT_STATES, ORDER, _changes, hits, holder_last=True)


@dataclass(eq=False)
class Instance:
    state: str
    calls: list[tuple[str, Actor]]
    run: RunM
    update_id: str | None = None


def sweep_cold_cells(m: QuerySignalMachine) -> None:
    for state, instances in cold_plan(m.cells).items():
        for calls in instances:
            inst = m.sweep_start(lambda s=state, c=calls: _start(m, s, c))
            if inst is not None:
                _act(m, inst)
            m.histories_are_sound()


def _lease(m: QuerySignalMachine, run: RunM, why: str) -> Any:
    task = m.lease_run_task(run, why)
    return task if task is not None and task.run is run and not run.uncertain else None


def _start(m: QuerySignalMachine, state: str, calls: list[tuple[str, Actor]]) -> Instance | None:
    """A fresh run, its first task leased, one update accepted on it, then brought into ``state``."""
    run = m.new_run()
    task = _lease(m, run, "start")
    if task is None:
        return None
    before = set(run.open_updates)
    m.update_accepted(run)
    new = set(run.open_updates) - before
    if not new or run.uncertain:
        return None
    inst = Instance(state, calls, run, next(iter(new)))
    uid = inst.update_id
    if state in ("completed", "failed"):
        verb = "complete_update" if state == "completed" else "fail_update"
        close: dict[str, Any] = {"type": verb, "update_id": uid}
        close.update({"result": m.ctx.envelope(uid)} if verb == "complete_update" else {"message": "sweep"})
        timer = {"type": "start_timer", "delay_seconds": 3600}
        if m.complete(task, [timer, close], {uid}, False, f"sweep {verb}") != "ok":
            return None
        m.signal(run, 1)  # a task for the holder of the calls that follow
        if _lease(m, run, "signal") is None:
            return None
    elif state == "rejected":
        m.close_run(run, "cancel")
    return inst


def _act(m: QuerySignalMachine, inst: Instance) -> None:
    run, uid = inst.run, inst.update_id
    for operation, actor in inst.calls:
        if run.uncertain:
            return
        if operation == "describe":
            m.touched.add(run.run_id)
            m.histories_are_sound()
        elif operation == "close_run":
            m.close_run(run, "cancel")
        else:
            task = run.task
            if task is None:
                return
            command: dict[str, Any] = {"type": operation, "update_id": uid}
            command.update({"result": m.ctx.envelope(uid)} if operation == "complete_update" else {"message": "x"})
            closes = {uid} if inst.state == "accepted" and actor is Actor.HOLDER else set()
            invalid = inst.state != "accepted" and actor is Actor.HOLDER and run.open
            owner = task.owner if actor is Actor.HOLDER else next(w for w in m.workers if w != task.owner)
            m.complete(task, [command], closes, invalid, f"sweep {operation}", owner=owner)
