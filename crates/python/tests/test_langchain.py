"""The LangChain adapter with langchain-core's fake chat model and real `@tool`s, and the
LangGraph node inside a real StateGraph."""

import json
from typing import Optional, TypedDict

import pytest
import skillstate
import skillstate.langchain as sl

from conftest import ORDERS, answer

langchain_core = pytest.importorskip("langchain_core")
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

SCRIPT = [
    answer({}, "lookup", {"order": "o-1"}),
    answer({"status": "ready"}, "ship", {"order": "o-1"}),
    answer({"status": "shipped", "shipped": ["o-1"]}, "finish", {"result": "shipped"}),
]


def lc_tools(log):
    @tool
    def lookup(order: str) -> str:
        """Tells whether an order is ready to ship."""
        log.append(("lookup", order))
        return f"{order} is ready"

    @tool
    def ship(order: str) -> str:
        """Ships an order to the customer."""
        log.append(("ship", order))
        return f"shipped {order}"

    return [lookup, ship]


SEEN = []


class Recording(GenericFakeChatModel):
    """The fake chat model, keeping the messages of every call."""

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        SEEN.append(messages)
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def test_langchain_tools_keep_their_schema_and_get_a_side_effect_class():
    tools = sl.tools(lc_tools([]), side_effects={"lookup": "read_only"})
    assert set(tools) == {"lookup", "ship"}
    assert tools["lookup"].side_effect == "read_only"
    assert tools["ship"].side_effect == "effectful"
    assert tools["ship"].parameters["properties"]["order"]["type"] == "string"
    assert tools["ship"].parameters["required"] == ["order"]
    assert tools["ship"].description == "Ships an order to the customer."


def test_a_skill_runs_with_a_langchain_chat_model_and_tools(tmp_path):
    log = []
    llm = Recording(messages=iter(AIMessage(content=text) for text in SCRIPT))
    SEEN.clear()
    rt = skillstate.Runtime(str(tmp_path / "lc.db"))
    skill = skillstate.Skill.load(str(ORDERS))
    task = sl.run(rt, skill, llm, lc_tools(log), side_effects={"lookup": "read_only"}, input="Ship order o-1.")
    assert task.status == "completed", task.outcome
    assert task.state == {"order": "o-1", "status": "shipped", "shipped": ["o-1"]}
    assert log == [("lookup", "o-1"), ("ship", "o-1")]
    system, human = SEEN[0]
    assert system.type == "system" and human.type == "human"
    assert system.content + human.content == task.prompt_at(1)
    assert [s["side_effect"] for s in task.steps()[:2]] == ["read_only", "effectful"]


def test_an_invalid_answer_from_the_chat_model_is_rejected_and_retried(tmp_path):
    script = [json.dumps({"reasoning": "r", "state_patch": {"order": "o-2"}, "action": {"tool": "lookup", "args": {"order": "o-1"}}})] + SCRIPT
    llm = GenericFakeChatModel(messages=iter(AIMessage(content=text) for text in script))
    rt = skillstate.Runtime(str(tmp_path / "lc.db"))
    task = sl.run(rt, skillstate.Skill.load(str(ORDERS)), llm, lc_tools([]), input="Ship order o-1.")
    assert task.status == "completed"
    first = task.steps()[0]
    assert first["verdict"] == "rejected" and first["errors"][0][:2] == ("read_only", "/order")


class GraphState(TypedDict, total=False):
    input: str
    skillstate_task: Optional[str]
    skillstate_state: dict
    skillstate_status: str
    visits: int


def test_the_langgraph_node_advances_one_step_per_visit(tmp_path):
    from langgraph.graph import END, START, StateGraph

    log = []
    llm = GenericFakeChatModel(messages=iter(AIMessage(content=text) for text in SCRIPT))
    rt = skillstate.Runtime(str(tmp_path / "graph.db"))
    skill = skillstate.Skill.load(str(ORDERS))
    advance = sl.node(rt, skill, llm, tools=sl.tools(lc_tools(log), side_effects={"lookup": "read_only"}))
    versions = []

    def agent(state: GraphState) -> dict:
        update = advance(state)
        versions.append(rt.task(update[sl.TASK_KEY]).version)
        return {**update, "visits": state.get("visits", 0) + 1}

    graph = StateGraph(GraphState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", sl.route, {"continue": "agent", END: END})
    final = graph.compile().invoke({"input": "Ship order o-1.", "visits": 0})

    assert final["skillstate_status"] == "completed"
    assert final["visits"] == 3 and versions == [1, 2, 3]
    assert final["skillstate_state"] == {"order": "o-1", "status": "shipped", "shipped": ["o-1"]}
    assert rt.task(final["skillstate_task"]).state == final["skillstate_state"]
    assert log == [("lookup", "o-1"), ("ship", "o-1")]
