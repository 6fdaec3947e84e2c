"""The LangGraph SummarizationNode against langmem's (issue 13): how far over `max_tokens` each
node's output goes, counted exactly (tiktoken, gpt-4o), when both run on the same growing
conversation with the same fake chat model. langmem's default counter estimates
`len(text) / 4 + 3` per message; identifiers, hashes and numbers take more tokens than that.
Prints one markdown table.

    .venv/bin/python bench/bench_langgraph_node.py [--turns 40]

For each prefix of the conversation (2 … 2 × turns messages) both nodes are invoked from
scratch; the table shows the largest exact output and how many prefixes exceeded `max_tokens`.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langmem.short_term import SummarizationNode as LangmemNode

from compaction_app.integrations.langgraph import SummarizationNode, exact_token_counter


def conversation(turns: int) -> list:
    messages: list = []
    for i in range(turns):
        digest = hashlib.sha256(str(i).encode()).hexdigest()[:24]
        messages.append(
            HumanMessage(
                id=f"h{i}", content=f"Turn {i}: fix src/app_{i}.py, build {digest}, error E{i * 7}."
            )
        )
        messages.append(
            AIMessage(
                id=f"a{i}",
                content=f"Edited src/app_{i}.py at 0x{i * 99991:08x}; {i * 13}/{i * 17 + 1} tests pass.",
            )
        )
    return messages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    count = exact_token_counter("gpt-4o")
    messages = conversation(args.turns)
    model = FakeListChatModel(responses=["A short summary of the conversation."] * 10_000)
    print(
        "| max_tokens | max_summary_tokens | node | worst output (exact tokens) | over by | prefixes over |"
    )
    print("|---:|---:|---|---:|---:|---:|")
    for max_tokens, summary_tokens in ((300, 64), (600, 128), (1200, 256)):
        for label, factory in (
            ("langmem 0.0.30", LangmemNode),
            ("context ledger", SummarizationNode),
        ):
            worst = over = 0
            for n in range(2, len(messages) + 1):
                node = factory(
                    model=model, max_tokens=max_tokens, max_summary_tokens=summary_tokens
                )
                tokens = count(node.invoke({"messages": messages[:n]})["summarized_messages"])
                worst = max(worst, tokens)
                over += tokens > max_tokens
            print(
                f"| {max_tokens} | {summary_tokens} | {label} | {worst} | "
                f"{max(0, worst - max_tokens)} ({100 * max(0, worst - max_tokens) / max_tokens:.0f} %) | {over} |"
            )


if __name__ == "__main__":
    main()
