"""The pure worker-session rules (suite.protocol.sessions): options, admission, expiry order, renewal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from suite.protocol import sessions as s
from suite.protocol.sessions import SessionEvent, SessionOptions, SessionStatus, SessionView, WorkerFacts

NOW = datetime(2026, 4, 18, 12, 0, tzinfo=UTC)


def worker(worker_id: str = "w1", *caps: str, held: int = 0, limit: int | None = None) -> WorkerFacts:
    return WorkerFacts(worker_id, "q", frozenset(caps), held, limit)


def view(status: SessionStatus, owner: str | None = "w1", *, allow: bool = True, lease: int = 60) -> SessionView:
    return SessionView(status, owner, NOW + timedelta(seconds=lease), NOW + timedelta(hours=1), allow)


OPTS = SessionOptions("s1")


def test_defaults_match_the_spec_and_the_sdk() -> None:
    options, errors = s.parse_options({"session_id": " s1 "}, "worker_session")
    assert errors == {}
    assert options == SessionOptions("s1")
    assert dict(s.DEFAULTS) == {
        "lease_seconds": 120,
        "ttl_seconds": 1800,
        "max_concurrent_activities": 1,
        "create_if_missing": True,
        "allow_reacquire_after_failure": True,
    }


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {},
        {"session_id": ""},
        {"session_id": "x" * 256},
        {"session_id": "s", "lease_seconds": 0},
        {"session_id": "s", "ttl_seconds": True},
        {"session_id": "s", "requirements": "gpu"},
        {"session_id": "s", "requirements": [""]},
        {"session_id": "s", "create_if_missing": "yes"},
    ],
)
def test_invalid_options(bad: object) -> None:
    options, errors = s.parse_options(bad, "p")
    assert options is None
    assert errors


@pytest.mark.parametrize(
    ("session", "asking", "outcome", "reason"),
    [
        (None, worker(), "created", None),
        (view(SessionStatus.ACTIVE), worker(), "reused", None),
        (view(SessionStatus.ACTIVE), worker("w2"), None, "session_owned_by_another_worker"),
        (view(SessionStatus.EXPIRED), worker("w2"), "reacquired", None),
        (view(SessionStatus.ORPHANED), worker("w2"), "reacquired", None),
        (view(SessionStatus.EXPIRED, allow=False), worker("w2"), None, "session_reacquire_disallowed"),
        (view(SessionStatus.FAILED), worker("w2"), None, "session_reacquire_disallowed"),
        (view(SessionStatus.CLOSED), worker(), None, "session_closed"),
        (None, None, None, "worker_not_registered"),
        (None, worker(held=1, limit=1), None, "worker_session_limit_exceeded"),
    ],
)
def test_admission(session: SessionView | None, asking: WorkerFacts | None, outcome: str, reason: str) -> None:
    decision = s.admit(session, OPTS, asking, explicit=True)
    assert (decision.outcome, decision.reason) == (outcome, reason)


def test_requirements_and_lazy_creation() -> None:
    needs = SessionOptions("s1", requirements=("gpu",))
    refused = s.admit(None, needs, worker(), explicit=False)
    assert (refused.reason, refused.fields) == ("session_requirements_not_met", {"missing_requirements": ["gpu"]})
    assert s.admit(None, needs, worker("w1", "gpu"), explicit=False).outcome == "created"
    lazy_off = SessionOptions("s1", create_if_missing=False)
    assert s.admit(None, lazy_off, worker(), explicit=False).reason == "session_missing"
    assert s.admit(None, lazy_off, worker(), explicit=True).outcome == "created"  # explicit create always creates


def test_queue_routing_first() -> None:
    refused = s.admit(None, SessionOptions("s1", queue="other"), worker(), explicit=True)
    assert refused.reason == "session_queue_mismatch"


def test_expiry_order_ttl_then_lease_then_holder() -> None:
    active = view(SessionStatus.ACTIVE, lease=10)
    assert s.due_event(active, NOW, holder_stale=False) is None
    assert s.due_event(active, NOW, holder_stale=True) == (SessionEvent.HOLDER_STALE, "worker_heartbeat_stale")
    later = NOW + timedelta(seconds=10)
    assert s.due_event(active, later, holder_stale=True) == (SessionEvent.LEASE_EXPIRE, "lease_expired")
    assert s.due_event(active, NOW + timedelta(hours=1), holder_stale=True) == (SessionEvent.TTL_EXPIRE, "ttl_expired")
    final = view(SessionStatus.ACTIVE, lease=10, allow=False)
    assert s.due_event(final, later, holder_stale=False) == (SessionEvent.FAIL, "lease_expired")
    assert s.due_event(view(SessionStatus.EXPIRED), later, holder_stale=True) is None


def test_renewal_never_passes_the_ttl() -> None:
    ttl = NOW + timedelta(seconds=30)
    assert s.renewed_lease(NOW, 600, ttl) == ttl
    assert s.renewed_lease(NOW, 10, ttl) == NOW + timedelta(seconds=10)


def test_heartbeat_and_close_decisions() -> None:
    active = view(SessionStatus.ACTIVE)
    assert s.heartbeat_decision(active, "w1").event is SessionEvent.RENEW
    assert s.heartbeat_decision(active, "w2").reason == "session_owner_mismatch"
    assert s.heartbeat_decision(view(SessionStatus.EXPIRED), "w1").reason == "session_not_active"
    assert s.heartbeat_decision(None, "w1").reason == "session_not_found"
    assert s.close_decision(view(SessionStatus.EXPIRED), "w1").event is SessionEvent.CLOSE
    assert s.close_decision(view(SessionStatus.CLOSED), "w2").outcome == "already_closed"
    assert s.close_decision(active, "w2").reason == "session_owner_mismatch"


def test_the_runtime_contract_names_the_lifecycle_statuses() -> None:
    wire = {status.value for status in SessionStatus} - {"none"}
    assert set(s.RUNTIME_CONTRACT["statuses"]) == wire
    assert s.RUNTIME_CONTRACT["verbs"] == list(s.SESSION_VERBS)
