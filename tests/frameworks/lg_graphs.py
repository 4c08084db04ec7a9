"""LangGraph graphs for the framework tests, in process and behind `synapse serve --handler
lg_graphs:publisher`; the chat graph runs LangChain's offline fake chat model.

Every node run appends a line to the file named by `FRAMEWORK_TEST_LOG`, when it is set.
"""

from __future__ import annotations

import os
from typing import Any

from fwkit import Forever
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict


def log(line: str) -> None:
    path = os.environ.get("FRAMEWORK_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


# --- publisher: asks the requester for a value, then a person to approve -------------------


class Post(TypedDict, total=False):
    topic: str
    city: str
    text: str
    published: bool


def ask_city(state: Post) -> dict[str, Any]:
    log("node: ask_city")
    city = interrupt({"field": "city", "question": "which city is it about?", "suggested": "Paris"})
    return {"city": city}


def draft(state: Post) -> dict[str, Any]:
    log("node: draft")
    proposed = {"text": f"{state['topic']} in {state['city']}"}
    approved = interrupt({"approve": proposed, "question": "publish this post?"})
    return {"text": approved["text"]}


def publish(state: Post) -> dict[str, Any]:
    log(f"node: publish {state['text']}")
    return {"published": True}


_builder = StateGraph(Post)
_builder.add_node(ask_city)
_builder.add_node(draft)
_builder.add_node(publish)
_builder.add_edge(START, "ask_city")
_builder.add_edge("ask_city", "draft")
_builder.add_edge("draft", "publish")
_builder.add_edge("publish", END)
publisher = _builder.compile(name="publisher")


# --- required input ---------------------------------------------------------------------------


class Order(TypedDict):
    item: str
    quantity: int


def take(state: Order) -> dict[str, Any]:
    return {"item": state["item"].upper()}


_orders = StateGraph(Order)
_orders.add_node(take)
_orders.add_edge(START, "take")
_orders.add_edge("take", END)
orders = _orders.compile(name="orders")


# --- chat: a fake chat model answers -------------------------------------------------------

_model = GenericFakeChatModel(messages=iter([AIMessage(content="Bonjour !")]))


def respond(state: MessagesState) -> dict[str, Any]:
    return {"messages": [_model.invoke(state["messages"])]}


_chat = StateGraph(MessagesState)
_chat.add_node(respond)
_chat.add_edge(START, "respond")
_chat.add_edge("respond", END)
chat = _chat.compile(name="chat")


# --- slow and broken ------------------------------------------------------------------------

SLOW = Forever()


class Empty(TypedDict, total=False):
    done: bool


async def wait(state: Empty) -> dict[str, Any]:
    await SLOW.run()
    return {"done": True}


_slow = StateGraph(Empty)
_slow.add_node(wait)
_slow.add_edge(START, "wait")
_slow.add_edge("wait", END)
slow = _slow.compile(name="slow")


def fail(state: Empty) -> dict[str, Any]:
    raise KeyError("the archive is empty")


_broken = StateGraph(Empty)
_broken.add_node(fail)
_broken.add_edge(START, "fail")
_broken.add_edge("fail", END)
broken = _broken.compile(name="broken")
