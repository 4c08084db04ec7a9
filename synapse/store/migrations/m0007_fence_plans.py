"""The fence and the outbox claim look leases up by key, whatever the statistics say.

`synapse_fence_many` joins a batch's (requester, task_id) pairs with `leases`. Planned from
statistics gathered while the table was small (a fresh database, or before autovacuum's next
ANALYZE), PostgreSQL hashes every lease the replica holds, or scans the table, for each batch:
the fence then slows as the replica gets busier. A batch names a few tasks, so the right plan
is always a lookup of each by the primary key: the functions plan with sequential scans, hash
joins and merge joins off, and their plan no longer depends on how many leases exist.
"""

SQL = """
ALTER FUNCTION synapse_fence_many(TEXT[], TEXT[], BIGINT[], TEXT, DOUBLE PRECISION)
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;
ALTER FUNCTION synapse_claim_outbox(TEXT, TEXT, BIGINT, DOUBLE PRECISION, DOUBLE PRECISION)
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;
"""
