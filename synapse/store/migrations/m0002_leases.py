"""Task leases for replicas sharing one database, and outbox claims.

A lease names the replica that runs a task's handler and sends its callbacks, until
`expires_at`; `epoch` grows by one at every change of holder and fences every write made
under the lease (`synapse.store.leases`). An outbox row is claimed by one replica's worker
at a time (`claimed_by` until `claim_expires_at`), so a task's callbacks go out one by one.
"""

SQL = """
CREATE TABLE leases (
    requester TEXT NOT NULL,
    task_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (requester, task_id)
);
CREATE INDEX leases_expiry ON leases (expires_at);
CREATE TABLE replicas (
    replica_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    seen_at DOUBLE PRECISION NOT NULL
);
ALTER TABLE outbox ADD COLUMN claimed_by TEXT;
ALTER TABLE outbox ADD COLUMN claim_expires_at DOUBLE PRECISION;
CREATE INDEX outbox_pending ON outbox (seq) WHERE dead_reason IS NULL;
"""
