"""A compiled LangGraph graph served as a Synapse task handler (the `langgraph` extra).

    handler = LangGraphHandler(graph)         # or Peer(..., handler=graph)
    synapse serve --handler my_graphs:graph   # the same from the command line

One task type, the graph's name (`graph.name`, unless it is LangGraph's default, then
`graph`). The payload is the graph's input state, as it is; the graph's final state is the
task's result (LangChain messages in it as their fields). The input state's JSON Schema is
offered in `capability_query`, and a request without a required key is refused.

`interrupt(value)` inside a node pauses the graph; by what `value` is:

- `{"approve": {NAME: VALUE, ...}, "question": TEXT}` becomes `need_human`, one option per
  proposed value; the node resumes with the values as approved (the person's edits in them);
  a rejection fails the task;
- `{"field": NAME, "question": TEXT}` (optionally `"suggested": VALUE`) becomes `need_info`
  for that field; the node resumes with its value; `{"fields": {NAME: TEXT, ...}}` asks for
  several at once and resumes with a mapping of them;
- a string becomes `need_info` for the field `answer`, the string as its reason; anything else
  the same, its JSON as the reason.

Interrupt values and answers are plain JSON. The graph runs with a checkpointer: its own when
it was compiled with one (then keep it durable, e.g. LangGraph's SQLite or PostgreSQL saver;
the thread id is `synapse/REQUESTER/TASK_ID`), else an in-memory saver whose checkpoints of the
task's thread are kept with the task at every pause: a graph paused on a question resumes
after a restart from its checkpoint, not from its first node. Each node that finishes is
progress (`task_status_update`), at most one a second.
"""

from __future__ import annotations

import base64
import functools
import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from synapse.frameworks.base import (
    CURRENT_TASK,
    AgentAdapter,
    Progress,
    approve_values,
    ask_requester,
    last_checkpoint,
    pause,
    result_of,
    resumed_answers,
    task_type_of,
)
from synapse.p2p.engine import Validation
from synapse.runtime.handler import ExecutionContext
from synapse.types import MissingField, Reason

FRAMEWORK = "langgraph"
#: `CompiledStateGraph.name` when the graph was given none.
DEFAULT_NAME = "LangGraph"
#: The JSON types of a schema's `type`, as Python checks them (bool is not an integer here).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


