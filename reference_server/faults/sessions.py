"""Faults of worker sessions: who may join, hold, renew and reacquire one, its expiry, and its activity limit."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from suite.protocol import sessions as model
from suite.protocol.sessions import Admission, SessionEvent, SessionOptions, SessionStatus, SessionView

from .. import sessions
from ..tx import T
from .patching import wraps

_Decided = tuple[Admission, sqlite3.Row | None]


@wraps("session-never-expires", sessions, "_settle")
def _never_settled(original: Callable[..., sqlite3.Row | None], t: T, row: sqlite3.Row | None) -> sqlite3.Row | None:
    return row  # a session whose lease lapsed stays active for its old holder


@wraps("session-ignores-requirements", sessions, "_decide")
def _requirements_unchecked(
    original: Callable[..., _Decided], t: T, namespace: str, options: SessionOptions, worker_id: str, **how: Any
) -> _Decided:
    decision, row = original(t, namespace, options, worker_id, **how)
    if decision.reason == "session_requirements_not_met":  # capabilities are not compared with the requirements
        facts = sessions._worker_facts(t, namespace, worker_id, options.session_id)
        decision = model.admit(sessions._view(row), options, facts, check_requirements=False, **how)
    return decision, row


@wraps("session-shared-lease", sessions, "_decide")
def _shared(original: Callable[..., _Decided], *args: Any, **how: Any) -> _Decided:
    decision, row = original(*args, **how)
    if decision.reason == "session_owned_by_another_worker":  # a second worker joins a held session
        decision = Admission(admitted=True, outcome="reused")
    return decision, row


@wraps("session-reacquire-ignores-policy", sessions, "_decide")
def _reacquired(original: Callable[..., _Decided], *args: Any, **how: Any) -> _Decided:
    decision, row = original(*args, **how)
    if decision.reason == "session_reacquire_disallowed":
        decision = Admission(admitted=True, outcome="reacquired", event=SessionEvent.REACQUIRE)
    return decision, row


@wraps("session-ignores-activity-limit", sessions, "admit_claim")
def _no_limit(
    original: Callable[..., Admission | None], t: T, worker: sqlite3.Row, task_id: str, queue: str
) -> Admission | None:
    decision = original(t, worker, task_id, queue)
    if decision is not None and decision.reason == "session_activity_limit_exceeded":
        linked = sessions._link(t, task_id)  # admitted as if the session had room
        assert linked is not None
        link, options = linked
        decision, _row = sessions._decide(
            t, link["namespace"], options, worker["worker_id"], explicit=False, queue=queue
        )
    return decision


@wraps("session-heartbeat-not-renewed", sessions, "renew_from_activity")
def _not_renewed(original: Callable[..., None], t: T, task_id: str, lease_owner: str) -> None:
    return None  # activity heartbeats leave the session lease to lapse


@wraps("session-expired-revived-by-activity-heartbeat", sessions, "renew_from_activity")
def _revived(original: Callable[..., None], t: T, task_id: str, lease_owner: str) -> None:
    """An activity heartbeat of the last holder of an expired session makes it active again, renewed, where only a
    reacquisition (by a create or a claim) brings an expired session back."""
    linked = sessions._link(t, task_id)
    if linked is not None:
        link, options = linked
        row = sessions._settle(t, sessions._row(t, link["namespace"], options.session_id))
        if row is not None and row["status"] == SessionStatus.EXPIRED.value and row["lease_owner"] == lease_owner:
            t.db.execute(
                "UPDATE worker_sessions SET status = ?, failure_reason = NULL, lease_expires_at = ?"
                " WHERE namespace = ? AND session_id = ?",
                (
                    SessionStatus.ACTIVE.value,
                    t.now + int(row["lease_seconds"]) * 1_000_000,
                    link["namespace"],
                    options.session_id,
                ),
            )
    original(t, task_id, lease_owner)


@wraps("session-stale-holder-renews", sessions, "renewal_decision")
def _stale_holder(original: Callable[..., Admission], view: SessionView | None, worker_id: str) -> Admission:
    decision = original(view, worker_id)
    if decision.reason == "session_owner_mismatch":
        decision = Admission(admitted=True, outcome="heartbeat_recorded", event=SessionEvent.RENEW)
    return decision


# Per session, the workers that held it before a reacquisition (the fault's own memory: the spec's store keeps
# only the holder).
_EARLIER: dict[tuple[str, str], set[str]] = {}


@wraps("session-former-holder-closes", sessions, "_apply")
def _remember_holders(
    original: Callable[..., sqlite3.Row], t: T, namespace: str, options: SessionOptions, worker_id: str, decision: Any
) -> sqlite3.Row:
    before = sessions._row(t, namespace, options.session_id)
    if decision.event is SessionEvent.REACQUIRE and before is not None and before["lease_owner"]:
        _EARLIER.setdefault((namespace, options.session_id), set()).add(before["lease_owner"])
    return original(t, namespace, options, worker_id, decision)


@wraps("session-former-holder-closes", sessions, "close_session")
def _former_closes(
    original: Callable[..., tuple[int, dict[str, Any]]],
    t: T,
    namespace: str,
    session_id: str,
    worker_id: str,
    reason: str,
) -> tuple[int, dict[str, Any]]:
    """A worker that held the session before another reacquired it still closes it (as if it were the holder)."""
    row = sessions._row(t, namespace, session_id)
    if row is not None and worker_id in _EARLIER.get((namespace, session_id), set()) and row["lease_owner"]:
        worker_id = row["lease_owner"]
    return original(t, namespace, session_id, worker_id, reason)


@wraps("session-reacquire-resets-ttl", sessions, "_apply")
def _ttl_restarted(
    original: Callable[..., sqlite3.Row], t: T, namespace: str, options: SessionOptions, worker_id: str, decision: Any
) -> sqlite3.Row:
    """A reacquisition starts the session's absolute TTL again, so it outlives the TTL it was created with."""
    row = original(t, namespace, options, worker_id, decision)
    if decision.event is SessionEvent.REACQUIRE:
        t.db.execute(
            "UPDATE worker_sessions SET ttl_expires_at = ? WHERE namespace = ? AND session_id = ?",
            (t.now + int(row["ttl_seconds"]) * 1_000_000, namespace, options.session_id),
        )
        row = sessions._row(t, namespace, options.session_id) or row
    return row


@wraps("session-holder-staleness-ignored", sessions, "heartbeats_stale")
def _never_stale(original: Callable[[T, int], bool], t: T, last_heartbeat_at: int) -> bool:
    return False  # a holder that stopped heartbeating keeps its session; only deregistration loses it
