"""The layer the variations are installed through (:class:`reference_server.wrapping.Layer`)."""

from __future__ import annotations

from ..wrapping import Layer
from .catalog import VARIATIONS

__all__ = ["LAYER"]

LAYER = Layer(__name__.rpartition(".")[0], VARIATIONS, "variations")
