"""Hypothesis state machines that drive a target through long random sequences, race requests, wait out
leases and judge every answer with the pure protocol model (docs/reference.md: Leasing, Fencing, Expiry, Queries,
Activities)."""

from __future__ import annotations

from .activities import ActivityMachine
from .base import MachineBase
from .queries_signals import QuerySignalMachine
from .sessions import SessionMachine
from .workflow_leases import WorkflowLeaseMachine

__all__ = ["MACHINES", "MachineBase"]

MACHINES: tuple[type[MachineBase], ...] = (WorkflowLeaseMachine, QuerySignalMachine, ActivityMachine, SessionMachine)
