"""How a fault takes hold: it wraps one named function of the server (a rule, a store or a route function) and
is installed at start-up, so the spec's own modules never hold a faulty branch (:mod:`reference_server.wrapping`
says how a wrap is installed and taken out)."""

from __future__ import annotations

from ..wrapping import Layer, Wrap
from .catalog import FAULTS

__all__ = ["LAYER", "Wrap", "active", "install", "installed", "wraps", "wraps_of"]

LAYER = Layer(__name__.rpartition(".")[0], FAULTS, "faults")
wraps = LAYER.wraps
wraps_of = LAYER.wraps_of
active = LAYER.active
install = LAYER.install
installed = LAYER.installed
