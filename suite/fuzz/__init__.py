r"""OpenAPI-driven fuzzing: Schemathesis generates requests from ``schemas/openapi.yaml``, the suite judges
the answers.

For every operation of the document, Schemathesis' coverage phase gives deterministic cases for every
parameter and body property (boundary values, wrong types, missing required values, unexpected content
types and methods; up to 5 × ``--fuzz-examples``, round-robin over their kinds), and Hypothesis draws
``--fuzz-examples`` random cases: positive ones (bodies, paths and queries the schemas describe, with the
version, namespace and credential headers of the operation's plane) and negative ones (each with at least
one part that breaks the schema: bodies of the wrong type, non-JSON and invalid UTF-8 bytes, bad path and
query values, and in a third of them bad headers too). Operations that act on a workflow first get a
*live world* — a run built with the suite's own worlds (:mod:`suite.worlds`) with a registered worker and a
leased task — and a case targets it with some probability: its ids go into the path parameters, and
sometimes its fencing values into the body. Every answer is judged by the response checks, registered with
the suite's registry (:func:`suite.registry.response_check`), each tied to requirement IDs:

================================  ========================================  ===============================
check                             rule                                      requirement
================================  ========================================  ===============================
``not_a_server_error``            no 5xx unless the operation documents it  ROBUST-NO-5XX
                                  (503 on polls, 503/504 on queries)
``status_code_conformance``       the status is documented for the          ROBUST-STATUS-SET
                                  operation, or 413 for an oversized body
``response_schema_conformance``   the body matches the documented schema    SCHEMA-RESPONSES
``error_envelope``                a 4xx carries ``reason``; on worker       ROBUST-ENVELOPE-ON-ERROR
                                  routes also the worker envelope           (worker plane), otherwise
                                                                            ENVELOPE-ERROR-REASON
``rejected_changes_nothing``      a 4xx on a live world leaves describe     ROBUST-REJECTED-NO-STATE-CHANGE
                                  and control-plane history unchanged
================================  ========================================  ===============================

The document has no OpenAPI ``links``, so Schemathesis cannot chain operations by itself;
:func:`fuzz_stateful` is the hand-written sequence start → register → poll → complete, where the start,
register and poll bodies and the command batch are all drawn from the document's schemas; an accepted
complete, repeated, must be fenced with 409 (FENCE-AFTER-COMPLETE) and change nothing.

Failures are :class:`FuzzFailure` (a :class:`~suite.outcomes.CheckFailure`) carrying the recorded exchange,
whose ``curl`` line reproduces the case. A run never stops at the first failure: every case is judged,
the first few failures of each requirement are kept as evidence, and the result becomes
:class:`~suite.outcomes.Record`\ s (check name ``fuzz:<operationId>``) with its statistics as a labelled
:class:`~suite.outcomes.FuzzStats` row.

Schemathesis sends the cases synchronously (with ``requests``); the live worlds are built and read through a
check context on an event loop of the fuzzer's own (:class:`~suite.fuzz.live.Lab`). The embedded server's
3-second leases are renewed between cases, never between the two snapshots of a comparison; a world that
accepted a call (or answered 5xx) is rebuilt before the next case targets it, so nothing a generated command
scheduled (a timer, an activity) can change a world while it is compared.

The modules: :mod:`~suite.fuzz.document` (the operations, the schema), :mod:`~suite.fuzz.judges` (the response
checks), :mod:`~suite.fuzz.results` (budget, statistics, records), :mod:`~suite.fuzz.live` (the live worlds),
:mod:`~suite.fuzz.cases` (one case, sent and judged), :mod:`~suite.fuzz.operation` (one operation),
:mod:`~suite.fuzz.stateful` (the sequence) and :mod:`~suite.fuzz.groups` (one pytest item a group).
"""

from __future__ import annotations

from .document import AVRO_VALUE_FORMAT, Operation, avro_values, load_schema, operations
from .groups import GROUPS, all_groups, fuzz_group, group_members, group_requirements
from .judges import (
    AFTER_COMPLETE,
    ENVELOPE,
    ERROR_REASON,
    FUZZ_REQUIREMENTS,
    NO_5XX,
    NO_CHANGE,
    SCHEMA,
    STATUS_SET,
    Answer,
    FuzzFailure,
    judge,
    judged_requirements,
)
from .live import WORLDS
from .operation import fuzz_operation
from .results import FuzzBudget, FuzzResult
from .stateful import STATEFUL, fuzz_stateful

__all__ = [
    "AFTER_COMPLETE",
    "AVRO_VALUE_FORMAT",
    "ENVELOPE",
    "ERROR_REASON",
    "FUZZ_REQUIREMENTS",
    "GROUPS",
    "NO_5XX",
    "NO_CHANGE",
    "SCHEMA",
    "STATEFUL",
    "STATUS_SET",
    "WORLDS",
    "Answer",
    "FuzzBudget",
    "FuzzFailure",
    "FuzzResult",
    "Operation",
    "all_groups",
    "avro_values",
    "fuzz_group",
    "fuzz_operation",
    "fuzz_stateful",
    "group_members",
    "group_requirements",
    "judge",
    "judged_requirements",
    "load_schema",
    "operations",
]
