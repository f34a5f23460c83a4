-- The reference server's SQLite schema (reference_server.store applies it at every start; idempotent).
-- Times are integer microseconds since the epoch (UTC); statuses are the lifecycle tables' states.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

CREATE TABLE IF NOT EXISTS namespaces (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS workers (
    namespace TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    runtime TEXT NOT NULL,
    sdk_version TEXT,
    build_id TEXT,
    workflow_types TEXT NOT NULL,       -- JSON list; empty = all
    activity_types TEXT NOT NULL,       -- JSON list; empty = all
    fingerprints TEXT NOT NULL,         -- JSON object type -> fingerprint
    capabilities TEXT NOT NULL,         -- JSON list
    max_workflow_tasks INTEGER NOT NULL,
    max_activity_tasks INTEGER NOT NULL,
    status TEXT NOT NULL,               -- active | deregistered
    registered_at INTEGER NOT NULL,
    last_heartbeat_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, worker_id)
);
-- Without last_heartbeat_at: every accepted poll writes it (§6.2), and an index holding it rewrote one of its pages
-- on every poll; the few active workers of a queue are filtered by it from their rows. Replaces workers_by_queue.
DROP INDEX IF EXISTS workers_by_queue;
CREATE INDEX IF NOT EXISTS workers_active_by_queue ON workers (namespace, task_queue, status);

CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    run_number INTEGER NOT NULL,
    workflow_type TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    status TEXT NOT NULL,
    closed_reason TEXT,
    is_current INTEGER NOT NULL,
    input_blob TEXT,                    -- base64 Avro blob of the positional argument array
    output_blob TEXT,
    failure TEXT,                       -- JSON
    memo TEXT NOT NULL,                 -- JSON object
    search_attributes TEXT NOT NULL,    -- JSON object
    business_key TEXT,
    execution_timeout_seconds INTEGER,
    run_timeout_seconds INTEGER,
    run_deadline INTEGER,
    execution_deadline INTEGER,
    compatibility TEXT,
    started_at INTEGER NOT NULL,
    closed_at INTEGER,
    last_sequence INTEGER NOT NULL DEFAULT 0,
    step_sequence INTEGER NOT NULL DEFAULT 0,
    parent_run_id TEXT,
    parent_child_call_id TEXT,
    first_run_id TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS runs_by_workflow ON runs (namespace, workflow_id, run_number);
CREATE INDEX IF NOT EXISTS runs_current ON runs (namespace, workflow_id, is_current);
-- Only open runs that have a run deadline (runs_deadlines held every open run, so every start and close wrote it).
DROP INDEX IF EXISTS runs_deadlines;
CREATE INDEX IF NOT EXISTS runs_open_deadlines ON runs (run_deadline) WHERE closed_at IS NULL AND run_deadline IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS history (
    run_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL,              -- JSON object
    workflow_task_id TEXT,
    workflow_command_id TEXT,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, sequence)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS workflow_tasks (
    task_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    run_id TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    workflow_type TEXT NOT NULL,
    compatibility TEXT,
    status TEXT NOT NULL,               -- ready | leased | completed | failed | cancelled
    attempt INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_expires_at INTEGER,
    available_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    resume_context TEXT NOT NULL,       -- JSON object with the 20 keys
    seen_sequence INTEGER,              -- last history sequence delivered with the current lease
    repairs INTEGER NOT NULL DEFAULT 0
);
-- Open tasks only, by queue: ready ones oldest first (available_at, task_id), the order a claim reads, so a poll
-- reads one page whatever the backlog; live and expired leases by expiry. Partial indexes hold no finished
-- task, so a claim and a completion each change one entry of each, not two leaves of an index of every task
-- ever created. They replace wt_ready, wt_claimable and wt_leases.
DROP INDEX IF EXISTS wt_ready;
DROP INDEX IF EXISTS wt_claimable;
DROP INDEX IF EXISTS wt_leases;
CREATE INDEX IF NOT EXISTS wt_ready_by_age ON workflow_tasks (namespace, task_queue, available_at, task_id)
    WHERE status = 'ready';
CREATE INDEX IF NOT EXISTS wt_leased_by_expiry ON workflow_tasks (namespace, task_queue, lease_expires_at)
    WHERE status = 'leased';
-- A run's tasks in the order they were created (the index's rowid suffix). Status is not in the key: a claim and a
-- completion change a task's status, and an index entry keyed by it is rewritten by each, two more WAL pages per
-- cycle. A run's open task is its newest (engine.open_workflow_task); a close scans its run's tasks once.
DROP INDEX IF EXISTS wt_by_run;
CREATE INDEX IF NOT EXISTS wt_of_run ON workflow_tasks (run_id);

CREATE TABLE IF NOT EXISTS poll_requests (
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,                 -- workflow | activity | query
    task_queue TEXT NOT NULL,
    build_id TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    poll_request_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, kind, task_queue, build_id, worker_id, poll_request_id)
);
CREATE INDEX IF NOT EXISTS poll_requests_by_task ON poll_requests (kind, task_id);

