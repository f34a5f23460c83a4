"""The fuzz groups: the document's operations in groups of one pytest item each (``dw::fuzz::<group>``), every
operation in one, what each group may judge, and fuzzing a group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from suite.context import TargetInfo
from suite.registry import response_checks

from .document import operations
from .judges import AFTER_COMPLETE, NO_CHANGE
from .operation import fuzz_operation
from .results import FuzzBudget, FuzzResult
from .stateful import STATEFUL, fuzz_stateful

__all__ = ["GROUPS", "all_groups", "fuzz_group", "group_members", "group_requirements"]

GROUPS: Final[dict[str, tuple[str, ...]]] = {
    "worker-registration": ("register_worker", "heartbeat_worker", "deregister_worker"),
    "workflow-tasks": (
        "poll_workflow_task",
        "fetch_workflow_task_history",
        "heartbeat_workflow_task",
        "complete_workflow_task",
        "fail_workflow_task",
        "deliver_workflow_task_cancellation",
    ),
    "activity-tasks": (
        "poll_activity_task",
        "complete_activity_task",
        "fail_activity_task",
        "heartbeat_activity_task",
        "get_activity_task_status",
    ),
    "query-tasks": ("poll_query_task", "complete_query_task", "fail_query_task"),
    "workflows": (
        "start_workflow",
        "describe_workflow",
        "list_workflow_runs",
        "describe_workflow_run",
        "get_workflow_run_history",
    ),
    "workflow-commands": (
        "signal_workflow",
        "signal_workflow_run",
        "query_workflow",
        "query_workflow_run",
        "update_workflow",
        "update_workflow_run",
        "cancel_workflow",
        "cancel_workflow_run",
        "request_workflow_cancellation",
        "request_workflow_run_cancellation",
        "terminate_workflow",
        "terminate_workflow_run",
    ),
    "worker-sessions": (
        "create_worker_session",
        "heartbeat_worker_session",
        "close_worker_session",
        "list_worker_sessions",
        "describe_worker_session",
    ),
    "task-queues-and-discovery": ("drain_build_id", "resume_build_id", "get_cluster_info", "get_health", "get_ready"),
    "stateful": (STATEFUL,),
}


def _with_unlisted(groups: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Every operation of the document is fuzzed: one the table does not list goes to ``other``."""
    listed = {name for names in groups.values() for name in names}
    rest = tuple(sorted(set(operations()) - listed))
    return {**groups, "other": rest} if rest else dict(groups)


def group_members(group: str) -> tuple[str, ...]:
    return _with_unlisted(GROUPS).get(group, ())


def group_requirements(group: str) -> tuple[str, ...]:
    """The requirement IDs a group's item may judge (what ``--requirement`` selects it by): those of the registered
    response checks, the no-change comparison's, and for the stateful sequence the repeated complete's."""
    judged = [r for registered in response_checks() for r in registered.requirements]
    judged += [NO_CHANGE, AFTER_COMPLETE] if STATEFUL in group_members(group) else [NO_CHANGE]
    return tuple(dict.fromkeys(judged))


def all_groups() -> list[str]:
    return list(_with_unlisted(GROUPS))


def fuzz_group(target: TargetInfo, group: str, budget: FuzzBudget) -> Iterator[FuzzResult]:
    """Fuzz every operation of ``group`` in turn."""
    for name in group_members(group):
        if name == STATEFUL:
            yield fuzz_stateful(target, budget)
        else:
            yield fuzz_operation(target, name, budget)
