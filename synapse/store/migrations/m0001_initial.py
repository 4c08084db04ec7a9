"""Tasks with their history, the outbox with its dead letters, and the dedup table."""

SQL = """
CREATE TABLE tasks (
    requester TEXT NOT NULL,
    task_id TEXT NOT NULL,
    role TEXT NOT NULL,
    state TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    record BYTEA NOT NULL,
    PRIMARY KEY (requester, task_id)
);
CREATE TABLE transitions (
    id BIGSERIAL PRIMARY KEY,
    requester TEXT NOT NULL,
    task_id TEXT NOT NULL,
    role TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    event TEXT NOT NULL,
    message_id TEXT,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX transitions_task ON transitions (requester, task_id, id);
CREATE TABLE outbox (
    seq BIGINT PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    partner TEXT NOT NULL,
    requester TEXT,
    task_id TEXT,
    body BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    dead_reason TEXT,
    dead_at DOUBLE PRECISION
);
CREATE INDEX outbox_dead ON outbox (dead_at) WHERE dead_reason IS NOT NULL;
-- Outbox sequence numbers are handed out in blocks (one nextval per block), so that replicas
-- sharing the database never pick the same number and rarely ask for one.
CREATE SEQUENCE outbox_seq_blocks START 1 INCREMENT 1;
CREATE TABLE dedup (
    sender TEXT NOT NULL,
    message_id TEXT NOT NULL,
    fingerprint BYTEA NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    status INTEGER NOT NULL,
    body BYTEA NOT NULL,
    headers TEXT NOT NULL,
    PRIMARY KEY (sender, message_id)
);
CREATE INDEX dedup_expiry ON dedup (expires_at);
CREATE INDEX tasks_live ON tasks (state)
    WHERE state NOT IN ('completed', 'failed', 'cancelled', 'rejected');
CREATE INDEX tasks_finished ON tasks (updated_at)
    WHERE state IN ('completed', 'failed', 'cancelled', 'rejected');
CREATE INDEX tasks_listing ON tasks (updated_at, requester, task_id);
CREATE INDEX tasks_by_requester ON tasks (requester, updated_at, task_id);
"""
