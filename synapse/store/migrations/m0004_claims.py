"""Fencing a whole batch per task, outbox claims, and partner liveness shared by replicas.

`synapse_fence_many` checks, in one statement, the leases of every task a batch writes (and
takes those of new tasks): the batch then writes the tasks still ours and drops the writes of
the others, instead of failing whole because one task was taken over meanwhile.

Outbox rows get `ord`, a number the database hands out as they are written: a task's rows are
written by one lease holder at a time, so `ord` is their order even across replicas (`seq`
comes from per-process blocks, and a successor's block may be lower than its predecessor's).

An outbox row is sent by the replica that claimed it (`claimed_by`, until `claimed_until`):
only the oldest live row of a task can be claimed, under the task's lease, so one message of
a task is in flight at a time and in order, whichever replica sends it; a claim not renewed
(its replica died) expires.

`partners` holds what the replicas know of each partner: when any of them last heard from it
(so one replica's heartbeat counts for all) and which replica sends it heartbeats, until when.
"""

SQL = """
CREATE SEQUENCE outbox_order;
ALTER TABLE outbox ADD COLUMN ord BIGINT NOT NULL DEFAULT nextval('outbox_order');
ALTER TABLE outbox ADD COLUMN claimed_by TEXT;
ALTER TABLE outbox ADD COLUMN claimed_until DOUBLE PRECISION;
CREATE INDEX outbox_claimed ON outbox (claimed_by) WHERE claimed_by IS NOT NULL;
CREATE INDEX outbox_task_order ON outbox (requester, task_id, ord) WHERE dead_reason IS NULL;

CREATE TABLE partners (
    partner TEXT PRIMARY KEY,
    last_heard DOUBLE PRECISION NOT NULL,
    beat_holder TEXT,
    beat_until DOUBLE PRECISION
);

-- The (task, epoch) pairs of a batch that `h` still holds, share-locked until commit (a
-- takeover waits for the batch); epoch 0 asks for the lease of a new task: taken if nobody
-- has it and the task is not stored yet (a stored task is taken over, never claimed: a
-- replica that let it go must not bring back what it remembers of it).
CREATE FUNCTION synapse_fence_many(r TEXT[], t TEXT[], e BIGINT[], h TEXT, until DOUBLE PRECISION)
RETURNS TABLE (ok_requester TEXT, ok_task_id TEXT, ok_epoch BIGINT) AS $$
BEGIN
    INSERT INTO leases (requester, task_id, holder, epoch, expires_at)
        SELECT w.r, w.t, h, 1, until FROM unnest(r, t, e) AS w(r, t, e) WHERE w.e = 0
        AND NOT EXISTS (SELECT 1 FROM tasks k WHERE k.requester = w.r AND k.task_id = w.t)
        ORDER BY 1, 2 ON CONFLICT DO NOTHING;
    RETURN QUERY
        SELECT l.requester, l.task_id, w.e FROM leases l
        JOIN unnest(r, t, e) AS w(r, t, e) ON l.requester = w.r AND l.task_id = w.t
        WHERE l.holder = h AND (l.epoch = w.e OR (w.e = 0 AND NOT EXISTS (SELECT 1 FROM tasks k
            WHERE k.requester = w.r AND k.task_id = w.t)))
        ORDER BY l.requester, l.task_id FOR SHARE OF l;
END $$ LANGUAGE plpgsql;

-- Claim the outbox row `m` for `h`, holding its task's lease at epoch `e`. The verdict:
-- 'claimed'; 'gone' (delivered, dropped or dead-lettered: nothing to send); 'lost' (the task's
-- lease is not ours at `e`); 'busy' (another replica's claim, until `busy_until`, a claim
-- being made, or our lease run out unrenewed); 'behind' (an older row of the task is still
-- to be delivered first).
CREATE FUNCTION synapse_claim_outbox(m TEXT, h TEXT, e BIGINT, now DOUBLE PRECISION,
                                     until DOUBLE PRECISION)
RETURNS TABLE (verdict TEXT, busy_until DOUBLE PRECISION) AS $$
DECLARE
    found_row outbox%ROWTYPE;
BEGIN
    SELECT * INTO found_row FROM outbox WHERE message_id = m AND dead_reason IS NULL
        FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM outbox WHERE message_id = m AND dead_reason IS NULL) THEN
            RETURN QUERY SELECT 'busy'::TEXT, now;
        ELSE
            RETURN QUERY SELECT 'gone'::TEXT, 0::DOUBLE PRECISION;
        END IF;
        RETURN;
    END IF;
    PERFORM 1 FROM leases WHERE requester = found_row.requester
        AND task_id = found_row.task_id AND holder = h AND epoch = e FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::TEXT, 0::DOUBLE PRECISION;
        RETURN;
    END IF;
    -- Ours, but run out (a renewal late, or this replica was frozen): no new POST until
    -- the renewal says whether the lease is still ours.
    PERFORM 1 FROM leases WHERE requester = found_row.requester
        AND task_id = found_row.task_id AND expires_at >= now;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'busy'::TEXT, now;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE requester = found_row.requester
               AND task_id = found_row.task_id AND dead_reason IS NULL
               AND ord < found_row.ord) THEN
        RETURN QUERY SELECT 'behind'::TEXT, now;
        RETURN;
    END IF;
    IF found_row.claimed_by IS NOT NULL AND found_row.claimed_by <> h
       AND found_row.claimed_until >= now THEN
        RETURN QUERY SELECT 'busy'::TEXT, found_row.claimed_until;
        RETURN;
    END IF;
    UPDATE outbox SET claimed_by = h, claimed_until = until WHERE seq = found_row.seq;
    RETURN QUERY SELECT 'claimed'::TEXT, until;
END $$ LANGUAGE plpgsql;
"""
