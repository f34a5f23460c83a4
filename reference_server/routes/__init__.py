"""The HTTP surface of the reference server, grouped by plane and resource.

Each module holds one ``Routes`` group: a frozen dataclass of the small interfaces it needs
(:mod:`reference_server.ports`, and :class:`reference_server.polling.Polls` for polls), never the whole
server, whose methods are marked with :func:`reference_server.app.route`; the server mounts each group on its
plane (:meth:`reference_server.app.App.mount`). Route functions validate the request and call the domain
modules, which own every state change.

=====================================  ===========================================================
``open``                               health, readiness and ``cluster/info`` (no version headers)
``worker.registrations``               register, heartbeat, deregister (§6)
``worker.workflow_tasks``              poll, history, heartbeat, complete, fail (§7, §8)
``worker.activity_tasks``              poll, complete, fail, heartbeat, status (§11)
``worker.query_tasks``                 poll, complete, fail (§10)
``worker.sessions``                    worker sessions: create, heartbeat, close (§1.1, A.2)
``worker.cancellation``                commit a cooperative cancellation's delivery (request_cancellation)
``control.workflows``                  start, describe, runs, history, cancel, terminate (§12)
``control.messages``                   signal, update and query of a run (§12.2, §10.1)
``control.task_queues``                build-id drain and resume, the matching switch (Appendix C)
``control.worker_sessions``            operator visibility of worker sessions (A.2 visibility)
=====================================  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from ..polling import Polls
from ..ports import Core, Waits

__all__ = ["CoreRoutes", "PollRoutes", "WaitRoutes"]


@dataclass(frozen=True)
class CoreRoutes:
    """A group that needs transactions and reads only."""

    core: Core


@dataclass(frozen=True)
class WaitRoutes:
    """A group whose calls may hold the request until durable state changes (or that wakes those that do)."""

    core: Waits


@dataclass(frozen=True)
class PollRoutes:
    """A worker-plane group that serves a poll: transactions and reads, and the poll path."""

    core: Core
    polls: Polls
