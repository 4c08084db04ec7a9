"""The takeover scan for tasks without a lease, as a function that never reads finished tasks.

Tasks nobody leases (a store a single process used before, or a lease given back while a
callback was still to be delivered) are found among the tasks in flight (the `tasks_live`
partial index) and the live outbox rows. Planned freely, the outbox side joins `tasks` by a
sequential scan while the store is small enough to look cheap: every stored task, finished
ones included, read every few seconds by every replica. Inside this function the planner may
only look tasks up by key, so the scan costs what is in flight, not what is stored.
"""

SQL = """
CREATE FUNCTION synapse_lease_unleased(h TEXT, until DOUBLE PRECISION, n INTEGER)
RETURNS TABLE (leased_requester TEXT, leased_task_id TEXT, leased_epoch BIGINT) AS $$
    INSERT INTO leases (requester, task_id, holder, epoch, expires_at)
    SELECT c.requester, c.task_id, h, 1, until FROM (
        SELECT requester, task_id FROM tasks
            WHERE state NOT IN ('completed', 'failed', 'cancelled', 'rejected')
        UNION
        SELECT o.requester, o.task_id FROM outbox o
            WHERE o.dead_reason IS NULL AND EXISTS (SELECT 1 FROM tasks t
                WHERE t.requester = o.requester AND t.task_id = o.task_id)
    ) c
    WHERE NOT EXISTS (SELECT 1 FROM leases l
        WHERE l.requester = c.requester AND l.task_id = c.task_id)
    LIMIT n
    ON CONFLICT DO NOTHING
    RETURNING requester, task_id, epoch
$$ LANGUAGE sql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;
"""