class LangGraphHandler(AgentAdapter):
    """Runs `graph` for each task of its task type (see the module's docstring)."""

    def __init__(
        self,
        graph: Any,
        *,
        task_type: str | None = None,
        description: str = "",
        progress_interval: float = 1.0,
    ) -> None:
        name = graph.name if graph.name != DEFAULT_NAME else None
        self.task_type = task_type or task_type_of(name, "graph")
        self.description = description
        self.progress_interval = progress_interval
        #: The saver whose threads are kept with the tasks (None: the graph's own).
        self.saver: InMemorySaver | None = None
        if graph.checkpointer is None:
            self.saver = InMemorySaver()
            graph = graph.copy(update={"checkpointer": self.saver})
        self.graph = graph
        try:
            self.input_schema: dict[str, Any] | None = graph.get_input_jsonschema()
        except Exception:  # a state type pydantic cannot describe: offer no schema
            self.input_schema = None

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        schema = self.input_schema or {}
        missing = [k for k in schema.get("required", ()) if k not in payload]
        if missing:
            return Validation(
                ok=False,
                reason=Reason(code="invalid_params", message=f"missing: {', '.join(missing)}"),
                missing_fields=[MissingField(field=k) for k in missing],
            )
        for key, spec in schema.get("properties", {}).items():
            kinds = _JSON_TYPES.get(spec.get("type", "")) if isinstance(spec, dict) else None
            value = payload.get(key)
            if (
                key in payload
                and kinds
                and (not isinstance(value, kinds) or _bool_as_number(value, spec))
            ):
                message = f"{key} must be of type {spec['type']}"
                return Validation(ok=False, reason=Reason(code="invalid_params", message=message))
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        CURRENT_TASK.set(ctx)  # a delegated task's questions come here
        thread = f"synapse/{ctx.requester}/{ctx.task_id}"
        config: Any = {"configurable": {"thread_id": thread}}
        progress = Progress(ctx, self.progress_interval)
        command: Any = payload
        saved = last_checkpoint(ctx, FRAMEWORK)
        try:
            if saved is not None:  # started again after a restart: resume the paused graph
                if self.saver is not None:
                    self._restore(thread, saved["saver"])
                pending = saved["interrupts"]
                answers = await resumed_answers(
                    ctx, FRAMEWORK, saved, functools.partial(self._ask, ctx, pending)
                )
                command = Command(resume=_resume(answers))
            while True:
                values = await self._stream(command, config, progress)
                state = await self.graph.aget_state(config)
                interrupts = [{"id": i.id, "value": i.value} for i in state.interrupts]
                if not interrupts:
                    return result_of(values)
                kept = self._dump(thread)
                answers = await pause(
                    ctx,
                    FRAMEWORK,
                    functools.partial(self._ask, ctx, interrupts),
                    interrupts=interrupts,
                    saver=kept,
                )
                command = Command(resume=_resume(answers))
        finally:
            if self.saver is not None:
                self.saver.delete_thread(thread)  # kept with the task; memory is not the store

    async def _stream(self, command: Any, config: Any, progress: Progress) -> dict[str, Any]:
        """Run the graph to its end or its next interrupt; the last state it reached."""
        values: dict[str, Any] = {}
        async for mode, chunk in self.graph.astream(
            command, config, stream_mode=["updates", "values"]
        ):
            if mode == "values":
                values = {k: v for k, v in chunk.items() if k != "__interrupt__"}
            else:
                for node in chunk:
                    if node != "__interrupt__":
                        await progress.report(f"{node} done")
        return values

    async def _ask(self, ctx: ExecutionContext, interrupts: list[dict[str, Any]]) -> dict[str, Any]:
        """Each interrupt's answer, asked in order: {interrupt id: value}."""
        return {i["id"]: await _answer(ctx, i["value"]) for i in interrupts}

    def _dump(self, thread: str) -> Any:
        """The in-memory saver's checkpoints of `thread`, as plain JSON (None: the graph's
        own checkpointer keeps them)."""
        saver = self.saver
        if saver is None:
            return None
        return _pack(
            {
                "storage": {ns: dict(ids) for ns, ids in saver.storage.get(thread, {}).items()},
                "writes": {k: v for k, v in saver.writes.items() if k[0] == thread},
                "blobs": {k: v for k, v in saver.blobs.items() if k[0] == thread},
            }
        )

    def _restore(self, thread: str, kept: Any) -> None:
        saver = self.saver
        assert saver is not None
        data = _unpack(kept)
        saver.storage[thread] = defaultdict(dict, data["storage"])
        saver.writes.update(data["writes"])
        saver.blobs.update(data["blobs"])


async def _answer(ctx: ExecutionContext, value: Any) -> Any:
    """Ask what an interrupt's `value` asks (see the module's docstring); its answer."""
    if isinstance(value, str):
        return await ask_requester(ctx, "answer", value)
    if isinstance(value, Mapping):
        question = str(value.get("question", ""))
        if isinstance(value.get("approve"), Mapping):
            return await approve_values(
                ctx,
                value["approve"],
                message=question or "approve these values",
                details=dict(value),
            )
        if isinstance(value.get("field"), str):
            return await ask_requester(ctx, value["field"], question, value.get("suggested"))
        if isinstance(value.get("fields"), Mapping):
            fields = [MissingField(field=str(k), reason=str(v)) for k, v in value["fields"].items()]
            return await ctx.need_info(fields, question=question)
    return await ask_requester(ctx, "answer", json.dumps(value, ensure_ascii=False, default=str))


def _resume(answers: Mapping[str, Any]) -> Any:
    """What `Command(resume=...)` takes: the one answer, or each by interrupt id."""
    if len(answers) == 1:
        return next(iter(answers.values()))
    return dict(answers)


def _bool_as_number(value: Any, spec: Mapping[str, Any]) -> bool:
    return isinstance(value, bool) and spec.get("type") in ("integer", "number")


def _pack(value: Any) -> Any:
    """Tuples, bytes and mappings with tuple keys (the saver's storage) as plain JSON."""
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode()}
    if isinstance(value, tuple):
        return {"t": [_pack(v) for v in value]}
    if isinstance(value, list):
        return {"l": [_pack(v) for v in value]}
    if isinstance(value, Mapping):
        return {"d": [[_pack(k), _pack(v)] for k, v in value.items()]}
    return value


def _unpack(value: Any) -> Any:
    if isinstance(value, dict):
        if "b" in value:
            return base64.b64decode(value["b"])
        if "t" in value:
            return tuple(_unpack(v) for v in value["t"])
        if "l" in value:
            return [_unpack(v) for v in value["l"]]
        return {_unpack(k): _unpack(v) for k, v in value["d"]}
    return value


__all__ = ["FRAMEWORK", "LangGraphHandler"]
