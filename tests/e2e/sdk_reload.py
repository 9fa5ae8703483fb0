"""Drives context-proxy's reload tools with real client libraries.

Usage: sdk_reload.py BASE_URL. The Rust test (tests/sdk_reload.rs) queues the mock upstream's
replies; see there for the order. Checks that neither library ever sees the proxy's own tools,
and prints one JSON object with what they saw; exits non-zero on any assertion failure.
"""

import asyncio
import json
import sys

from openai import AsyncOpenAI, OpenAI


def lines(prefix: str, n: int) -> str:
    return "".join(f"{prefix} line {i}: let value_{i} = compute({i}) * 2;\n" for i in range(1, n + 1))


READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def assert_invisible(text: str) -> None:
    for name in ("context_read", "context_search"):
        assert name not in text, f"the client saw {name}: {text[:2000]}"


def chat_stream(base: str) -> dict:
    """client.chat.completions.stream() over a compacted conversation: the model reads back
    through the proxy and calls the client's tool in the same answer."""
    client = OpenAI(base_url=base, api_key="sk-e2e", max_retries=0)
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read both files."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"b.rs\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": lines("a.rs", 600)},
        {"role": "tool", "tool_call_id": "call_b", "content": lines("b.rs", 400)},
        {"role": "assistant", "content": "Both files define compute-based values."},
        {"role": "user", "content": "Check line 7 of a.rs, then read c.rs."},
    ]
    seen = []
    with client.chat.completions.stream(model="gpt-4o", messages=messages, tools=[READ_FILE]) as s:
        for event in s:
            seen.append(event.model_dump_json())
        final = s.get_final_completion()
    assert_invisible("\n".join(seen))
    assert_invisible(final.model_dump_json())
    calls = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls", final
    assert len(calls) == 1, calls
    return {
        "stream_calls": [[c.function.name, json.loads(c.function.arguments)] for c in calls],
        "stream_call_id": calls[0].id,
    }


async def agents_run(base: str) -> dict:
    """An OpenAI Agents SDK run in which the model reads back through the proxy, then calls a
    client tool, then answers."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def read_file(path: str) -> str:
        """Read a file."""
        calls.append(["read_file", path])
        return lines(path, 600 if path == "a.rs" else 400)

    @function_tool
    def run_tests() -> str:
        """Run the tests."""
        calls.append(["run_tests"])
        return "12 passed"

    client = AsyncOpenAI(base_url=base, api_key="sk-e2e", max_retries=0)
    agent = Agent(
        name="coder",
        instructions="You are a coding agent.",
        model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client),
        tools=[read_file, run_tests],
    )
    result = await Runner.run(agent, "Read a.rs and b.rs, check line 7 of a.rs, then run the tests.")
    items = json.dumps([str(i) for i in result.new_items])
    assert_invisible(items)
    return {"agent_output": result.final_output, "agent_calls": calls}


def main() -> None:
    base = sys.argv[1]
    out = chat_stream(base)
    out.update(asyncio.run(agents_run(base)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
