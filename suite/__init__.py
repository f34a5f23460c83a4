"""Conformance and fuzz suite for the Durable Workflow worker protocol 1.20.

``suite.protocol`` is the pure protocol model shared with the reference server; the rest of the
package is the pytest plugin and the checks that run against any server URL.
"""

__version__ = "0.2.0.dev0"
