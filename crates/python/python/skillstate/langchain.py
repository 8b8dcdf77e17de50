"""LangChain and LangGraph adapters (``pip install "skillstate[langchain]"``; the LangGraph node
also needs ``langgraph``).

- :func:`chat_model`: any LangChain chat model as a skillstate model.
- :func:`tools`: LangChain tools as skillstate tools, each with its side-effect class.
- :func:`run`: a skill run with both.
- :func:`node` / :func:`route`: a LangGraph node that advances a skillstate task by exactly one
  step per visit, keeping the task's id, validated state and status in the graph's state
  instead of a growing message list.

Only ``langchain_core`` is imported, and only when these functions are called.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Union

from . import ModelRequest, Runtime, Skill, Task, Tool, tool as _declare

__all__ = ["chat_model", "tools", "run", "node", "route", "TASK_KEY", "STATE_KEY", "STATUS_KEY", "INPUT_KEY"]

INPUT_KEY = "input"
TASK_KEY = "skillstate_task"
STATE_KEY = "skillstate_state"
STATUS_KEY = "skillstate_status"


def _text_of(content: Any) -> str:
    """The text of a chat message's content (a str, or a list of content blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return str(content)


def chat_model(llm: Any) -> Callable[[ModelRequest], str]:
    """A skillstate model calling ``llm`` (any LangChain ``BaseChatModel``).

    Each step sends two messages, a ``SystemMessage`` with the prompt's stable prefix
    (procedure and tools: providers cache it) and a ``HumanMessage`` with the state and the
    observation, and returns the reply's text for validation. Bind structured output or
    sampling settings on ``llm`` itself (``llm.bind(...)``) as usual.
    """
    from langchain_core.messages import HumanMessage, SystemMessage

    def model(request: ModelRequest) -> str:
        reply = llm.invoke([SystemMessage(content=request.prefix), HumanMessage(content=request.body)])
        return _text_of(getattr(reply, "content", reply))

    model.__qualname__ = f"langchain:{type(llm).__name__}"
    return model


def _side_effect_of(lc_tool: Any, side_effects: Union[str, Mapping[str, str], None]) -> str:
    if isinstance(side_effects, str):
        return side_effects
    if side_effects is not None and lc_tool.name in side_effects:
        return side_effects[lc_tool.name]
    metadata = getattr(lc_tool, "metadata", None) or {}
    return str(metadata.get("side_effect", "effectful"))


def tools(
    lc_tools: Iterable[Any], side_effects: Union[str, Mapping[str, str], None] = None
) -> Dict[str, Tool]:
    """LangChain tools (``@tool`` functions, ``BaseTool`` instances) as skillstate tools.

    The name, description and argument schema come from the LangChain tool. Each tool's
    side-effect class comes from ``side_effects`` (one class for all, or ``{name: class}``),
    else from ``tool.metadata["side_effect"]``, else ``"effectful"`` — the safe default: a
    call in flight when the process died is never re-run blindly.
    """
    from langchain_core.utils.function_calling import convert_to_openai_tool

    declared: Dict[str, Tool] = {}
    for lc_tool in lc_tools:
        parameters = convert_to_openai_tool(lc_tool)["function"].get("parameters") or {"type": "object"}
        parameters = dict(parameters)
        parameters.setdefault("type", "object")

        def call(_lc_tool: Any = lc_tool, **kwargs: Any) -> Any:
            result = _lc_tool.invoke(kwargs)
            content = getattr(result, "content", result)
            if isinstance(content, (str, dict, list, int, float, bool)) or content is None:
                return content
            return json.dumps(content, default=str)

        declared[lc_tool.name] = _declare(
            call,
            name=lc_tool.name,
            description=lc_tool.description or "",
            parameters=parameters,
            side_effect=_side_effect_of(lc_tool, side_effects),
        )
    return declared


def run(
    runtime: Runtime,
    skill: Skill,
    llm: Any,
    lc_tools: Sequence[Any] = (),
    side_effects: Union[str, Mapping[str, str], None] = None,
    **kwargs: Any,
) -> Task:
    """Runs ``skill`` with a LangChain chat model and LangChain tools (``Runtime.run``'s other
    arguments pass through: ``input``, ``max_steps``, ``context``, ...)."""
    return runtime.run(skill, chat_model(llm), tools=tools(lc_tools, side_effects), **kwargs)


def node(
    runtime: Runtime,
    skill: Skill,
    model: Any,
    tools: Union[Mapping[str, Tool], Sequence[Tool], None] = None,
    *,
    input_key: str = INPUT_KEY,
) -> Callable[[Mapping[str, Any]], Dict[str, Any]]:
    """A LangGraph node advancing one skillstate task by exactly one accepted step per call.

    ``model`` is a LangChain chat model, a skillstate model callable or a spec string. The
    first visit starts a task with the graph state's ``input_key`` as its request (skills with
    a built-in environment need none); later visits resume the task named by
    ``skillstate_task``. The node returns ``{skillstate_task: id, skillstate_state: the
    validated state, skillstate_status: running | completed | failed | awaiting_input |
    awaiting_approval}``; loop on it with :func:`route`. Every step is committed to the
    runtime's database, so the graph can be stopped and rebuilt at any point.
    """
    if not isinstance(model, str) and hasattr(model, "invoke"):
        model = chat_model(model)

    def advance(state: Mapping[str, Any]) -> Dict[str, Any]:
        task_id = state.get(TASK_KEY)
        if task_id:
            task = runtime.resume(task_id, model, tools=tools, max_steps=1)
        else:
            request = None if skill.environment else state.get(input_key)
            task = runtime.run(skill, model, tools=tools, input=request, max_steps=1)
        return {TASK_KEY: task.id, STATE_KEY: task.state, STATUS_KEY: task.status}

    return advance


def route(state: Mapping[str, Any], *, next: str = "continue", end: Any = None) -> Any:
    """For ``add_conditional_edges``: ``next`` while the task is running, else ``end``
    (``langgraph.graph.END`` when not given)."""
    if state.get(STATUS_KEY) == "running":
        return next
    if end is None:
        from langgraph.graph import END

        return END
    return end
