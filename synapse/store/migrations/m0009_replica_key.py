"""A secret the replicas of one agent share through the database they share: a replica that
passes a person's request on to the replica working on the task vouches with it for whom it
signed in (`synapse.transport.replicas`). Anyone who can read it could write the tasks
themselves, so it adds no one to those trusted already."""

SQL = """
CREATE TABLE replica_keys (
    agent_id TEXT PRIMARY KEY,
    key BYTEA NOT NULL
);
"""
