"""Payload shapes both sides share: the resume context every leased workflow task carries (docs/reference.md: Payload
shape)."""

from __future__ import annotations

from typing import Final

__all__ = ["RESUME_CONTEXT_KEYS"]

# §8.3: "All 20 keys are **always present**, with `null` when they do not apply."
RESUME_CONTEXT_KEYS: Final[tuple[str, ...]] = (
    "workflow_wait_kind",
    "open_wait_id",
    "resume_source_kind",
    "resume_source_id",
    "workflow_update_id",
    "workflow_signal_id",
    "signal_name",
    "signal_wait_id",
    "workflow_command_id",
    "activity_execution_id",
    "activity_attempt_id",
    "activity_type",
    "child_call_id",
    "child_workflow_run_id",
    "timer_id",
    "condition_wait_id",
    "condition_key",
    "condition_definition_fingerprint",
    "workflow_sequence",
    "workflow_event_type",
)
