"""What the guide's Python examples assume and the page does not show: the pages' hidden
`<!-- doc-example python-setup: ... -->` comments call these (as `fixtures.…`). No paid model:
the models here answer from the prompt, as the test suite's do."""

import json
import pathlib
import shutil

from conftest import ORDERS, answer, orders_policy


def warehouse_answer():
    """A warehouse answer the runtime accepts on the initial state: one item stored."""
    return json.dumps(
        {
            "reasoning": "item_17 arrived; shelf_9 is free.",
            "state_patch": {"inventory": {"shelf_9": "item_17"}},
            "action": {"tool": "store", "args": {"item": "item_17", "shelf": "shelf_9"}},
        }
    )


def call_my_llm(messages, schema=None):
    """A stand-in for the reader's own model client, for the orders skill with `ship` alone:
    ships o-1, then finishes once the observation says it shipped. `schema` is the constrained-output schema a real
    client would pass on; it must be the one the runtime derives."""
    assert schema is None or schema.get("type") == "object", schema

    body = messages[-1]["content"]
    if "shipped o-1" in body:
        return answer({"status": "shipped", "shipped": ["o-1"]}, "finish", {"result": "shipped o-1"})
    return answer({"status": "ready"}, "ship", {"order": "o-1"})


def orders_skill():
    """The orders skill of the test suite (ship one order), loaded."""
    import skillstate

    return skillstate.Skill.load(str(ORDERS))


def orders_version(parent, version):
    """A copy of the orders skill at `parent/orders` with skill.toml's `version` set (same state
    shape, so no migration)."""
    root = pathlib.Path(parent) / "orders"
    shutil.copytree(ORDERS, root)
    toml = root / "skill.toml"
    toml.write_text(f'version = "{version}"\n\n' + toml.read_text())
    return root


def langchain_world():
    """LangChain tools `lookup` and `ship`, the graph state `MyState`, and `ChatOpenAI`: a chat
    model class that answers as the orders skill's model does, instead of calling OpenAI."""
    from typing import Optional, TypedDict

    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    @tool
    def lookup(order: str) -> str:
        """Tells whether an order is ready to ship."""
        return f"{order} is ready"

    @tool
    def ship(order: str) -> str:
        """Ships an order to the customer."""
        return f"shipped {order}"

    class MyState(TypedDict, total=False):
        input: str
        skillstate_task: Optional[str]
        skillstate_state: Optional[dict]
        skillstate_status: Optional[str]

    class ChatOpenAI(BaseChatModel):
        model: str = "gpt-4.1-mini"

        @property
        def _llm_type(self):
            return "doc-example-stand-in"

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            class Prompt:
                body = messages[-1].content

            text = orders_policy(Prompt)
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    return lookup, ship, MyState, ChatOpenAI


__all__ = ["answer", "call_my_llm", "langchain_world", "orders_skill", "orders_version", "warehouse_answer"]
