"""The catalogue of named faults: per fault, the one-line description of the bug and the requirement IDs the
suite must report against it (the kill matrix runs exactly their checks), and how the kill matrix reaches it.
The code of each fault is in the modules beside this one."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FAULTS", "Fault"]


@dataclass(frozen=True)
class Fault:
    """One deliberately broken rule: what the server does wrong, and the requirement IDs the suite must
    report broken against it (every one of them; the kill matrix runs exactly their checks)."""

    description: str
    kills: tuple[str, ...]
    # The fault-proxy spec (--faults) under which the suite kills it; None: the plain suite kills it.
    proxy: str | None = None
    # The state machine that kills it (a bug only a multi-step history shows): the kill matrix runs that
    # machine too, with the checks of the fault's requirements. None: the plain checks kill it.
    machine: str | None = None
    # A bug too deep for the default budget: the kill matrix runs its machine as a campaign this long (--campaign).
    campaign: str | None = None


FAULTS: dict[str, Fault] = {
    # -- versioning and envelope --------------------------------------------------------------------------
    "ignore-version-header": Fault(
        "Worker routes accept any X-Durable-Workflow-Protocol-Version, or none at all.", ("VERSION-MISSING",)
    ),
    "accept-minor-above": Fault(
        "A worker version with the server's major and a higher minor (1.21 on 1.20) is accepted, not 400.",
        ("VERSION-MINOR-ABOVE",),
    ),
    "echo-requested-minor": Fault(
        "Worker responses echo the requested minor (1.0) in the header and protocol_version, not the advertised.",
        ("ENVELOPE-NO-MINOR-ECHO",),
    ),
    "bare-worker-errors": Fault(
        "Worker-plane error responses lack the worker envelope (no version header, protocol_version, capabilities).",
        ("ENVELOPE-VERSION-HEADER",),
    ),
    # -- auth and namespace order -------------------------------------------------------------------------
    "version-before-auth": Fault(
        "The worker version header is checked before the credential: a bad token without a version gets 400.",
        ("AUTH-BEFORE-VERSION",),
    ),
    "namespace-before-version": Fault(
        "An unknown namespace is reported (404) before a missing version header (400), leaking its existence.",
        ("VERSION-BEFORE-NAMESPACE",),
    ),
    # -- registration -------------------------------------------------------------------------------------
    "accept-unknown-runtime": Fault(
        "Worker registration accepts a runtime outside the known SDK runtimes instead of 422.",
        ("REGISTER-VALIDATION",),
    ),
    "metrics-crash-heartbeat": Fault(
        "A worker heartbeat whose process_metrics is not an object fails with a server error, not ignored or 422.",
        ("HOOKS-FAIL-OPEN",),
    ),
    # -- long poll and poll_status ------------------------------------------------------------------------
    "poll-ignores-wakeups": Fault(
        "A long poll ignores wake-ups: work that becomes ready mid-hold is only delivered when the hold ends.",
        ("LONGPOLL-IMMEDIATE-DELIVERY",),
    ),
    "long-poll-clamp-unadvertised": Fault(
        "A long poll is clamped to the spec's 60 s, not to the shorter long_poll_max_seconds the server advertises"
        " in its test profile.",
        ("LONGPOLL-CLAMP-MAX",),
    ),
    "poll-default-hold-one-second": Fault(
        "A poll without timeout_seconds answers empty after 1 s instead of holding the default 30 s (clamped to the"
        " advertised maximum).",
        ("LONGPOLL-DEFAULT-HOLD",),
    ),
    "match-any-workflow-type": Fault(
        "A workflow task is leased to any worker polling its queue, also one that registered other workflow types.",
        ("MATCH-REGISTERED-TYPES",),
    ),
    "match-any-activity-type": Fault(
        "An activity task is leased to any worker polling its queue, also one that registered other activity types.",
        ("MATCH-REGISTERED-TYPES",),
    ),
    "drop-poll-status": Fault("Workflow-task poll responses carry no poll_status field.", ("POLL-STATUS-PRESENT",)),
    "throttled-reported-empty": Fault(
        "A workflow poll refused by the admission limit is answered poll_status 'empty', not 'throttled'.",
        ("POLL-STATUS-THROTTLED",),
    ),
    "replay-increments-attempt": Fault(
        "A repeated poll_request_id returns the same task but increments its workflow_task_attempt.",
        ("IDEMPOTENT-POLL-REPLAY",),
    ),
    "replay-for-any-worker": Fault(
        "The poll replay cache ignores the worker: another worker's poll with the same poll_request_id is answered"
        " with the owner's lease.",
        ("IDEMPOTENT-POLL-OTHER-WORKER",),
    ),
    "poll-replay-forgotten-on-disconnect": Fault(
        "When the connection that carried a poll closes, the poll_request_id replay records of the polls answered"
        " on it are forgotten, so a retry after a lost answer (on a new connection) gets no replay.",
        ("IDEMPOTENT-POLL-REPLAY",),
        proxy="drop_response=0.25",
    ),
    # -- leases and fencing -------------------------------------------------------------------------------
    "accept-wrong-lease-owner": Fault(
        "Workflow-task heartbeat/complete/fail/history accept any lease_owner.", ("FENCE-OWNER",)
    ),
    "accept-stale-attempt": Fault(
        "Workflow-task heartbeat/complete/fail/history accept any workflow_task_attempt from the owner.",
        ("FENCE-ATTEMPT",),
    ),
    "third-attempt-takes-previous": Fault(
        "From a workflow task's third attempt on (two lease expiries, two redeliveries), a completion by the current"
        " owner naming the previous attempt is taken as the current attempt's (found by a campaign).",
        ("FENCE-ATTEMPT",),
        machine="workflow_leases",
        campaign="3m",
    ),
    "claim-not-conditional": Fault(
        "The claim write is not conditional: a poll racing a claim (within 1 s) takes the same task and attempt.",
        ("LEASE-NO-DUPLICATE-ATTEMPT",),
    ),
    "heartbeat-does-not-renew": Fault(
        "A workflow-task heartbeat answers renewed: true but leaves lease_expires_at where it was.",
        ("LEASE-HEARTBEAT-RENEWS",),
    ),
    # -- expiry and redelivery ----------------------------------------------------------------------------
    "expired-never-redelivered": Fault(
        "A workflow task whose lease expired is never leased again (a crashed worker's task is stuck).",
        ("DISPATCH-CRASH-TAKEOVER",),
    ),
    "redelivery-keeps-attempt": Fault(
        "A workflow task redelivered after lease expiry keeps its old workflow_task_attempt instead of +1.",
        ("EXPIRY-REDELIVER-SAME-TASK",),
    ),
    # -- commands and atomicity ---------------------------------------------------------------------------
    "partial-batch-on-invalid": Fault(
        "A batch with an invalid command is rejected, but the valid commands before it stay applied.",
        ("COMMANDS-ATOMIC",),
    ),
    "accept-two-terminal": Fault(
        "A batch with two terminal commands is accepted (the later ones dropped) instead of invalid_commands.",
        ("COMMANDS-ONE-TERMINAL",),
    ),
    "fail-workflow-drops-non-retryable": Fault(
        "fail_workflow's non_retryable is dropped: WorkflowFailed says false, and a child failed non-retryably is"
        " retried as its policy allows.",
        ("COMMANDS-FAIL-WORKFLOW-FAILURE", "CHILD-FAILURE-NON-RETRYABLE"),
    ),
    "fail-update-drops-optional-fields": Fault(
        "fail_update keeps only its message: exception_class, exception_type and non_retryable are dropped.",
        ("UPDATE-FAIL-FIELDS",),
    ),
    # -- history paging and compression -------------------------------------------------------------------
    "inline-page-default-unadvertised": Fault(
        "A history page asked for without a size (the poll's inline page too) holds 100 events, not the default page"
        " size the server advertises.",
        ("HISTORY-INLINE-DEFAULT-PAGE",),
    ),
    "history-page-gap": Fault(
        "Worker history pages after the first skip one event (a gap in the sequence).",
        ("HISTORY-PAGINATION-COMPLETE",),
    ),
    "history-page-uncapped": Fault(
        "The worker history route serves a page_size over 1000 whole: a page of a long run holds over 1000 events.",
        ("HISTORY-PAGE-SIZE-CAP",),
    ),
    "accept-invalid-page-token": Fault(
        "An undecodable next_history_page_token reads history from the start instead of 400 invalid_page_token.",
        ("HISTORY-INVALID-TOKEN",),
    ),
    "compress-below-threshold": Fault(
        "History is compressed on opt-in even when the page holds fewer than 50 events.",
        ("COMPRESSION-BELOW-THRESHOLD",),
    ),
    # -- cancellation and run_closed ----------------------------------------------------------------------
    "skip-run-closed-guard": Fault(
        "Calls on a leased task of a cancelled/terminated run get task_not_leased, never 409 run_closed.",
        ("CANCEL-TASK-RUN-CLOSED",),
    ),
    "cancel-leaves-tasks-open": Fault(
        "Cancel/terminate close the run but leave its open tasks and timers: its ready workflow task is leased.",
        ("CANCEL-NO-NEW-LEASES",),
    ),
    # -- activities, retries and timeouts -----------------------------------------------------------------
    "retry-past-max-attempts": Fault(
        "A failed activity is retried even when its attempt number has reached retry_policy.max_attempts.",
        ("RETRY-FAILED-ATTEMPTS-BOUNDED",),
    ),
    "retry-non-retryable": Fault(
        "An activity failure with non_retryable: true is retried while attempts remain.",
        ("RETRY-NON-RETRYABLE-FLAG",),
    ),
    "ignore-retry-backoff": Fault(
        "An activity retry is leasable at once: the backoff is recorded in history but not applied.",
        ("ACTIVITY-RETRY-BACKOFF",),
    ),
    "record-stale-activity-complete": Fault(
        "An activity complete of an attempt no longer live (done, expired, timed out) is recorded again: 200.",
        ("ACTIVITY-DUPLICATE-COMPLETE-STALE",),
    ),
    "failure-stack-in-message": Fault(
        "A failed activity's stack trace is appended to the message of its ActivityFailed (a contract field).",
        ("ACTIVITY-FAILURE-CONTRACT",),
    ),
    "failure-drops-code": Fault(
        "A failed activity's failure.code is not recorded in ActivityFailed.", ("ACTIVITY-FAILURE-CONTRACT",)
    ),
    "failure-non-retryable-as-sent": Fault(
        "ActivityFailed records the worker's non_retryable flag, not the effective one: a failure made final by"
        " non_retryable_error_types says non_retryable false.",
        ("ACTIVITY-FAILURE-CONTRACT",),
    ),
    "status-renews-lease": Fault(
        "The activity status verb renews the lease and records a heartbeat (while answering heartbeat_recorded false).",
        ("ACTIVITY-STATUS-VERB",),
    ),
    "status-hides-cancellation": Fault(
        "The activity status verb of a cancelled run's attempt says cancel_requested false, can_continue true.",
        ("ACTIVITY-STATUS-VERB",),
    ),
    "heartbeat-timeout-ignored": Fault(
        "An attempt whose heartbeats stop is never timed out by heartbeat_timeout: it runs on until its lease or"
        " start_to_close_timeout ends it.",
        ("TIMEOUT-HEARTBEAT-ENFORCED",),
    ),
    "heartbeat-timeout-from-claim": Fault(
        "A heartbeat does not move the heartbeat deadline: an attempt is timed out heartbeat_timeout after its"
        " claim, heartbeating or not.",
        ("TIMEOUT-HEARTBEAT-ENFORCED",),
    ),
    "schedule-to-start-ignored": Fault(
        "An activity task nobody claims is never timed out by schedule_to_start_timeout.",
        ("TIMEOUT-SCHEDULE-TO-START-ENFORCED",),
    ),
    "schedule-to-close-restarts-on-retry": Fault(
        "A retry restarts schedule_to_close_timeout: it bounds each attempt from its retry, not the execution.",
        ("TIMEOUT-SCHEDULE-TO-CLOSE-WHOLE-EXECUTION",),
    ),
    "start-to-close-ignored": Fault(
        "An attempt is never timed out by start_to_close_timeout: it runs on until its lease ends.",
        ("TIMEOUT-TIMED-OUT-EVENT", "TIMEOUT-LATE-COMPLETE-STALE"),
    ),
    # -- queries --------------------------------------------------------------------------------------------
    "query-writes-history": Fault(
        "Completing a query task appends a QueryCompleted event to the run's history.", ("QUERY-READ-ONLY",)
    ),
    "query-reported-twice": Fault(
        "A second complete or fail of a finished query task is acknowledged 200 instead of query_task_not_leased.",
        ("QUERY-LATE-COMPLETE-NOT-LEASED",),
    ),
    # -- codec and payload envelopes ------------------------------------------------------------------------
    "accept-non-avro-input": Fault(
        "A control-plane input envelope with a codec other than avro is stored and the run started, not 422.",
        ("CODEC-START-UNKNOWN-CODEC",),
    ),
    "reencode-start-input": Fault(
        "A start's input envelope is decoded and re-encoded, so a non-canonical blob comes back changed.",
        ("PAYLOAD-START-ENVELOPE-UNCHANGED",),
    ),
    # -- worker sessions ------------------------------------------------------------------------------------
    "session-shared-lease": Fault(
        "A second capable worker is admitted to a worker session another worker holds: two lease owners.",
        ("SESSION-SINGLE-OWNER",),
    ),
    "session-heartbeat-not-renewed": Fault(
        "A heartbeat of an in-session activity renews the attempt lease but not the session lease.",
        ("SESSION-ACTIVITY-HEARTBEAT-RENEWS",),
    ),
    "session-reacquire-ignores-policy": Fault(
        "A lapsed session with allow_reacquire_after_failure false is reacquired by another worker.",
        ("SESSION-REACQUIRE-DISALLOWED",),
    ),
    "session-never-expires": Fault(
        "A session whose lease was not renewed stays active for its old holder instead of expiring.",
        ("SESSION-LEASE-EXPIRY",),
    ),
    "session-ignores-activity-limit": Fault(
        "More in-session activity attempts are leased at once than the session's max_concurrent_activities.",
        ("SESSION-ACTIVITY-LIMIT",),
    ),
    "session-ignores-requirements": Fault(
        "A worker whose registered capabilities lack a session requirement is admitted to the session.",
        ("SESSION-REQUIREMENTS",),
    ),
    "session-stale-holder-renews": Fault(
        "After another worker reacquired a session, the old holder's session heartbeat is accepted.",
        ("SESSION-STALE-HOLDER-FENCED",),
    ),
    # -- children and cooperative cancellation ------------------------------------------------------------
    "child-default-terminate": Fault(
        "A start_child_workflow without parent_close_policy is recorded as terminate, not abandon.",
        ("CHILD-PARENT-CLOSE-DEFAULT",),
    ),
    "continue-as-new-keeps-type-and-arguments": Fault(
        "continue_as_new drops its workflow_type and arguments: the new run has the old run's type and input.",
        ("COMMANDS-CONTINUE-AS-NEW-CARRIES",),
    ),
    "created-task-ids-name-runs": Fault(
        "created_task_ids names the run a start_child_workflow or continue_as_new started, not its first task.",
        ("COMMANDS-CREATED-TASK-IDS",),
    ),
    "upsert-search-attributes-invisible": Fault(
        "upsert_search_attributes is recorded in history but never reaches the run's search attributes in describe.",
        ("COMMANDS-UPSERT-SEARCH-ATTRIBUTES",),
    ),
    "session-holder-staleness-ignored": Fault(
        "A session's holder that stopped heartbeating past stale_worker_seconds keeps the session: only a"
        " deregistration orphans it.",
        ("SESSION-ORPHANED",),
    ),
    # -- the resume context ---------------------------------------------------------------------------------
    "signal-wake-without-name": Fault(
        "The task an accepted signal wakes names no signal (signal_name and workflow_signal_id null).",
        ("PAYLOAD-RESUME-CONTEXT-SIGNAL",),
    ),
    "update-wake-without-id": Fault(
        "The task an accepted update wakes says wait kind update but names no update (workflow_update_id null).",
        ("PAYLOAD-RESUME-CONTEXT-UPDATE",),
    ),
    "activity-wake-without-attempt": Fault(
        "The task an activity's final outcome wakes names the execution but not the attempt that reported it.",
        ("PAYLOAD-RESUME-CONTEXT-ACTIVITY",),
    ),
    "child-wake-without-context": Fault(
        "The parent task a child's result wakes carries no child resume context (workflow_wait_kind, child_call_id"
        " and child_workflow_run_id null).",
        ("CHILD-RESULT-WAKES-PARENT",),
    ),
    "child-retry-without-backoff": Fault(
        "A failed child run is retried at once, not after the backoff its retry_policy gives.",
        ("CHILD-RETRY-BACKOFF",),
    ),
    "invalid-child-start-spends-attempt": Fault(
        "A rejected start_child_workflow spends a child retry attempt: the child started validly afterwards has one"
        " retry fewer.",
        ("CHILD-INVALID-START-NO-ATTEMPT",),
    ),
    "child-run-timeout-ignored": Fault(
        "run_timeout_seconds is never enforced: a child run stays open past it.",
        ("CHILD-RUN-TIMEOUT",),
    ),
    "child-execution-timeout-per-run": Fault(
        "Each retry of a child starts execution_timeout_seconds afresh, so the child outlives its execution deadline.",
        ("CHILD-EXECUTION-TIMEOUT",),
    ),
    "request-cancel-leaves-child-open": Fault(
        "A parent's close leaves its parent_close_policy request_cancel child running instead of cancelling it.",
        ("CHILD-PARENT-CLOSE-POLICIES",),
    ),
    "request-cancellation-closes-at-once": Fault(
        "parent_close_policy request_cancellation closes the child at once, like request_cancel.",
        ("CANCEL-COOPERATIVE-REQUEST",),
    ),
    "request-cancellation-never-closes": Fault(
        "A child asked to cancel cooperatively that does not close is left open past its cleanup deadline.",
        ("CANCEL-COOPERATIVE-DEADLINE",),
    ),
    "request-cancellation-new-identity": Fault(
        "A repeated client request-cancellation replaces the original request_id and cleanup deadline with new"
        " ones (duplicate: false) instead of answering them.",
        ("CANCEL-CLIENT-REQUEST",),
    ),
    # -- auth -----------------------------------------------------------------------------------------------
    "full-token-worker-only": Fault(
        "The full-access token authenticates as the worker role alone: the control plane answers it 403.",
        ("AUTH-FULL-ACCESS-TOKEN",),
    ),
    # -- histories: bugs only a multi-step history shows, read back in full by the machines ------------------
    "signal-left-out-after-lease": Fault(
        "A signal accepted (202) while the run's workflow task is leased is recorded, but the workflow-task"
        " history the run's next task reads leaves it out.",
        ("HISTORY-PAGINATION-COMPLETE",),
        machine="queries_signals",
    ),
    "update-accepted-repeated": Fault(
        "The worker history pages of a run with two or more accepted updates repeat the second UpdateAccepted.",
        ("HISTORY-PAGINATION-COMPLETE",),
        machine="queries_signals",
    ),
    "retry-attempt-restarts-after-heartbeat": Fault(
        "The retry that follows a failed activity attempt which had heartbeated restarts attempt_number at 1.",
        ("RETRY-ATTEMPTS-CONTIGUOUS",),
        machine="activities",
    ),
    "redelivery-history-stale": Fault(
        "A workflow task redelivered after its lease expired shows the history as it was when the task was"
        " created: later events are missing from its pages, though last_history_sequence counts them.",
        ("HISTORY-PAGINATION-COMPLETE",),
        machine="workflow_leases",
    ),
    "continue-as-new-chain-old-run": Fault(
        "Down a continue_as_new chain, the workflow tasks of the third run (and later ones) name the run it"
        " continued (its old run_id).",
        ("COMMANDS-CONTINUE-AS-NEW",),
        machine="workflow_leases",
    ),
    "heartbeat-records-first-attempt": Fault(
        "ActivityHeartbeatRecorded always records attempt_number 1, also for a retry or a redelivered attempt.",
        ("RETRY-ATTEMPTS-CONTIGUOUS",),
        machine="activities",
    ),
    "activity-former-holder-reports": Fault(
        "A worker whose activity lease lapsed and was redelivered still reports for the task: its complete or fail"
        " with the new attempt's id is recorded for the new holder.",
        ("ACTIVITY-FENCE-OWNER",),
        machine="activities",
    ),
    "activity-closed-run-skips-owner-check": Fault(
        "Once a run is cancelled or terminated, any worker naming one of its activity attempts passes the ownership"
        " guard: a worker that never held the attempt is told of the cancellation instead of lease_owner_mismatch.",
        ("ACTIVITY-FENCE-OWNER",),
        machine="activities",
    ),
    "session-former-holder-closes": Fault(
        "A worker that held a worker session before another worker reacquired it still closes it: its close is"
        " accepted as the holder's.",
        ("SESSION-STALE-HOLDER-FENCED",),
        machine="worker_sessions",
    ),
    "session-reacquire-resets-ttl": Fault(
        "Reacquiring a worker session starts its absolute TTL again: the session outlives the TTL it was created"
        " with and still renews.",
        ("SESSION-TTL-TERMINAL",),
        machine="worker_sessions",
    ),
    "update-close-from-any-worker": Fault(
        "A workflow-task complete that only closes updates (complete_update, fail_update) is accepted from a"
        " worker that does not hold the task, as if the holder had sent it.",
        ("FENCE-OWNER",),
        machine="queries_signals",
    ),
    "fail-update-closes-again": Fault(
        "A fail_update naming an update a workflow task already closed passes validation: the update is closed"
        " and recorded a second time.",
        ("UPDATE-CLOSED-AT-MOST-ONCE",),
        machine="queries_signals",
    ),
    "query-leased-failed-on-run-close": Fault(
        "Closing a run fails its leased query tasks too (not only the pending ones): the holder's answer is refused"
        " with 409 and the caller is told the query was rejected.",
        ("QUERY-RESULT-ROUNDTRIP",),
        machine="queries_signals",
    ),
    "query-failed-task-retried": Fault(
        "A query task its worker failed is handed to the next worker that polls the queue, as a retry (attempt"
        " + 1), although query tasks are never retried.",
        ("QUERY-READ-ONLY",),
        machine="queries_signals",
    ),
    "signal-to-failed-run-accepted": Fault(
        "A run a fail_workflow closed still takes signals: 202 and a SignalReceived after its end, where a closed"
        " run answers 409.",
        ("SIGNAL-CLOSED-RUN-REJECTED",),
        machine="workflow_leases",
    ),
    "continued-run-fail-recorded-completed": Fault(
        "In a run that began with a continue-as-new, a fail_workflow is applied as complete_workflow: the run"
        " completes, no WorkflowFailed.",
        ("COMMANDS-FAIL-WORKFLOW",),
        machine="workflow_leases",
    ),
    "deregistration-keeps-leases": Fault(
        "A deregistered worker's workflow tasks are counted in recovered_workflow_task_count but keep its leases:"
        " the next poll leases nothing until those leases expire.",
        ("DEREGISTER-RELEASES-LEASES",),
        machine="workflow_leases",
    ),
    "deregistration-skips-redelivered-leases": Fault(
        "Deregistration gives up only first-attempt workflow-task leases: a task its worker took over after a"
        " lease expired stays leased to it (not counted, not ready again) until that lease expires.",
        ("DEREGISTER-RELEASES-LEASES",),
        machine="workflow_leases",
    ),
    "continue-as-new-restarts-execution-timeout": Fault(
        "The run a continue-as-new starts counts the execution timeout from its own start: the execution outlives"
        " its execution_timeout_seconds.",
        ("RUN-TIMEOUT-CLOSES-RUN",),
        machine="workflow_leases",
    ),
    # -- children and cooperative cancellation in the cells only the child sweep reaches ------------------
    "abandon-child-cancelled-with-parent": Fault(
        "A parent cancelled from the control plane cancels its abandon children with it (a parent that closes"
        " itself leaves them running).",
        ("CHILD-PARENT-CLOSE-DEFAULT",),
        machine="workflow_leases",
    ),
    "second-child-wake-names-first": Fault(
        "The parent task woken by its second child's result carries the first child's resume context"
        " (child_call_id and child_workflow_run_id of the first child).",
        ("CHILD-RESULT-WAKES-PARENT",),
        machine="workflow_leases",
    ),
    "cancellation-dropped-after-delivery": Fault(
        "Once a child's worker committed the delivery of a cooperative cancellation request, the child's later"
        " workflow tasks no longer carry cancel_requested and the request, though the child is still open.",
        ("CANCEL-COOPERATIVE-REQUEST",),
        machine="workflow_leases",
    ),
    "delivered-child-terminated-at-deadline": Fault(
        "A child still open past its cleanup deadline after its delivery was committed is terminated, not closed"
        " as cancelled (an undelivered one is cancelled as it must be).",
        ("CANCEL-COOPERATIVE-DEADLINE",),
        machine="workflow_leases",
    ),
    "session-expired-revived-by-activity-heartbeat": Fault(
        "A heartbeat of an in-session activity by the last holder of an expired session makes the session active"
        " again, where only a reacquisition brings it back.",
        ("SESSION-LEASE-EXPIRY",),
        machine="worker_sessions",
    ),
    # -- durability ---------------------------------------------------------------------------------------
    "completion-commit-deferred": Fault(
        "A workflow-task complete is acknowledged before it is committed: its transaction stays open (the later"
        " ones nest in it) until a clean shutdown, so a hard restart loses it and everything after it.",
        ("RESTART-ACKNOWLEDGED-DURABLE",),
    ),
    "complete-not-persisted": Fault(
        "A workflow-task complete is acknowledged 200 but its transaction is rolled back, never persisted.",
        ("COMMANDS-COMPLETE-WORKFLOW",),
    ),
}
