"""Counting stored final tasks by role and state (gauges) from an index."""

SQL = """
CREATE INDEX tasks_finished_by_role ON tasks (role, state)
    WHERE state IN ('completed', 'failed', 'cancelled', 'rejected');
"""