CREATE TABLE IF NOT EXISTS activity_executions (
    execution_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step_sequence INTEGER NOT NULL,
    activity_type TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    connection TEXT,
    arguments_blob TEXT,
    retry_policy TEXT,                  -- JSON snapshot or NULL
    start_to_close_timeout INTEGER,
    schedule_to_start_timeout INTEGER,
    schedule_to_close_timeout INTEGER,
    heartbeat_timeout INTEGER,
    status TEXT NOT NULL,               -- pending | running | completed | failed | cancelled | timed_out
    attempt_count INTEGER NOT NULL DEFAULT 0,
    scheduled_at INTEGER NOT NULL,
    schedule_to_close_deadline INTEGER,
    closed_at INTEGER,
    current_task_id TEXT
);
CREATE INDEX IF NOT EXISTS ae_by_run ON activity_executions (run_id, status);
CREATE INDEX IF NOT EXISTS ae_deadline ON activity_executions (schedule_to_close_deadline)
    WHERE closed_at IS NULL;

CREATE TABLE IF NOT EXISTS activity_tasks (
    task_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    activity_type TEXT NOT NULL,
    compatibility TEXT,
    status TEXT NOT NULL,               -- ready | leased | completed | failed | cancelled
    available_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    lease_owner TEXT,
    lease_expires_at INTEGER,
    current_attempt_id TEXT,
    schedule_to_start_deadline INTEGER
);
CREATE INDEX IF NOT EXISTS at_ready ON activity_tasks (namespace, task_queue, status, available_at);
CREATE INDEX IF NOT EXISTS at_leases ON activity_tasks (status, lease_expires_at);
CREATE INDEX IF NOT EXISTS at_s2s ON activity_tasks (status, schedule_to_start_deadline);

CREATE TABLE IF NOT EXISTS activity_attempts (
    attempt_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    attempt_number INTEGER NOT NULL,
    lease_owner TEXT NOT NULL,
    status TEXT NOT NULL,               -- running | completed | failed | cancelled | expired
    started_at INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    start_to_close_deadline INTEGER,
    heartbeat_deadline INTEGER,
    last_heartbeat_at INTEGER,
    closed_at INTEGER
);
CREATE INDEX IF NOT EXISTS aa_by_execution ON activity_attempts (execution_id, attempt_number);
CREATE INDEX IF NOT EXISTS aa_running ON activity_attempts (status, lease_expires_at);

CREATE TABLE IF NOT EXISTS timers (
    timer_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    step_sequence INTEGER NOT NULL,
    delay_seconds INTEGER NOT NULL,
    fire_at INTEGER NOT NULL,
    status TEXT NOT NULL,               -- pending | fired | cancelled
    timer_kind TEXT NOT NULL,           -- sleep | condition_timeout
    condition_wait_id TEXT
);
CREATE INDEX IF NOT EXISTS timers_due ON timers (status, fire_at);
CREATE INDEX IF NOT EXISTS timers_by_run ON timers (run_id, status);

CREATE TABLE IF NOT EXISTS condition_waits (
    condition_wait_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    condition_key TEXT,
    fingerprint TEXT,
    step_sequence INTEGER NOT NULL,
    timeout_seconds INTEGER,
    timer_id TEXT,
    status TEXT NOT NULL                -- open | satisfied | timed_out
);
CREATE INDEX IF NOT EXISTS cw_by_run ON condition_waits (run_id, status);

CREATE TABLE IF NOT EXISTS signals (
    signal_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    signal_name TEXT NOT NULL,
    input_blob TEXT,
    request_id TEXT,
    received_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS signals_by_request ON signals (run_id, request_id);

CREATE TABLE IF NOT EXISTS updates (
    update_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    update_name TEXT NOT NULL,
    input_blob TEXT,
    request_id TEXT,
    status TEXT NOT NULL,               -- accepted | completed | failed
    result_blob TEXT,
    failure TEXT,
    accepted_at INTEGER NOT NULL,
    closed_at INTEGER
);
CREATE INDEX IF NOT EXISTS updates_by_run ON updates (run_id, status);

CREATE TABLE IF NOT EXISTS children (
    child_call_id TEXT PRIMARY KEY,
    parent_run_id TEXT NOT NULL,
    step_sequence INTEGER NOT NULL,
    workflow_type TEXT NOT NULL,
    child_workflow_id TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    arguments_blob TEXT,
    parent_close_policy TEXT NOT NULL,
    retry_policy TEXT,
    execution_timeout_seconds INTEGER,
    run_timeout_seconds INTEGER,
    attempt INTEGER NOT NULL,
    current_run_id TEXT,
    status TEXT NOT NULL,               -- running | completed | failed | cancelled | terminated | backoff
    retry_at INTEGER
);
CREATE INDEX IF NOT EXISTS children_by_parent ON children (parent_run_id, status);
CREATE INDEX IF NOT EXISTS children_retry ON children (status, retry_at);

CREATE TABLE IF NOT EXISTS query_tasks (
    query_task_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    run_id TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    query_name TEXT NOT NULL,
    arguments_blob TEXT,
    status TEXT NOT NULL,               -- pending | leased | completed | failed | timed_out
    attempt INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_expires_at INTEGER,
    deadline INTEGER NOT NULL,
    result TEXT,                        -- JSON {result, result_envelope}
    failure TEXT,                       -- JSON
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS qt_ready ON query_tasks (namespace, task_queue, status, created_at);
CREATE INDEX IF NOT EXISTS qt_deadline ON query_tasks (status, deadline);

CREATE TABLE IF NOT EXISTS drains (
    namespace TEXT NOT NULL,
    task_queue TEXT NOT NULL,
    build_id TEXT NOT NULL,             -- '' is the unversioned cohort
    drain_intent TEXT NOT NULL,         -- draining | active
    drained_at INTEGER,
    PRIMARY KEY (namespace, task_queue, build_id)
);
