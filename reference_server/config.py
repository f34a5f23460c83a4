"""Settings of one reference-server process. Every knob a test needs is here and advertised read-only
in ``GET /api/cluster/info`` under ``worker_protocol.test_profile`` (the test profile)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CLOCK_ADVANCE_PATH", "Settings"]

# The test clock's control route (control plane; see reference_server.routes.control.test_clock).
CLOCK_ADVANCE_PATH = "/api/test/clock/advance"


# Appendix C test-profile key → the setting it shows.
_TEST_PROFILE = {
    "workflow_task_lease_seconds": "lease_seconds",
    "activity_task_lease_seconds": "activity_lease_seconds",
    "query_task_timeout_seconds": "query_timeout_seconds",
    "query_task_lease_seconds": "query_lease_seconds",
    "long_poll_default_seconds": "long_poll_default_seconds",
    "long_poll_min_seconds": "long_poll_min_seconds",
    "long_poll_max_seconds": "long_poll_max_seconds",
    "max_active_leases_per_queue": "max_active_leases_per_queue",
    "stale_worker_seconds": "stale_worker_seconds",
    "cancellation_cleanup_seconds": "cancellation_cleanup_seconds",
    "heartbeat_interval_seconds": "heartbeat_interval_seconds",
}


@dataclass(frozen=True)
class Settings:
    db_path: str = "./dw.sqlite"
    # docs/reference.md: Expiry: workflow-task and activity leases default to 300 s; query-task leases to 60 s.
    lease_seconds: int = 300
    activity_lease_seconds: int = 300
    query_timeout_seconds: int = 30
    query_lease_seconds: int = 60
    # §7.2: the default long-poll hold, and the clamp bounds.
    long_poll_default_seconds: int = 30
    long_poll_min_seconds: int = 1
    long_poll_max_seconds: int = 60
    # Appendix C: an admission limit that yields poll_status "throttled" deterministically.
    max_active_leases_per_queue: int | None = None
    # §6.2: a worker is stale (no longer a query target) after this long without a heartbeat.
    stale_worker_seconds: int = 60
    # Cooperative cancellation (parent_close_policy request_cancellation): how long a child may clean up
    # before the server closes it. The seed names a deadline but no value.
    cancellation_cleanup_seconds: int = 60
    # §6.2: the worker heartbeat cadence a registration and a heartbeat answer ask for.
    heartbeat_interval_seconds: int = 30
    worker_token: str | None = None
    operator_token: str | None = None
    admin_token: str | None = None
    # §4.1's full-access token: one credential for every role on both planes (AUTH-FULL-ACCESS-TOKEN).
    auth_token: str | None = None
    # Upstream's rule for it: admin-only once role tokens exist (the worker plane answers it 403).
    auth_token_admin_beside_roles: bool = False
    event_log: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    # How long the background scheduler may sleep when nothing is due; due work is found by the
    # scheduler's own timer, so this only bounds the cost of a missed computation.
    scheduler_max_sleep_seconds: float = 1.0
    # A test build: ``POST /api/test/clock/advance`` moves the server's clock forward (reference_server.clock),
    # advertised in the test profile as ``clock_advance``. Off, the route does not exist.
    test_clock: bool = False

    @property
    def auth_enabled(self) -> bool:
        return any((self.worker_token, self.operator_token, self.admin_token, self.auth_token))

    def test_profile(self) -> dict[str, Any]:
        """The read-only view of the test-relevant settings (Appendix C)."""
        return {
            **{key: getattr(self, name) for key, name in _TEST_PROFILE.items()},
            "auth_enabled": self.auth_enabled,
            "matching_switch": "/api/task-queues/{queue}/matching",
            **({"clock_advance": CLOCK_ADVANCE_PATH} if self.test_clock else {}),
        }
