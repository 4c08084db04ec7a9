"""Task leases for replicas sharing one database.

A lease names the replica that runs a task's handler and sends its callbacks, until
`expires_at`; `epoch` grows by one at every change of holder and fences every write made
under the lease (`synapse_fence`, called in the transaction of each write: it takes a share
lock on the lease row, so a takeover waits for a write in progress, and a write by a holder
whose lease was taken over fails and rolls its whole transaction back).
"""

SQL = """
CREATE TABLE replicas (
    replica_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    url TEXT NOT NULL,
    seen_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE leases (
    requester TEXT NOT NULL,
    task_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (requester, task_id)
);
CREATE INDEX leases_holder ON leases (holder);
CREATE INDEX leases_expiry ON leases (expires_at);
CREATE INDEX outbox_task ON outbox (requester, task_id) WHERE dead_reason IS NULL;

-- Raise unless `holder` holds the lease of the task at `epoch` (then lock it until commit).
CREATE FUNCTION synapse_fence(r TEXT, t TEXT, h TEXT, e BIGINT) RETURNS VOID AS $$
BEGIN
    PERFORM 1 FROM leases
        WHERE requester = r AND task_id = t AND holder = h AND epoch = e FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease of task (%, %) lost by %', r, t, h USING ERRCODE = 'SY001';
    END IF;
END $$ LANGUAGE plpgsql;

-- The first write of a task not leased yet takes its lease (epoch 1); a task leased by
-- another replica refuses the write.
CREATE FUNCTION synapse_claim(r TEXT, t TEXT, h TEXT, until DOUBLE PRECISION)
RETURNS VOID AS $$
BEGIN
    INSERT INTO leases (requester, task_id, holder, epoch, expires_at)
        VALUES (r, t, h, 1, until) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM leases WHERE requester = r AND task_id = t AND holder = h FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task (%, %) is leased by another replica', r, t
            USING ERRCODE = 'SY001';
    END IF;
END $$ LANGUAGE plpgsql;
"""
