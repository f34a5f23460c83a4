"""Named faults: each makes the reference server break exactly one protocol rule.

They exist to prove the conformance suite catches the bug (``--fault NAME``); a server started without
faults never takes a faulty branch. Each entry is the one-line description of the bug, and the code
that implements it checks ``fault(settings, NAME)`` at the one place the rule is enforced.
"""

from __future__ import annotations

from .config import Settings

__all__ = ["FAULTS", "fault"]

FAULTS: dict[str, str] = {
    "ignore-version-header": "Worker routes accept any X-Durable-Workflow-Protocol-Version, or none at all.",
    "drop-poll-status": "Workflow-task poll responses carry no poll_status field.",
    "accept-wrong-lease-owner": "Workflow-task heartbeat/complete/fail/history accept any lease_owner.",
    "history-page-gap": "Worker history pages after the first skip one event (a gap in the sequence).",
    "compress-below-threshold": "History is compressed on opt-in even when the page holds fewer than 50 events.",
}


def fault(settings: Settings, name: str) -> bool:
    """Whether the named fault is switched on. Unknown names are a programming error."""
    assert name in FAULTS, name
    return name in settings.faults
