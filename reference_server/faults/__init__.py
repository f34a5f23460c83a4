"""Named faults: each makes the reference server break exactly one protocol rule, to prove the conformance suite
catches the bug (``python -m reference_server --fault NAME``; ``python -m suite.mutants`` runs the whole kill
matrix).

The faults are a layer outside the executable spec: each wraps one named rule, store or route function of the
server (:mod:`.patching`), declared in the module of this package for its area, and is installed at start-up
only when asked for. A server started without faults runs the spec's code and nothing else.
"""

from __future__ import annotations

from .catalog import FAULTS, Fault
from .patching import Wrap, active, install, installed, wraps_of

__all__ = ["FAULTS", "Fault", "Wrap", "active", "install", "installed", "wraps_of"]
