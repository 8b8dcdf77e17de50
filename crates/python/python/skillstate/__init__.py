"""skillstate: explicit, schema-validated execution state for long-horizon LLM agents.

The runtime itself, as a native module (no server needed)::

    import skillstate

    skill = skillstate.Skill.load("skills/warehouse")
    verdict = skill.validate(state, answer_text)      # .accepted, .new_state, .patch, .action, .errors
    prompt = skill.render(state, observation)         # the exact prompt a runner sends

    rt = skillstate.Runtime("skillstate.db")          # or "postgres://..."
    task = rt.run(skill, model=my_model, tools={"ship": ship}, input="...")
    task.state; task.steps(); task.state_at(7); task.prompt_at(7)
    rt.resume(task.id, model=my_model, tools={"ship": ship})
    rt.upgrade(task.id, "skills/warehouse", apply=True)  # to another version of its skill

Runs release the GIL while the runtime waits on the model, tools or the database; ``arun`` and
``aresume`` run the same in a worker thread (``asyncio.to_thread``) for asyncio programs.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Union

from ._native import (
    ModelError,
    ModelRequest,
    Skill,
    SkillError,
    SkillstateError,
    StoreError,
    Task,
    TaskError,
    Tool,
    ToolError,
    UpgradeRefused,
    ValidationError,
    Verdict,
    __version__,
    count_tokens,
)
from ._native import Runtime as _NativeRuntime

__all__ = [
    "ModelError",
    "ModelRequest",
    "Runtime",
    "Skill",
    "SkillError",
    "SkillstateError",
    "StoreError",
    "Task",
    "TaskError",
    "Tool",
    "ToolError",
    "UpgradeRefused",
    "ValidationError",
    "Verdict",
    "__version__",
    "count_tokens",
    "tool",
]

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _parameters_of(function: Callable[..., Any]) -> Dict[str, Any]:
    """A JSON Schema of ``function``'s keyword parameters, from its annotations."""
    properties: Dict[str, Any] = {}
    required = []
    try:
        hints = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {"type": "object"}
    for name, parameter in hints.items():
        if name == "context" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = parameter.annotation
        if isinstance(annotation, str):
            annotation = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}.get(
                annotation, None
            )
        kind = _JSON_TYPES.get(annotation) if annotation is not None else None
        properties[name] = {"type": kind} if kind else {}
        if parameter.default is parameter.empty:
            required.append(name)
    schema: Dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def tool(
    function: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    parameters: Optional[Mapping[str, Any]] = None,
    side_effect: str = "effectful",
    pass_context: bool = False,
    needs_approval: bool = False,
) -> Any:
    """Declares a Python callable as a tool a task may call.

    Use it as a function, ``skillstate.tool(ship, side_effect="effectful")``, or as a decorator,
    ``@skillstate.tool(side_effect="read_only")``. The model's arguments are validated against
    ``parameters`` (a JSON Schema of the arguments object; default: derived from the function's
    annotated parameters) and passed as keyword arguments. The function returns the text the
    model sees next (a str; anything else is sent as JSON); an exception becomes a failed call
    the model sees as ``Error: tool `name` failed: Type: message``.

    ``side_effect`` decides crash recovery, as for built-in tools: ``"read_only"`` and
    ``"idempotent"`` calls are run again when a task resumes after a crash during the call; an
    ``"effectful"`` one (the default) is not — its outcome becomes unknown and the skill's
    ``on_unknown_outcome`` decides. With ``pass_context=True`` the function also receives
    ``context={"task_id", "step", "idempotency_key"}`` (the key is the same on every retry of
    a step, for services that deduplicate).

    With ``needs_approval=True`` every call waits for a human: the task pauses
    (``awaiting_approval``) with the call committed as pending, ``Runtime.approve`` runs it
    exactly once and ``Runtime.reject`` turns it into an observation with the reason.
    """

    def declare(fn: Callable[..., Any]) -> Tool:
        doc = inspect.getdoc(fn) or ""
        return Tool(
            fn,
            name or getattr(fn, "__name__", "tool"),
            description if description is not None else doc.split("\n\n")[0].strip(),
            dict(parameters) if parameters is not None else _parameters_of(fn),
            side_effect,
            pass_context,
            needs_approval,
        )

    if function is None:
        return declare
    return declare(function)


class Runtime(_NativeRuntime):
    __doc__ = _NativeRuntime.__doc__

    async def arun(self, skill: Skill, model: Any, **kwargs: Any) -> Task:
        """``await rt.arun(skill, model=..., ...)``: ``run`` in a worker thread (asyncio.to_thread).

        The native run releases the GIL while it waits on the model, tools or the database, so
        the event loop keeps serving other coroutines meanwhile. Python models and tools are
        called from that worker thread: pass plain (not ``async def``) callables.
        """
        return await asyncio.to_thread(self.run, skill, model, **kwargs)

    async def aresume(self, task_id: str, model: Any, **kwargs: Any) -> Task:
        """``await rt.aresume(task_id, model=..., ...)``: ``resume`` in a worker thread."""
        return await asyncio.to_thread(self.resume, task_id, model, **kwargs)

    async def areply(self, task_id: str, answer: str, model: Any, **kwargs: Any) -> Task:
        """``await rt.areply(task_id, answer, model=..., ...)``: ``reply`` in a worker thread."""
        return await asyncio.to_thread(self.reply, task_id, answer, model, **kwargs)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


ModelLike = Union[str, Callable[[ModelRequest], str]]
