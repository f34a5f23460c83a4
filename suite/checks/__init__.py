"""The conformance checks, one module per protocol area. Importing this package registers them all.

A check is a plain ``async`` function decorated with :func:`suite.registry.check`; its name is its
stable ID. It receives a :class:`suite.context.CheckContext`, builds its own world (queues, workflow
ids) and raises :class:`suite.outcomes.CheckFailure` (via ``ctx.expect`` / ``ctx.require``) when the
target breaks the rule. A failure that names no ``requirement`` is judged against the check's first
requirement, so a check of one requirement names it once, in its decorator; a check of several names the
requirement at each call that judges another.
"""

from . import (  # noqa: F401
    activities,
    auth,
    cancellation,
    children,
    codec,
    commands,
    control_plane,
    dispatch,
    fencing,
    history,
    polling,
    queries,
    registration,
    restarts,
    robustness,
    sessions,
    versioning,
)
