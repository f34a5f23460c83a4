"""The worker-session machine's shadow of one session (what :mod:`suite.machines.sessions` and its sweep judge by)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from suite.protocol import sessions as model
from suite.protocol.sessions import SessionStatus, SessionView

__all__ = ["LEASE", "ShadowSession"]

LEASE = 3600  # seconds: the examples' sessions never lapse inside a run


@dataclass
class ShadowSession:
    session_id: str
    status: SessionStatus = SessionStatus.NONE
    owner: str | None = None
    allow_reacquire: bool = True
    unsure: bool = False  # an answer was lost: the machine no longer judges this session
    lease: int = LEASE  # the lease_seconds it is created with (a reacquisition keeps them)
    ttl: int | None = None  # the ttl_seconds it is created with (None: the default)
    lease_until: datetime | None = None  # None: far off (an hour-long lease nobody waits out)
    ttl_until: datetime | None = None
    holders: list[str] = field(default_factory=list)  # every worker that held it, in order
    ttl_closed: bool = False  # its absolute TTL closed it
    cancelled_activity: bool = False  # the run of one of its in-session activities was closed
    clock_cells: list[tuple[str, str]] = field(default_factory=list)  # clock events due, not yet shown by an answer

    @property
    def reacquired(self) -> bool:
        return len(self.holders) > 1

    def view(self) -> SessionView:
        return SessionView(self.status, self.owner, self.lease_until, self.ttl_until, self.allow_reacquire)

    def leased(self, now: datetime, seconds: int | None = None) -> None:
        """A lease granted or renewed at ``now`` (never past the absolute TTL); an hour-long one is never due."""
        seconds = self.lease if seconds is None else seconds
        if seconds >= LEASE and self.ttl is None:
            self.lease_until = None
            return
        self.lease_until = model.renewed_lease(now, seconds, self.ttl_until)
