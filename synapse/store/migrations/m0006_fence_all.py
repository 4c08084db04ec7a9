"""`synapse_fence_all`: the fence of a batch as one statement that needs no answer.

`synapse_fence_many` returns the leases a batch still holds, which the writer must read before
it writes: a round trip of its own. `synapse_fence_all` checks the same leases (and takes those
of new tasks, share-locking them until the commit) and aborts the transaction if any is not
held as the writes expect, so that BEGIN, the fence, the writes and COMMIT travel together in
one pipelined round trip. The rare batch it refuses (a task taken over meanwhile) is written
again the long way: `synapse_fence_many` says which tasks were lost, and the rest is written.
"""

SQL = """
CREATE FUNCTION synapse_fence_all(r TEXT[], t TEXT[], e BIGINT[], h TEXT, until DOUBLE PRECISION)
RETURNS void AS $$
BEGIN
    IF (SELECT count(*) FROM synapse_fence_many(r, t, e, h, until)) <> cardinality(r) THEN
        RAISE EXCEPTION 'synapse: lease not held';
    END IF;
END $$ LANGUAGE plpgsql;
"""
