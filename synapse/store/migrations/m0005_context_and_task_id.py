"""Listing the tasks of one context (an A2A `contextId`) and finding a task by its id alone,
from indexes. The context is read from the stored record (`task_request.context.session_id`)
by an immutable function, indexed as an expression, so the table gains no column to fill.

The function never raises, whatever a record holds (an index expression that raised would
refuse the write): `json` (not `jsonb`) and every NUL escape (`\\u0000`, which no text may
hold) read as a space escape (`\\u0020`), so the text stays valid JSON wherever it occurs.
"""

SQL = r"""
CREATE FUNCTION synapse_context_id(record BYTEA) RETURNS TEXT
    LANGUAGE SQL IMMUTABLE PARALLEL SAFE
    AS $$
        SELECT replace(convert_from(record, 'UTF8'), '\u0000', '\u0020')::json
            -> 'context' ->> 'session_id'
    $$;
CREATE INDEX tasks_by_context ON tasks (requester, synapse_context_id(record), updated_at, task_id);
CREATE INDEX tasks_by_task_id ON tasks (task_id);
"""
