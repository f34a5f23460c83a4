"""Legal variations: each makes the reference server take another choice the protocol leaves to each server — an
advertised default, timing inside a tolerance, an option it never uses. A conformance suite must find every one of
them CONFORMANT; the project's tests run the suite through them (``python -m reference_server --variation NAME``;
``--variation list`` prints them).

Like the kill matrix's layer, the variations are outside the spec: each wraps one named function of the server
(:mod:`reference_server.wrapping`), declared in :mod:`.choices`, installed at start-up only when asked for.
"""

from __future__ import annotations

from .catalog import VARIATIONS, Variation
from .layer import LAYER

__all__ = ["LAYER", "VARIATIONS", "Variation", "install", "installed"]

install = LAYER.install
installed = LAYER.installed
